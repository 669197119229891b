#!/usr/bin/env bash
# Compiles clients/java/example (Narayana's load driver io.cotx.tm.Load among its classes)
# offline from the Maven cache bootstrap-tm.sh filled, and writes the runtime classpath to
# clients/java/example/target/jta-load.classpath, which bench/harness/jta.py reads for the
# benchmark modes 2pc:jta and co:jta (bench/run_all.py --experiments narayana).
# The classpath is taken from the compiler's own command line (mvn -X): the cache has no
# maven-dependency-plugin and nothing may be downloaded. Seconds; writes only clients/java/example/target.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/tm-env.sh"
command -v mvn >/dev/null && command -v java >/dev/null || die "maven/java missing: run scripts/bootstrap.sh"
cd "$COTX_ROOT/clients/java/example"
out="$COTX_ROOT/clients/java/example/target"
mkdir -p "$out"
# A full recompile: the compiler prints its command line (and so the classpath) only then.
rm -rf "$out/classes"
nice -n 10 mvn -o -B -X -Dmaven.repo.local="$COTX_M2" compile >"$out/jta-load-build.log" 2>&1 \
  || { tail -40 "$out/jta-load-build.log" >&2; die "mvn compile failed ($out/jta-load-build.log)"; }
cp=$(sed -n 's/^\[DEBUG\] -d [^ ]* -classpath \([^ ]*\) .*/\1/p' "$out/jta-load-build.log" | head -1)
[ -n "$cp" ] && [ -f "$out/classes/io/cotx/tm/Load.class" ] \
  || die "no classpath in the compiler's command line ($out/jta-load-build.log)"
printf '%s\n' "$cp" >"$out/jta-load.classpath"
log "built $out/classes; classpath in $out/jta-load.classpath"
