#!/usr/bin/env bash
# pg_co's PostgreSQL-side suites: unit tests of the rules, then on every major of
# $COTX_PG_MAJORS (default 15 16 17 18) pg_regress of the SQL surface and the isolation specs of
# every rule (pg_co_ext/test/), each on a temp instance with pg_co preloaded.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
work=$(mktemp -d /tmp/cotx-pgregress.XXXXXX)
trap 'rm -rf "$work"' EXIT

log "pg_co_rules unit tests"
(cd "$COTX_ROOT" && CARGO_TARGET_DIR="$COTX_TARGET_PG" cargo test -q -p pg_co_rules)

rc=0
for major in $COTX_PG_MAJORS; do
  reason=$(pg_unavailable "$major")
  if [ -n "$reason" ]; then log "PostgreSQL $major: SKIPPED ($reason)"; continue; fi
  pg_config=$(pg_config_of "$major")
  [ -x "$pg_config" ] || die "no PostgreSQL $major at $pg_config: run scripts/bootstrap.sh"
  bindir=$("$pg_config" --bindir)
  pgxs=$("$pg_config" --pkglibdir)/pgxs/src/test
  [ -f "$("$pg_config" --pkglibdir)/pg_co.so" ] || die "pg_co is not installed into PostgreSQL $major: run scripts/build-pg-co.sh"
  d="$work/pg$major"
  mkdir -p "$d" && cp -r "$COTX_ROOT/pg_co_ext/test/." "$d/" && chown -R "$COTX_USER" "$work"
  t0=$SECONDS
  cd "$d"
  sql_tests=$(cd sql && ls *.sql | sed 's/\.sql$//')
  specs=$(cd specs && ls *.spec | sed 's/\.spec$//')
  log "PostgreSQL $major ($("$pg_config" --version)): pg_regress $(echo $sql_tests); isolation $(echo $specs)"
  r=0
  as_user "$pgxs/regress/pg_regress" --temp-instance="$d/tmp_regress" --temp-config="$d/co.conf" \
    --bindir="$bindir" --inputdir=. --outputdir="$d/out_regress" --load-extension=pg_co $sql_tests || r=1
  as_user "$pgxs/isolation/pg_isolation_regress" --temp-instance="$d/tmp_iso" --temp-config="$d/co.conf" \
    --bindir="$bindir" --inputdir=. --outputdir="$d/out_iso" --load-extension=pg_co $specs || r=1
  if [ $r != 0 ]; then
    rc=1
    for o in out_regress out_iso; do [ -f "$d/$o/regression.diffs" ] && cat "$d/$o/regression.diffs"; done
    mkdir -p "$COTX_CACHE/last-pg-results/pg$major" && cp -r "$d"/out_* "$COTX_CACHE/last-pg-results/pg$major/" 2>/dev/null || true
  fi
  log "PostgreSQL $major: pg_co suites $([ $r = 0 ] && echo passed || echo FAILED) in $((SECONDS - t0)) s"
done
exit $rc
