#!/usr/bin/env bash
# pg_co's PostgreSQL-side suites: unit tests of the rules, pg_regress of the SQL surface
# and isolation specs of every rule, each on a temp instance with pg_co preloaded.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
PGXS_DIR=$("$PG_CONFIG" --pkglibdir)/pgxs/src/test
work=$(mktemp -d /tmp/cotx-pgregress.XXXXXX)
chown "$COTX_USER" "$work"
trap 'rm -rf "$work"' EXIT
cp -r "$COTX_ROOT/regress/pg/." "$work/"
chown -R "$COTX_USER" "$work"

log "pg_co_rules unit tests"
(cd "$COTX_ROOT" && CARGO_TARGET_DIR="$COTX_TARGET_PG" cargo test -q -p pg_co_rules)

rc=0
cd "$work"
sql_tests=$(cd sql && ls *.sql | sed 's/\.sql$//')
log "pg_regress: $sql_tests"
as_user "$PGXS_DIR/regress/pg_regress" --temp-instance="$work/tmp_regress" --temp-config="$work/co.conf" \
  --bindir="$PG_BIN" --inputdir=. --outputdir="$work/out_regress" --load-extension=pg_co $sql_tests || rc=1
specs=$(cd specs && ls *.spec | sed 's/\.spec$//')
log "isolation: $specs"
as_user "$PGXS_DIR/isolation/pg_isolation_regress" --temp-instance="$work/tmp_iso" --temp-config="$work/co.conf" \
  --bindir="$PG_BIN" --inputdir=. --outputdir="$work/out_iso" --load-extension=pg_co $specs || rc=1
if [ $rc != 0 ]; then
  for d in out_regress out_iso; do [ -f "$work/$d/regression.diffs" ] && cat "$work/$d/regression.diffs"; done
  mkdir -p "$COTX_CACHE/last-pg-results" && cp -r "$work"/out_* "$COTX_CACHE/last-pg-results/" 2>/dev/null || true
fi
exit $rc
