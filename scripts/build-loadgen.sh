#!/usr/bin/env bash
# Builds the benchmarks' load driver (bench/loadgen, its own cargo workspace) into its own
# target dir and installs $COTX_CACHE/bin/cotx-loadgen (bench/harness/loadgen.py finds it
# there). Quick when nothing changed: cargo checks its fingerprints, the copy happens only
# on a new binary. COTX_LOADGEN_TARGET overrides the target dir.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
target="${COTX_LOADGEN_TARGET:-$COTX_CACHE/target-loadgen}"
cd "$COTX_ROOT/bench/loadgen"
CARGO_TARGET_DIR="$target" nice -n 10 cargo build --release --locked -j "${COTX_BUILD_JOBS:-2}"
src="$target/release/cotx-loadgen"
dst="${COTX_LOADGEN_BIN:-$COTX_CACHE/bin/cotx-loadgen}"
mkdir -p "$(dirname "$dst")"
if ! cmp -s "$src" "$dst"; then
  # Copy then rename: a running driver keeps its old inode.
  cp "$src" "$dst.tmp" && mv -f "$dst.tmp" "$dst"
  log "installed $dst"
fi
