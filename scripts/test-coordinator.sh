#!/usr/bin/env bash
# Unit tests of the coordinator daemon (state machine, naming, config, store incl. group
# commit and a torn final write). Release profile: reuses the dependencies build.sh built.
# The end-to-end tests with real servers are regress/pytest/test_coordinator_*.py.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$COTX_ROOT"
CARGO_TARGET_DIR="$COTX_TARGET_COORD" cargo test --release -p coordinator-daemon 2>&1
