#!/usr/bin/env bash
# Builds the container images of the installable parts from the Debian packages of
# scripts/package.sh, with Debian's podman (no registry, no Docker engine; the local
# bookworm base image of scripts/lib.sh, podman_base_image):
#   cotx-coordinator:<v>                the daemon alone (deploy/images/coordinator.Containerfile)
#   cotx-postgres-pg_co:15-<v>          Debian's PostgreSQL 15 + pg_co (postgres-pg_co.Containerfile)
#   cotx-mariadb-mysql_co:10.11-<v>     Debian's MariaDB 10.11 + mysql_co (mariadb-mysql_co.Containerfile)
# Idempotent: package.sh rewrites byte-identical .debs when nothing changed and podman's
# layer cache (under $COTX_CACHE/containers) then reuses every layer; a changed package
# rebuilds only its image's last layers, a changed pin the server layer.
#
#   bash scripts/images.sh            # packages, base image if missing, the three images
#   bash scripts/images.sh names      # print the three image names, one a line
#   bash scripts/images.sh save [FILE]   # build, then write the three into one archive
#                                     # (default dist/cotx-images.tar) for `podman load`
#                                     # on another machine: no registry is needed
#   COTX_IMAGES_NO_PACKAGE=1 bash scripts/images.sh   # use the .debs already in dist/
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DIST="${COTX_DIST:-$COTX_ROOT/dist}"
PG_CO_VERSION=$(release_version)
COORD_VERSION=$PG_CO_VERSION
MYSQL_CO_VERSION=$PG_CO_VERSION   # as in package.sh: released with the project
COORD_IMAGE="cotx-coordinator:$COORD_VERSION"
PG_IMAGE="cotx-postgres-pg_co:$PG_MAJOR-$PG_CO_VERSION"
MARIADB_IMAGE="cotx-mariadb-mysql_co:${MARIADB_UPSTREAM%.*}-$MYSQL_CO_VERSION"
what="${1:-all}"
case "$what" in all|names|save) ;; *) die "usage: $0 [names | save [FILE]]" ;; esac
ARCHIVE="${2:-$DIST/cotx-images.tar}"
if [ "$what" = names ]; then
  printf '%s\n' "$COORD_IMAGE" "$PG_IMAGE" "$MARIADB_IMAGE"
  exit 0
fi
require_root

coord_deb="cotx-coordinator_${COORD_VERSION}_amd64.deb"
pg_deb="postgresql-$PG_MAJOR-pg-co_${PG_CO_VERSION}_amd64.deb"
my_deb="mariadb-plugin-mysql-co_${MYSQL_CO_VERSION}_amd64.deb"

# --- the packages: always through package.sh (quick when built), so that an image never
# holds a .deb older than the checkout. Only the PostgreSQL major the image runs.
if [ "${COTX_IMAGES_NO_PACKAGE:-0}" != 1 ]; then
  COTX_PG_MAJORS=$PG_MAJOR COTX_DIST=$DIST timed "packages" bash "$COTX_ROOT/scripts/package.sh" >/dev/null
fi
for f in "$coord_deb" "$pg_deb" "$my_deb"; do
  [ -f "$DIST/$f" ] || die "no $DIST/$f: run scripts/package.sh"
done

podman_install
podman_base_image

# --- one small build context per image: its .deb and entrypoint, nothing else ----------
CTX=$(mktemp -d /tmp/cotx-images.XXXXXX)
trap 'rm -rf "$CTX"' EXIT
build() {  # image, Containerfile, files..., -- build args...
  local image=$1 file=$2; shift 2
  local dir="$CTX/${file%.Containerfile}"; mkdir -p "$dir"
  while [ "$1" != -- ]; do cp "$1" "$dir/"; shift; done; shift
  local args=() a
  for a in "$@"; do args+=(--build-arg "$a"); done
  local t0=$SECONDS
  # --network host: apt in the build reaches the mirror as the host does. --pull=never:
  # the base is local (nothing can be pulled here).
  "${PODMAN[@]}" build --network host --pull=never "${PODMAN_LIMITS[@]}" "${args[@]}" \
    -t "$image" -f "$COTX_ROOT/deploy/images/$file" "$dir" >"$CTX/build.log" 2>&1 \
    || { cat "$CTX/build.log" >&2; die "building $image failed"; }
  log "$image built in $((SECONDS - t0)) s ($(( $("${PODMAN[@]}" image inspect --format '{{.Size}}' "$image") / 1000000 )) MB)"
}
build "$COORD_IMAGE" coordinator.Containerfile "$DIST/$coord_deb" -- "COORD_VERSION=$COORD_VERSION"
build "$PG_IMAGE" postgres-pg_co.Containerfile "$DIST/$pg_deb" "$COTX_ROOT/deploy/images/postgres-entrypoint.sh" -- \
  "PG_MAJOR=$PG_MAJOR" "PG_VERSION=$PG_VERSION" "PG_CO_VERSION=$PG_CO_VERSION"
build "$MARIADB_IMAGE" mariadb-mysql_co.Containerfile "$DIST/$my_deb" "$COTX_ROOT/deploy/images/mariadb-entrypoint.sh" -- \
  "MARIADB_VERSION=$MARIADB_VERSION" "MYSQL_CO_VERSION=$MYSQL_CO_VERSION"
# Dangling images left by rebuilds (the tags moved to the new ones): their layers go.
# Only ours (the label): the storage also holds docker-demo.sh's build-stage cache,
# which is untagged too and takes 20 minutes to rebuild.
"${PODMAN[@]}" image prune -f --filter label=org.cotx.image >/dev/null
echo "images: $COORD_IMAGE $PG_IMAGE $MARIADB_IMAGE"
if [ "$what" = save ]; then
  # One docker-archive with the three (shared base layers stored once; about 870 MB: docs/testing.md).
  rm -f "$ARCHIVE"
  "${PODMAN[@]}" save -q -m -o "$ARCHIVE" "$COORD_IMAGE" "$PG_IMAGE" "$MARIADB_IMAGE"
  echo "archive: $ARCHIVE ($(( $(stat -c %s "$ARCHIVE") / 1000000 )) MB)"
fi
