#!/usr/bin/env bash
# PostgreSQL's own isolation suite, from the source of each major of $COTX_PG_MAJORS (15:
# Debian's source package; 17, 18: the upstream tarball scripts/build-pg-servers.sh built
# from), incl. the prepared-transaction specs, run with pg_co loaded. Every spec must match
# upstream's expected output except those listed in ALLOWED_DIFF, whose outcomes are
# compared permutation by permutation: pg_co may refuse more, never let through more
# (docs/pg_co.md, "PostgreSQL's own isolation specs").
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ALLOWED_DIFF=(prepared-transactions)
work=$(mktemp -d /tmp/cotx-pgupstream.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The isolation test dir of the source that major's server was built from.
isolation_src() {
  local version; version=$("$1" --version | awk '{print $2}')
  for d in "$COTX_CACHE/postgresql-src/postgresql-$2-$version" "$COTX_CACHE/postgresql-src/postgresql-$version"; do
    [ -f "$d/src/test/isolation/isolation_schedule" ] && { echo "$d/src/test/isolation"; return; }
  done
  die "PostgreSQL $version source missing under $COTX_CACHE/postgresql-src: run scripts/bootstrap.sh"
}

rc=0
for major in $COTX_PG_MAJORS; do
  reason=$(pg_unavailable "$major")
  if [ -n "$reason" ]; then log "PostgreSQL $major: SKIPPED ($reason)"; continue; fi
  pg_config=$(pg_config_of "$major")
  [ -x "$pg_config" ] || die "no PostgreSQL $major at $pg_config: run scripts/bootstrap.sh"
  src=$(isolation_src "$pg_config" "$major")
  d="$work/pg$major"
  mkdir -p "$d"
  cp -r "$src/specs" "$src/expected" "$src/isolation_schedule" "$d/"
  cp "$COTX_ROOT/pg_co_ext/test/upstream/upstream.conf" "$d/"
  chown -R "$COTX_USER" "$work"
  t0=$SECONDS
  cd "$d"
  log "PostgreSQL $major ($("$pg_config" --version)): upstream isolation suite with pg_co loaded"
  set +e
  as_user "$("$pg_config" --pkglibdir)/pgxs/src/test/isolation/pg_isolation_regress" \
    --temp-instance="$d/tmp" --temp-config="$d/upstream.conf" --bindir="$("$pg_config" --bindir)" \
    --inputdir=. --outputdir="$d/out" --schedule=isolation_schedule \
    prepared-transactions prepared-transactions-cic > "$d/run.log" 2>&1
  set -e
  echo "upstream specs matching exactly: $(grep -cE '^ok |\.\.\. ok' "$d/run.log" || true)"
  failed=$(grep -E "\.\.\. FAILED|^not ok" "$d/run.log" | sed -E 's/^not ok [0-9]+ +[-+] +//; s/^(test|     ) +//' | awk '{print $1}' || true)
  r=0
  for t in $failed; do
    if [[ " ${ALLOWED_DIFF[*]} " == *" $t "* ]]; then
      echo "== $t differs from upstream (allowed); comparing outcomes"
      "$COTX_VENV/bin/python" "$COTX_ROOT/pg_co_ext/test/upstream/compare_outcomes.py" "expected/$t.out" "out/results/$t.out" || r=1
    else
      echo "== $t: unexpected difference from upstream"; r=1
      diff -u "expected/$t.out" "out/results/$t.out" | head -60 || true
    fi
  done
  grep -E "tests (passed|failed)|# All [0-9]+ tests passed|# [0-9]+ of [0-9]+ tests failed" "$d/run.log" || tail -5 "$d/run.log"
  [ $r = 0 ] || rc=1
  log "PostgreSQL $major: upstream isolation suite $([ $r = 0 ] && echo passed || echo FAILED) in $((SECONDS - t0)) s"
done
exit $rc
