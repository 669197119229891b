#!/usr/bin/env bash
# The Java modules of clients/java on throwaway servers with pg_co / mysql_co and a second
# pair without them (-Dcotx.bare.pg.port / -Dcotx.bare.my.port: client mode, and the example's
# refusal at start): the daemon's client (client/: against the real daemon, which its tests
# start), the Spring Boot starter (spring-boot-starter/), and the Narayana (JTA) example
# (example/, docs/transaction-managers.md). Offline: bootstrap-tm.sh fetched the jars.
#   JAVA_TEST_ARGS="-Dpgjdbc.version=42.7.4" bash scripts/test-java.sh   # another driver (must be in the cache)
#   JAVA_TEST_ARGS="-pl client -Dtest=OverdraftTest -Dsurefire.failIfNoSpecifiedTests=false" bash scripts/test-java.sh   # one module, one class
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/tm-env.sh"
require_root
command -v mvn >/dev/null && command -v java >/dev/null || die "maven/java missing: run scripts/bootstrap.sh"
work=$(mktemp -d /tmp/cotx-java-XXXXXX)
chmod 755 "$work"
trap 'stop_tm_servers; rm -rf "$work"' EXIT
start_tm_servers "$work" --bare
cd "$COTX_ROOT/clients/java"
# shellcheck disable=SC2086
nice -n 5 mvn -o -B -ntp -Dmaven.repo.local="$COTX_M2" -Dcotx.pg.port="$PG_PORT" -Dcotx.my.port="$MY_PORT" \
  -Dcotx.bare.pg.port="$BARE_PG_PORT" -Dcotx.bare.my.port="$BARE_MY_PORT" -Dcotx.python="$COTX_VENV/bin/python" \
  ${JAVA_TEST_ARGS:-} test
