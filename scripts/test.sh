#!/usr/bin/env bash
# The whole test suite (README's second command; .ci/run runs exactly this).
# Installs and builds first (idempotent, quick when done), then runs every suite against
# real servers it starts itself, and ends with pytest's summary line.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
require_root
set -e
bash "$COTX_ROOT/scripts/bootstrap.sh"
bash "$COTX_ROOT/scripts/build.sh"
set +e
failed=()
run_suite() {  # name, command...
  local name=$1; shift
  log "=== suite: $name"
  local t0=$SECONDS
  if "$@"; then log "=== $name passed ($((SECONDS - t0)) s)"; else log "=== $name FAILED ($((SECONDS - t0)) s)"; failed+=("$name"); fi
}
# Component suites register themselves as scripts/test-<name>.sh (unit tests, pg_regress,
# isolation specs, mysql-test); pytest end-to-end suites run last.
for script in "$COTX_ROOT"/scripts/test-*.sh; do
  [ -e "$script" ] || continue
  name=$(basename "$script" .sh); name=${name#test-}
  run_suite "$name" bash "$script"
done
cd "$COTX_ROOT/regress/pytest"
# bootstrap.sh installed the browser: its absence here is a failure, not a skip.
export COTX_REQUIRE_BROWSER=1
# Per-test limit (pytest-timeout): a test that hangs fails with its stack, and the suites
# after it still run. The slowest test takes about 3 minutes.
run_suite pytest "$COTX_VENV/bin/python" -m pytest -q -p no:cacheprovider --timeout="${COTX_TEST_TIMEOUT:-900}" ${PYTEST_ARGS:-}
if [ ${#failed[@]} -gt 0 ]; then
  log "failed suites: ${failed[*]}"
  exit 1
fi
log "all suites passed"
