#!/usr/bin/env bash
# Builds the coordinator daemon (release) into its own target dir and installs the binary
# at $COTX_CACHE/bin/cotx-coordinator (tests and the demo find it there). Quick when
# nothing changed: cargo checks its fingerprints, the copy happens only on a new binary.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$COTX_ROOT"
# SQLite syncs its WAL with fdatasync instead of fsync (its Linux configure default; the
# bundled build lacks it): a commit does not wait for a journal commit of unrelated
# metadata on a busy disk. Build and test must use the same flags or each rebuilds SQLite.
export LIBSQLITE3_FLAGS="-DHAVE_FDATASYNC=1"
CARGO_TARGET_DIR="$COTX_TARGET_COORD" cargo build --release -p coordinator-daemon
src="$COTX_TARGET_COORD/release/cotx-coordinator"
dst="$COTX_CACHE/bin/cotx-coordinator"
mkdir -p "$COTX_CACHE/bin"
if ! cmp -s "$src" "$dst"; then
  # Copy then rename: a running daemon keeps its old inode.
  cp "$src" "$dst.tmp" && mv -f "$dst.tmp" "$dst"
  log "installed $dst"
fi
