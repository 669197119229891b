#!/usr/bin/env bash
# Builds pg_co with cargo-pgrx and installs it into every PostgreSQL major of
# $COTX_PG_MAJORS (default 15 17 18), each with its own pg_config and cargo target dir (the
# pgNN feature sets do not invalidate each other's cache). Skips a major whose installed
# build came from the same sources.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root
cd "$COTX_ROOT/pg_co_ext"
inputs=$(cd "$COTX_ROOT" && find pg_co_ext -type f \( -name '*.rs' -o -name '*.c' -o -name '*.h' -o -name '*.toml' -o -name '*.control' \) -print0 \
          | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
for major in $COTX_PG_MAJORS; do
  reason=$(pg_unavailable "$major")
  if [ -n "$reason" ]; then log "PostgreSQL $major: SKIPPED ($reason)"; continue; fi
  pg_config=$(readlink -f "$(pg_config_of "$major")")   # 15: Debian's, as in ~/.pgrx/config.toml
  [ -x "$pg_config" ] || die "no PostgreSQL $major at $pg_config: run scripts/bootstrap.sh (scripts/build-pg-servers.sh builds it)"
  stamp="$COTX_CACHE/pg_co.installed.pg$major"
  so="$("$pg_config" --pkglibdir)/pg_co.so"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs" ] && [ -f "$so" ]; then
    log "pg_co is up to date for PostgreSQL $major ($so)"
    continue
  fi
  log "building and installing pg_co for PostgreSQL $major (release, $pg_config)"
  buildlog="$COTX_CACHE/pg_co-build.pg$major.log"
  t0=$SECONDS
  # package, then install each file by rename: servers running the old pg_co.so keep their
  # mapping (an in-place overwrite can crash them).
  CARGO_TARGET_DIR="$COTX_TARGET_PG/pg$major" PGRX_PG_CONFIG_PATH="$pg_config" PG_CONFIG="$pg_config" \
    nice -n 10 cargo pgrx package --pg-config "$pg_config" --no-default-features --features "pg$major" >"$buildlog" 2>&1 \
    || { tail -40 "$buildlog"; die "pg_co build for PostgreSQL $major failed (full log: $buildlog)"; }
  pkg="$COTX_TARGET_PG/pg$major/release/pg_co-pg$major"
  (cd "$pkg" && find . -type f) | while read -r f; do
    dest="/${f#./}"
    install -m 644 "$pkg/$f" "$dest.cotx-new" && mv -f "$dest.cotx-new" "$dest"
  done
  echo "$inputs" > "$stamp"
  log "installed $so in $((SECONDS - t0)) s"
done
