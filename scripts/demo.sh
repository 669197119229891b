#!/usr/bin/env bash
# The demo. Until the overdraft demo exists (docs/tutorial.md), start both servers with
# the extensions loaded and print how to connect; Ctrl-C stops them. DEMO_NONINTERACTIVE=1
# starts them, shows they answer, and stops.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ -f "$COTX_ROOT/demo/overdraft.py" ]; then
  exec "$COTX_VENV/bin/python" "$COTX_ROOT/demo/overdraft.py" "$@"
fi
if [ "${DEMO_NONINTERACTIVE:-0}" = 1 ] || [ ! -t 0 ]; then
  timeout -s INT 30 "$COTX_VENV/bin/python" -m cotest up & pid=$!
  sleep 8; kill -INT $pid 2>/dev/null || true; wait $pid || true
else
  exec "$COTX_VENV/bin/python" -m cotest up
fi
