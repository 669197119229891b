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
BASE=debian:12
MIRROR="${COTX_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# The machine refuses higher limits than these (podman's defaults ask for more).
LIMITS=(--ulimit nofile=20000:20000 --ulimit nproc=32768:32768)
PODMAN=(podman --runtime runc)
what="${1:-all}"

# --- podman, runc, debootstrap (Debian's), no service started ---------------------------
missing=()
for p in podman runc debootstrap; do [ -n "$(deb_version "$p")" ] || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  apt-get update -qq
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d; trap - EXIT
fi

# --- the base image: bookworm minbase, imported as debian:12 -----------------------------
make_base() {
  rootfs=$(mktemp -d /var/tmp/cotx-rootfs.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  local dir=$rootfs
  log "making the base image $BASE with debootstrap (bookworm, minbase; about a minute)"
  debootstrap --variant=minbase bookworm "$dir" "$MIRROR" >/dev/null
  # The same apt sources as Debian's official image (the security suite carries the pinned
  # PostgreSQL and MariaDB updates).
  rm -f "$dir/etc/apt/sources.list"
  cat > "$dir/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${MIRROR%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  # A host behind a TLS-inspecting proxy trusts extra CAs: give them to the image, where
  # the ca-certificates package (installed by the Dockerfile) adds them to its bundle.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$dir/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/"
    log "copied the host's extra CA certificates: $(cd /usr/local/share/ca-certificates && echo *.crt)"
  fi
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/archives/*.deb
  tar -C "$dir" --numeric-owner -c . | "${PODMAN[@]}" import -q --change 'CMD ["bash"]' - "$BASE" >/dev/null
  rm -rf "$rootfs"; trap - EXIT
}
if ! "${PODMAN[@]}" image exists "$BASE"; then
  make_base
fi
[ "$what" = base ] && exit 0

# --- build --------------------------------------------------------------------------------
log "building $IMAGE (podman build --network host; 20-40 minutes the first time on 2 cores)"
t0=$SECONDS
# --format docker: the OCI format ignores the Dockerfile's SHELL (bash with pipefail).
"${PODMAN[@]}" build --format docker --network host "${LIMITS[@]}" -t "$IMAGE" -f "$COTX_ROOT/Dockerfile" "$COTX_ROOT"
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")
log "built $IMAGE in $((SECONDS - t0)) s; image size $((size / 1000000)) MB"
[ "$what" = build ] && exit 0

# --- run the demo (the image's default command) -------------------------------------------
# Host network: the demo's servers take free loopback ports, as on a development machine.
log "running the demo in $IMAGE"
t0=$SECONDS
"${PODMAN[@]}" run --rm --network host "${LIMITS[@]}" "$IMAGE"
log "the demo passed in the image ($((SECONDS - t0)) s)"
