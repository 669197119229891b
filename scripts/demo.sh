#!/usr/bin/env bash
# The demo (docs/tutorial.md): demo/overdraft.py with the venv's python, its arguments
# passed on (e.g. --mode client, --rounds 100).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
exec "$COTX_VENV/bin/python" "$COTX_ROOT/demo/overdraft.py" "$@"
