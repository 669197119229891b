#!/usr/bin/env bash
# Toolchains and dependencies of the bring-your-own-TM clients (clients/java, clients/go),
# called by bootstrap.sh. Idempotent and quick when done: Java 17 + Maven and Go >= 1.19 are
# used if present, installed from Debian otherwise; the Maven repository and the Go module
# and build caches live under $COTX_CACHE, so scripts/test-java.sh and test-go.sh run offline.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/tm-env.sh"
require_root

java_major() { java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print v[1]; exit}'; }
apt_pkgs=()
if ! command -v java >/dev/null || [ "$(java_major)" -lt 17 ] 2>/dev/null; then apt_pkgs+=(openjdk-17-jdk-headless); fi
command -v mvn >/dev/null || apt_pkgs+=(maven)
GO_MIN=19   # go 1.19: clients/go/go.mod (Debian 12's golang-go)
go_minor() { go env GOVERSION 2>/dev/null | sed -n 's/^go1\.\([0-9]*\).*/\1/p'; }
if ! command -v go >/dev/null || [ "$(go_minor)" -lt $GO_MIN ] 2>/dev/null; then apt_pkgs+=(golang-go); fi
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  log "installing ${apt_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}" >/dev/null
  PATH="/usr/lib/go/bin:$PATH"
fi
[ "$(java_major)" -ge 17 ] || die "Java 17 or newer is needed (found $(java -version 2>&1 | head -1))"
[ "$(go_minor)" -ge $GO_MIN ] || die "Go 1.$GO_MIN or newer is needed (found $(go env GOVERSION))"

# Maven: resolve everything `mvn -o test` needs for every module of clients/java (plugins,
# surefire's JUnit providers, the drivers; the client's Jackson; the starter's Spring Boot
# 3.5.7, HikariCP, Micrometer, Actuator: all pinned in the poms) by compiling everything and
# running the server-less tests once per version of the poms.
mkdir -p "$COTX_M2"
# The tests that need no server, at least one per module: a module's surefire provider is
# resolved only when it runs a test.
offline_tests="RetryTest,RetryRulesTest,RefusalsTest,TraceparentTest,StandInDaemonTest,CotxPropertiesTest"
poms=(pom.xml client/pom.xml spring-boot-starter/pom.xml example/pom.xml)
stamp="$COTX_M2/.cotx-pom-$(cd "$COTX_ROOT/clients/java" && cat "${poms[@]}" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  log "fetching the Java modules' dependencies into $COTX_M2"
  (cd "$COTX_ROOT/clients/java" && nice -n 10 mvn -B -q -Dmaven.repo.local="$COTX_M2" \
      -Dtest="$offline_tests" -Dsurefire.failIfNoSpecifiedTests=false test >/dev/null) \
    || die "maven could not resolve clients/java's dependencies (Maven Central reachable?)"
  touch "$stamp"
fi

# Go: the module cache and a warm build cache (unit tests only, no servers).
mkdir -p "$GOPATH"
stamp="$GOPATH/.cotx-gosum-$(sha256sum "$COTX_ROOT/clients/go/go.sum" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  log "fetching the Go client's modules into $GOMODCACHE"
  # Named whole: a pattern such as 'Propagation' also matched a later test that needs the
  # servers, and a fresh machine's bootstrap failed on it.
  (cd "$COTX_ROOT/clients/go" && go mod download \
      && nice -n 10 go test -count=1 -run '^(TestRetryableClassification|TestGTIDPropagation)$' . >/dev/null) \
    || die "go could not fetch or build clients/go's modules (module proxy reachable?)"
  touch "$stamp"
fi
