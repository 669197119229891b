#!/usr/bin/env bash
# Builds the PostgreSQL majors Debian 12 has no binaries of (17, 18) from the upstream
# tarball inside Debian's source package, into $COTX_CACHE/pg/<major>/, and links Debian's
# 15 there, so every supported major's pg_config is at $COTX_CACHE/pg/<major>/bin/pg_config.
# Cached: a major whose install stamp matches version and options is skipped.
#
# Only *source* indexes of trixie/sid are used, through a private apt configuration under
# $COTX_CACHE/apt-pgsrc (the system's sources and lists stay as they are): binary packages
# of those suites would need a newer libc than bookworm's (docs/setup.md).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root

# major -> "Debian source version|suite"
declare -A PG_SRC_PKG=(
  [17]="17.12-0+deb13u1|trixie"
  [18]="18.6-3|sid"
)
# The options of Debian's build that matter for what the server can do (collations,
# TLS, compression, XML); no docs.
CONFIGURE_OPTS=(--with-icu --with-openssl --with-lz4 --with-zstd --with-libxml --with-readline)
BUILD_DEPS=(flex bison pkg-config libicu-dev libssl-dev liblz4-dev libzstd-dev libxml2-dev libreadline-dev zlib1g-dev perl make gcc)

majors=("$@"); [ ${#majors[@]} -gt 0 ] || majors=(17 18)

# --- 15: Debian's own, linked into the same layout ----------------------------------------
mkdir -p "$COTX_CACHE/pg/15/bin"
ln -sfn "/usr/lib/postgresql/15/bin/pg_config" "$COTX_CACHE/pg/15/bin/pg_config"

stamp_text() { echo "version=${PG_SRC_PKG[$1]%%|*} options=${CONFIGURE_OPTS[*]}"; }
todo=()
for m in "${majors[@]}"; do
  [ "$m" = 15 ] && continue   # Debian's, linked above
  [ -n "${PG_SRC_PKG[$m]:-}" ] || die "no source package known for PostgreSQL $m (supported: ${!PG_SRC_PKG[*]})"
  if [ "$(cat "$COTX_CACHE/pg/$m/.cotx-built" 2>/dev/null)" = "$(stamp_text "$m")" ] \
     && [ -x "$COTX_CACHE/pg/$m/bin/postgres" ]; then
    log "PostgreSQL $m is built ($COTX_CACHE/pg/$m)"
  else
    todo+=("$m")
  fi
done
[ ${#todo[@]} -gt 0 ] || exit 0

# --- build dependencies (idempotent: apt only when one is missing) ------------------------
missing=()
for p in "${BUILD_DEPS[@]}"; do [ -n "$(deb_version "$p")" ] || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing PostgreSQL build dependencies: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install ${missing[*]} failed"
fi

# --- private apt configuration: deb-src of trixie and sid only ----------------------------
APT_DIR="$COTX_CACHE/apt-pgsrc"
mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache"
cat > "$APT_DIR/sources.list" <<'SRC'
# cotx scripts/build-pg-servers.sh: source indexes only (never `deb` lines for these suites).
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main
SRC
APT_OPTS=(-o "Dir::Etc::SourceList=$APT_DIR/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache"
          -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= -o APT::Sandbox::User=root)

SRC_DIR="$COTX_CACHE/postgresql-src"
mkdir -p "$SRC_DIR"
updated=0
to_build=()
for m in "${todo[@]}"; do
  ver=${PG_SRC_PKG[$m]%%|*}; upstream=${ver%%-*}
  tarball=$(ls "$SRC_DIR"/postgresql-"${m}_$upstream".orig.tar.* 2>/dev/null | head -1 || true)
  if [ -z "$tarball" ]; then
    if [ $updated = 0 ]; then
      log "apt-get update (private source indexes: trixie, sid)"
      apt-get "${APT_OPTS[@]}" update -qq || die "apt-get update of the trixie/sid source indexes failed"
      updated=1
    fi
    log "downloading source package postgresql-$m=$ver"
    if ! err=$(cd "$SRC_DIR" && apt-get "${APT_OPTS[@]}" source -qq --download-only "postgresql-$m=$ver" 2>&1 >/dev/null); then
      # Not obtainable here (e.g. the mirror answers 404): skip this major loudly instead of
      # failing every suite; tests say it was skipped and why. A build failure still fails.
      mkdir -p "$COTX_CACHE/pg/$m"
      printf 'source package postgresql-%s=%s did not download: %s\n' "$m" "$ver" \
        "$(printf '%s' "$err" | grep -m1 -E '^(E|W):' || printf '%s' "$err" | head -1)" > "$COTX_CACHE/pg/$m/UNAVAILABLE"
      log "WARNING: PostgreSQL $m skipped: $(cat "$COTX_CACHE/pg/$m/UNAVAILABLE")"
      continue
    fi
    tarball=$(ls "$SRC_DIR"/postgresql-"${m}_$upstream".orig.tar.* | head -1)
  fi
  rm -f "$COTX_CACHE/pg/$m/UNAVAILABLE"
  to_build+=("$m")
  if [ ! -f "$SRC_DIR/postgresql-$upstream/configure" ]; then
    log "unpacking $(basename "$tarball")"
    tar -xf "$tarball" -C "$SRC_DIR" || die "unpacking $tarball failed"
  fi
done

# --- configure, make, make install -------------------------------------------------------
# Runs one step with its output in a log; a failure names the step and shows the log's end.
step() {
  local m=$1 name=$2; shift 2
  local logf="$COTX_CACHE/pg-build/$m/$name.log"
  if ! "$@" >"$logf" 2>&1; then
    tail -30 "$logf" >&2
    die "PostgreSQL $m: '$name' failed (full log: $logf)"
  fi
}
for m in "${to_build[@]}"; do
  ver=${PG_SRC_PKG[$m]%%|*}; upstream=${ver%%-*}
  prefix="$COTX_CACHE/pg/$m"; build="$COTX_CACHE/pg-build/$m"
  log "building PostgreSQL $upstream (from postgresql-$m $ver) into $prefix (make -j2, niced; 10-25 minutes)"
  t0=$SECONDS
  rm -rf "$build" "$prefix"; mkdir -p "$build" "$prefix"; chmod 755 "$COTX_CACHE/pg" "$prefix"
  cd "$build"
  step "$m" configure nice -n 10 "$SRC_DIR/postgresql-$upstream/configure" --prefix="$prefix" "${CONFIGURE_OPTS[@]}"
  step "$m" make nice -n 10 make -j2
  step "$m" make-install make install
  stamp_text "$m" > "$prefix/.cotx-built"
  rm -rf "$build"   # objects are not needed once installed (about 400 MB)
  log "PostgreSQL $m built and installed in $((SECONDS - t0)) s: $prefix/bin/pg_config --version = $("$prefix/bin/pg_config" --version)"
done
