#!/usr/bin/env bash
# Coordinator benchmarks (results: bench/RESULTS.md, "coordinator" section).
#  1. decisions/s of the store alone: SQLite with and without group commit, then the
#     PostgreSQL store (a throwaway instance) with 1 and 3 writers (p50/p99 per decision);
#  2. the daemon's own share per transaction (protocol.py, no databases);
#  3. the daemon's added latency per two-branch global transaction (p50/p99, ≥ 10k each).
# Needs scripts/build.sh first (the daemon binary) and root (servers run as user cotx).
set -euo pipefail
source "$(dirname "$0")/../../scripts/lib.sh"
BIN="${COTX_COORDINATOR_BIN:-$COTX_CACHE/bin/cotx-coordinator}"
N="${N:-10000}"
dir="$COTX_CACHE/bench-coordinator"; mkdir -p "$dir"
echo "## store alone (SQLite WAL, synchronous=FULL, on $(df --output=source "$dir" | tail -1))"
"$BIN" bench-store --path "$dir/store-gc.db" --n 50000 --clients 64
"$BIN" bench-store --path "$dir/store-nogc.db" --n 3000 --clients 64 --no-group-commit
"$BIN" bench-store --path "$dir/store-1client.db" --n 3000 --clients 1
echo "## store alone (PostgreSQL, its own instance, fsync on; 1 and 3 writers as 1 and 3 daemons)"
COTX_COORDINATOR_BIN="$BIN" "$COTX_VENV/bin/python" "$COTX_ROOT/bench/coordinator/pg_store.py" --n 20000 --clients 64 --writers 1,3
echo "## the daemon's own share (no databases), store on disk and on tmpfs"
"$COTX_VENV/bin/python" "$COTX_ROOT/bench/coordinator/protocol.py" --n 5000 --store-dir "$dir"
"$COTX_VENV/bin/python" "$COTX_ROOT/bench/coordinator/protocol.py" --n 5000 --store-dir /dev/shm/cotx-bench
echo "## added latency, store on disk"
"$COTX_VENV/bin/python" "$COTX_ROOT/bench/coordinator/latency.py" --n "$N" --store-dir "$dir"
echo "## added latency, store on tmpfs (/dev/shm: no fsync cost, protocol overhead only)"
"$COTX_VENV/bin/python" "$COTX_ROOT/bench/coordinator/latency.py" --n "$N" --store-dir /dev/shm/cotx-bench
rm -rf /dev/shm/cotx-bench
