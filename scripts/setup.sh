#!/usr/bin/env bash
# README's first command: install, build everything, run the demo.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root
timed bootstrap bash "$COTX_ROOT/scripts/bootstrap.sh"
timed build bash "$COTX_ROOT/scripts/build.sh"
exec bash "$COTX_ROOT/scripts/demo.sh" "$@"
