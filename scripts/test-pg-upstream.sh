#!/usr/bin/env bash
# PostgreSQL's own isolation suite with pg_co loaded, on every major of $COTX_PG_MAJORS.
# - A major whose own source is here (15: Debian's source package; 18: the upstream tarball
#   scripts/build-pg-servers.sh built from) runs its own specs, incl. the prepared-transaction
#   specs. Every spec must match upstream's expected output except those listed in
#   ALLOWED_DIFF, whose outcomes are compared permutation by permutation: pg_co may refuse
#   more, never let through more (docs/pg_co.md, "PostgreSQL's own isolation specs").
# - A major installed without its source (16, 17: PyPI's builds) runs a DIFFERENTIAL: the
#   specs of 18's source on that server, once without pg_co and once with it; no
#   permutation may succeed with pg_co that failed without, and every permutation pg_co
#   refuses is listed (pg_co_ext/test/upstream/differential.py). Specs that need what the
#   older major lacks are skipped by name with the reason (SKIP_ON_OLDER below).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ALLOWED_DIFF=(prepared-transactions)
# "major:spec" -> why 18's spec cannot run on that older major. Found by running all of
# 18.6's specs on 16.15 and 17.11 without pg_co: these three use RETURNING old/new, new in
# 18; their steps fail with "column old does not exist" (or a missing FROM-clause entry),
# and in merge-update the failed session keeps its transaction open, so the spec's
# teardown waits forever (seen on 17.11). The other specs run; some end differently than
# on 18 (fk-partitioned-*, detach-partition-concurrently-2/4, index-only-bitmapscan; on
# 16 also stats, lock-nowait), identically with and without pg_co.
RETURNING_OLD_NEW="uses RETURNING old/new (PostgreSQL 18 syntax)"
declare -A SKIP_ON_OLDER=(
  [16:merge-update]=$RETURNING_OLD_NEW [16:merge-match-recheck]=$RETURNING_OLD_NEW [16:eval-plan-qual-trigger]=$RETURNING_OLD_NEW
  [17:merge-update]=$RETURNING_OLD_NEW [17:merge-match-recheck]=$RETURNING_OLD_NEW [17:eval-plan-qual-trigger]=$RETURNING_OLD_NEW
)
# A spec that hangs on an older major (as merge-update did) must not hang CI: each run of
# the differential gets this many seconds (one run takes about 35 s on 2 busy cores).
DIFF_RUN_TIMEOUT=${COTX_DIFF_RUN_TIMEOUT:-600}
work=$(mktemp -d /tmp/cotx-pgupstream.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The isolation test dir of the source that major's server was built from; empty if none.
isolation_src() {
  local version; version=$("$1" --version | awk '{print $2}')
  for d in "$COTX_CACHE/postgresql-src/postgresql-$2-$version" "$COTX_CACHE/postgresql-src/postgresql-$version"; do
    [ -f "$d/src/test/isolation/isolation_schedule" ] && { echo "$d/src/test/isolation"; return; }
  done
  return 0
}

# differential MAJOR PG_CONFIG SPEC_SRC_DIR SPEC_MAJOR
differential() {
  local major=$1 pg_config=$2 src=$3 spec_major=$4 d="$work/pg$1" t0=$SECONDS
  mkdir -p "$d"
  cp -r "$src/specs" "$src/expected" "$d/"
  cp "$COTX_ROOT/pg_co_ext/test/upstream/upstream.conf" "$d/with.conf"
  # The same settings without pg_co.
  grep -vE '^[[:space:]]*(shared_preload_libraries|pg_co\.)' "$d/with.conf" > "$d/without.conf"
  local specs=() skipped=0 t reason
  # The schedule, plus the prepared-transaction specs it leaves out (upstream runs them
  # only with max_prepared_transactions set: both confs set it).
  for t in $(sed -n 's/^test: *//p' "$src/isolation_schedule") prepared-transactions prepared-transactions-cic; do
    reason=${SKIP_ON_OLDER[$major:$t]:-}
    if [ -n "$reason" ]; then echo "  skipped $t on PostgreSQL $major: $reason"; skipped=$((skipped + 1)); continue; fi
    specs+=("$t")
  done
  chown -R "$COTX_USER" "$work"
  cd "$d"
  log "PostgreSQL $major ($("$pg_config" --version)): differential of PostgreSQL $spec_major's ${#specs[@]} isolation specs, without and with pg_co ($skipped skipped)"
  local run
  for run in without with; do
    # Outputs are compared with each other, not with 18's expected files: the exit status
    # of pg_isolation_regress says nothing here.
    local st=0
    timeout -k 10 "$DIFF_RUN_TIMEOUT" runuser -u "$COTX_USER" -- "$("$pg_config" --pkglibdir)/pgxs/src/test/isolation/pg_isolation_regress" \
      --temp-instance="$d/tmp_$run" --temp-config="$d/$run.conf" --bindir="$("$pg_config" --bindir)" \
      --inputdir=. --outputdir="$d/out_$run" "${specs[@]}" > "$d/$run.log" 2>&1 || st=$?
    if [ $st = 124 ] || [ $st = 137 ]; then
      tail -3 "$d/$run.log"
      echo "PostgreSQL $major: the run $run pg_co did not finish within $DIFF_RUN_TIMEOUT s (last spec above)"
      return 1
    fi
    log "PostgreSQL $major: run $run pg_co: $(grep -cE '^ok |\.\.\. ok' "$d/$run.log" || true) of ${#specs[@]} specs match $spec_major's expected output ($((SECONDS - t0)) s so far)"
  done
  # Both runs' outputs and the list of refused permutations stay for a look afterwards.
  local keep="$COTX_CACHE/last-pg-results/differential-pg$major"
  rm -rf "$keep"; mkdir -p "$keep"
  cp -r "$d/out_without/results" "$keep/without"; cp -r "$d/out_with/results" "$keep/with"
  "$COTX_VENV/bin/python" "$COTX_ROOT/pg_co_ext/test/upstream/differential.py" \
    --refused-list "$keep/refused.tsv" "$major" "$keep/without" "$keep/with" "${specs[@]}"
}

rc=0
for major in $COTX_PG_MAJORS; do
  reason=$(pg_unavailable "$major")
  if [ -n "$reason" ]; then log "PostgreSQL $major: SKIPPED ($reason)"; continue; fi
  pg_config=$(pg_config_of "$major")
  [ -x "$pg_config" ] || die "no PostgreSQL $major at $pg_config: run scripts/bootstrap.sh"
  src=$(isolation_src "$pg_config" "$major")
  if [ -z "$src" ] && [ -n "${PG_WHEEL[$major]:-}" ]; then
    # No source of this major here: 18's specs as a differential (see the top).
    spec_src=$(isolation_src "$(pg_config_of 18)" 18)
    [ -n "$spec_src" ] || die "PostgreSQL 18's source (its isolation specs) is missing under $COTX_CACHE/postgresql-src: run scripts/bootstrap.sh with 18 in COTX_PG_MAJORS"
    t0=$SECONDS
    r=0; differential "$major" "$pg_config" "$spec_src" 18 || r=1
    [ $r = 0 ] || rc=1
    log "PostgreSQL $major: differential $([ $r = 0 ] && echo passed || echo FAILED) in $((SECONDS - t0)) s"
    continue
  fi
  [ -n "$src" ] || die "PostgreSQL $("$pg_config" --version) source missing under $COTX_CACHE/postgresql-src: run scripts/bootstrap.sh"
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
