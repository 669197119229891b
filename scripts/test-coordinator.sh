#!/usr/bin/env bash
# Unit tests of the coordinator daemon (state machine, naming, config, store incl. group
# commit and a torn final write). Release profile: reuses the dependencies build.sh built.
# The end-to-end tests with real servers are regress/pytest/test_coordinator_*.py.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$COTX_ROOT"
# SQLite syncs its WAL with fdatasync instead of fsync (its Linux configure default; the
# bundled build lacks it): a commit does not wait for a journal commit of unrelated
# metadata on a busy disk. Build and test must use the same flags or each rebuilds SQLite.
export LIBSQLITE3_FLAGS="-DHAVE_FDATASYNC=1"
CARGO_TARGET_DIR="$COTX_TARGET_COORD" cargo test --release -p coordinator-daemon 2>&1
