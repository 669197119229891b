#!/usr/bin/env bash
# Builds and installs every part: pg_co into PostgreSQL, mysql_co into MariaDB's plugin
# dir, the coordinator daemon, the benchmarks' load driver. Each part's script skips work when its inputs are unchanged.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root
for part in pg-co mysql-co coordinator loadgen; do
  script="$COTX_ROOT/scripts/build-$part.sh"
  [ -x "$script" ] || { log "skipping $part (no $script yet)"; continue; }
  timed "build $part" bash "$script"
done
