#!/usr/bin/env bash
# Builds mysql_co.so against the exact MariaDB source of the installed server and installs it
# into MariaDB's plugin dir. Idempotent: configure is cached behind a stamp, the plugin is
# rebuilt only when its sources changed, the installed .so is replaced only when it differs.
#
#   bash scripts/build-mysql-co.sh          # configure once (~1 min), build (~1 min first), install
#   MYSQL_CO_NO_INSTALL=1 bash ...          # build and check only
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root

SRC="$COTX_CACHE/mariadb-src/mariadb-$MARIADB_UPSTREAM"
BUILD="${MYSQL_CO_BUILD_DIR:-$COTX_CACHE/mariadb-build}"
PLUGIN_SRC="$COTX_ROOT/mysql_co_plugin"
PLUGIN_DIR="${COTX_MARIADB_PLUGIN_DIR:-/usr/lib/mysql/plugin}"
MARIADBD="${MARIADBD:-$(command -v mariadbd || echo /usr/sbin/mariadbd)}"
SYMS=/usr/share/doc/mariadb-server/mariadbd.sym.gz

# --- 1. the installed server must be exactly the source we compile against ----------------
[ -x "$MARIADBD" ] || die "mariadbd not found: run scripts/bootstrap.sh first"
srv_ver=$("$MARIADBD" --version | sed -n 's/.*Ver \([0-9][0-9.]*\)-MariaDB-\([^ ]*\) .*/\1-\2/p')
pkg_ver=$(deb_version mariadb-server-core)
want_ver="$MARIADB_UPSTREAM-${MARIADB_VERSION##*-}"
if [ "$srv_ver" != "$want_ver" ] || [ "$pkg_ver" != "$MARIADB_VERSION" ]; then
  die "installed MariaDB server is '$srv_ver' (package mariadb-server-core '$pkg_ver'), but mysql_co
  is compiled from the $MARIADB_VERSION source and a plugin built from other headers is refused
  by the server (or worse, loads with a different THD layout). Install $MARIADB_VERSION
  (scripts/bootstrap.sh, COTX_ALLOW_MARIADB_DOWNGRADE=1) or change MARIADB_VERSION in scripts/lib.sh."
fi

# --- 2. the source package (bootstrap normally fetched it) ---------------------------------
if [ ! -f "$SRC/debian/rules" ]; then
  log "downloading MariaDB source package $MARIADB_VERSION"
  mkdir -p "$COTX_CACHE/mariadb-src"
  (cd "$COTX_CACHE/mariadb-src" && apt-get source -qq --download-only "mariadb=$MARIADB_VERSION" >/dev/null \
     && dpkg-source -x --no-check "mariadb_${MARIADB_VERSION#1:}.dsc" "mariadb-$MARIADB_UPSTREAM" >/dev/null)
fi
src_ver=$(awk -F= '/^MYSQL_VERSION_(MAJOR|MINOR|PATCH)/ {printf "%s%s", sep, $2; sep="."}' "$SRC/VERSION")
[ "$src_ver" = "$MARIADB_UPSTREAM" ] || die "source tree $SRC is version $src_ver, expected $MARIADB_UPSTREAM"
chlog_ver=$(dpkg-parsechangelog -l "$SRC/debian/changelog" -S Version)
[ "$chlog_ver" = "$MARIADB_VERSION" ] || die "source package in $SRC is $chlog_ver, expected $MARIADB_VERSION"

# --- 3. link the plugin into the source tree as plugin/mysql_co ----------------------------
# A symlink keeps one copy of the code (this checkout) and lets MariaDB's own CMake
# machinery (MYSQL_ADD_PLUGIN) compile it with exactly the server's flags and defines.
link="$SRC/plugin/mysql_co"
if [ "$(readlink "$link" 2>/dev/null)" != "$PLUGIN_SRC" ]; then
  [ -e "$link" ] && [ ! -L "$link" ] && die "$link exists and is not our symlink"
  ln -sfn "$PLUGIN_SRC" "$link"
fi

# --- 4. configure once, with the flags of Debian's debian/rules ----------------------------
# override_dh_auto_configure's arguments plus what dh_auto_configure and dpkg-buildflags add
# (hardening=+all; CPPFLAGS folded into C/CXXFLAGS as debian/rules does).
export DEB_BUILD_MAINT_OPTIONS="hardening=+all"
cppflags=$(dpkg-buildflags --get CPPFLAGS)
CFLAGS="$(dpkg-buildflags --get CFLAGS) $cppflags"
CXXFLAGS="$(dpkg-buildflags --get CXXFLAGS) $cppflags"
LDFLAGS="$(dpkg-buildflags --get LDFLAGS)"
# -ffile-prefix-map=<cwd>=. would make the stamp depend on the caller's directory.
CFLAGS=$(sed 's/-ffile-prefix-map=[^ ]*//' <<<"$CFLAGS"); CXXFLAGS=$(sed 's/-ffile-prefix-map=[^ ]*//' <<<"$CXXFLAGS")
export CFLAGS CXXFLAGS LDFLAGS
CMAKE_ARGS=(
  -G "Unix Makefiles"
  -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_INSTALL_SYSCONFDIR=/etc -DCMAKE_INSTALL_LOCALSTATEDIR=/var
  -DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu -DCMAKE_INSTALL_RUNSTATEDIR=/run
  -DCMAKE_EXPORT_NO_PACKAGE_REGISTRY=ON -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DFETCHCONTENT_FULLY_DISCONNECTED=ON -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
  -DWITH_PMEM=ON
  "-DCOMPILATION_COMMENT=Debian 12"
  "-DMYSQL_SERVER_SUFFIX=-${MARIADB_VERSION##*-}"
  -DSYSTEM_TYPE=debian-linux-gnu
  -DCMAKE_SYSTEM_PROCESSOR=amd64
  -DBUILD_CONFIG=mysql_release
  -DCONC_DEFAULT_CHARSET=utf8mb4
  -DPLUGIN_AWS_KEY_MANAGEMENT=NO
  -DPLUGIN_COLUMNSTORE=NO
  -DWITH_NUMA=AUTO
  -DIGNORE_AIO_CHECK=ON
  -DWITH_URING=ON
  -DWITH_LIBAIO=ON
  -DWITH_INNODB_SNAPPY=ON
  -DDEB=Debian
)
stamp_key=$(printf '%s\n' "$MARIADB_VERSION" "$SRC" "$CFLAGS" "$CXXFLAGS" "$LDFLAGS" "${CMAKE_ARGS[@]}" | sha256sum | cut -c1-16)
stamp="$BUILD/.cotx-configured-$stamp_key"
if [ ! -f "$stamp" ]; then
  log "configuring MariaDB $MARIADB_UPSTREAM in $BUILD (Debian's flags; about a minute)"
  rm -rf "$BUILD"; mkdir -p "$BUILD"
  (cd "$BUILD" && cmake "$SRC" "${CMAKE_ARGS[@]}" > "$BUILD/cotx-configure.log" 2>&1) \
    || { tail -30 "$BUILD/cotx-configure.log" >&2; die "cmake configure failed (full log: $BUILD/cotx-configure.log)"; }
  grep -q '^PLUGIN_MYSQL_CO:' "$BUILD/CMakeCache.txt" || die "configure did not pick up plugin/mysql_co"
  touch "$stamp"
fi
