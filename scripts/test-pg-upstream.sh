#!/usr/bin/env bash
# PostgreSQL's own isolation suite (from the pinned postgresql-15 source package, incl.
# the prepared-transaction specs) run with pg_co loaded. Every spec must match upstream's
# expected output except those listed in ALLOWED_DIFF, whose outcomes are compared
# permutation by permutation: pg_co may refuse more, never let through more
# (docs/pg_co.md, "PostgreSQL's own isolation specs").
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ALLOWED_DIFF=(prepared-transactions)
src="$COTX_CACHE/postgresql-src/postgresql-$PG_MAJOR-${PG_VERSION%%-*}/src/test/isolation"
[ -f "$src/isolation_schedule" ] || die "PostgreSQL source missing at $src: run scripts/bootstrap.sh"
work=$(mktemp -d /tmp/cotx-pgupstream.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$src/specs" "$src/expected" "$src/isolation_schedule" "$work/"
cp "$COTX_ROOT/regress/pg/upstream/upstream.conf" "$work/"
chown -R "$COTX_USER" "$work"
cd "$work"
set +e
as_user "$("$PG_CONFIG" --pkglibdir)/pgxs/src/test/isolation/pg_isolation_regress" \
  --temp-instance="$work/tmp" --temp-config="$work/upstream.conf" --bindir="$PG_BIN" \
  --inputdir=. --outputdir="$work/out" --schedule=isolation_schedule \
  prepared-transactions prepared-transactions-cic > "$work/run.log" 2>&1
set -e
grep -E "^(test|     ) " "$work/run.log" | grep -c " ok " | xargs -I{} echo "upstream specs matching exactly: {}"
failed=$(grep -E "\.\.\. FAILED" "$work/run.log" | awk '{print $2}' || true)
rc=0
for t in $failed; do
  if [[ " ${ALLOWED_DIFF[*]} " == *" $t "* ]]; then
    echo "== $t differs from upstream (allowed); comparing outcomes"
    "$COTX_VENV/bin/python" "$COTX_ROOT/regress/pg/upstream/compare_outcomes.py" "expected/$t.out" "out/results/$t.out" || rc=1
  else
    echo "== $t: unexpected difference from upstream"; rc=1
    diff -u "expected/$t.out" "out/results/$t.out" | head -60 || true
  fi
done
grep -E "tests (passed|failed)" "$work/run.log" || tail -5 "$work/run.log"
exit $rc
