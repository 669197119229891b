#!/usr/bin/env bash
# Builds pg_co with cargo-pgrx and installs it into the pinned PostgreSQL 15.
# Skips the install when the sources have not changed since the last one.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root
cd "$COTX_ROOT/pg_co_ext"
stamp="$COTX_CACHE/pg_co.installed"
inputs=$(cd "$COTX_ROOT" && find pg_co_ext -type f \( -name '*.rs' -o -name '*.c' -o -name '*.h' -o -name '*.toml' -o -name '*.control' \) -print0 \
          | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
so="$("$PG_CONFIG" --pkglibdir)/pg_co.so"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs" ] && [ -f "$so" ]; then
  log "pg_co is up to date ($so)"
  exit 0
fi
log "building and installing pg_co (release)"
CARGO_TARGET_DIR="$COTX_TARGET_PG" PG_CONFIG="$PG_CONFIG" \
  cargo pgrx install --release --pg-config "$PG_CONFIG" --features pg15 >"$COTX_CACHE/pg_co-build.log" 2>&1 \
  || { tail -40 "$COTX_CACHE/pg_co-build.log"; die "pg_co build failed (full log: $COTX_CACHE/pg_co-build.log)"; }
echo "$inputs" > "$stamp"
log "installed $so"
