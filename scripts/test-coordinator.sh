#!/usr/bin/env bash
# Unit tests of the coordinator daemon (state machine, naming, config, store incl. group
# commit and a torn final write), of its pure protocol rules (cotx-protocol), and the model
# checker over them (cotx-model: the real protocol explored to the end of its state space
# with 3 daemons and 3 faults — the one-request modes with 2 and 2, whose space grows fastest —,
# and every deliberately broken variant caught; states, depth
# and time printed). Release profile: reuses the dependencies build.sh built.
# The end-to-end tests with real servers are regress/pytest/coordinator/test_coordinator_*.py.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$COTX_ROOT"
# SQLite syncs its WAL with fdatasync instead of fsync (its Linux configure default; the
# bundled build lacks it): a commit does not wait for a journal commit of unrelated
# metadata on a busy disk. Build and test must use the same flags or each rebuilds SQLite.
export LIBSQLITE3_FLAGS="-DHAVE_FDATASYNC=1"
CARGO_TARGET_DIR="$COTX_TARGET_COORD" cargo test --release -p coordinator-daemon -p cotx-protocol -p cotx-model 2>&1
log "model check of the commit protocol (docs/guarantees.md, \"The commit protocol, model-checked\")"
CARGO_TARGET_DIR="$COTX_TARGET_COORD" cargo run -q --release -p cotx-model -- --daemons 3 --faults 3 --leased-daemons 2 --leased-faults 2 --depth 40 --variant-depth 30
