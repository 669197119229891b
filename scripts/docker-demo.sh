#!/usr/bin/env bash
# Release check of the Dockerfile, without a registry or a Docker engine: Debian's podman
# (with runc: crun refuses this kernel's hybrid cgroups) builds the image on a bookworm base
# made here with debootstrap, then runs the image's default command, the demo.
#
#   bash scripts/docker-demo.sh              # base image if missing, build, run the demo
#   bash scripts/docker-demo.sh base         # only make the base image (debian:12)
#   bash scripts/docker-demo.sh build        # base + build, no demo
#   COTX_IMAGE=cotx:test bash scripts/docker-demo.sh
#
# The first build took 36 minutes on 2 shared cores; an edit outside scripts/lib.sh,
# scripts/bootstrap*.sh, requirements.txt and rust-toolchain.toml reuses the cached
# bootstrap layer (about 12 minutes then). Not part of scripts/test.sh (too slow for CI's
# budget): docs/testing.md, "Release checks".
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root

IMAGE="${COTX_IMAGE:-cotx:dev}"
what="${1:-all}"

# podman, runc, debootstrap (Debian's) and the base image debian:12: scripts/lib.sh.
podman_install
podman_base_image
[ "$what" = base ] && exit 0

# --- build --------------------------------------------------------------------------------
log "building $IMAGE (podman build --network host; 20-40 minutes the first time on 2 cores)"
t0=$SECONDS
# --format docker: the OCI format ignores the Dockerfile's SHELL (bash with pipefail).
"${PODMAN[@]}" build --format docker --network host "${PODMAN_LIMITS[@]}" -t "$IMAGE" -f "$COTX_ROOT/Dockerfile" "$COTX_ROOT"
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")
log "built $IMAGE in $((SECONDS - t0)) s; image size $((size / 1000000)) MB"
[ "$what" = build ] && exit 0

# --- run the demo (the image's default command) -------------------------------------------
# Host network: the demo's servers take free loopback ports, as on a development machine.
log "running the demo in $IMAGE"
t0=$SECONDS
"${PODMAN[@]}" run --rm --network host "${PODMAN_LIMITS[@]}" "$IMAGE"
log "the demo passed in the image ($((SECONDS - t0)) s)"
