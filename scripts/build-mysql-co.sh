#!/usr/bin/env bash
# Builds mysql_co.so against the exact MariaDB source of the installed server and installs it
# into MariaDB's plugin dir. Idempotent: configure is cached behind a stamp, the plugin is
# rebuilt only when its sources changed, the installed .so is replaced only when it differs.
#
#   bash scripts/build-mysql-co.sh          # configure once (~1 min), build (~1 min first), install
#   MYSQL_CO_NO_INSTALL=1 bash ...          # build and check only
#
# It builds for the MariaDB 10.11.x package installed here (dpkg's mariadb-server-core),
# not for a pinned one: after a Debian update of mariadb-server, stop the server, upgrade,
# run this script again, start (docs/mysql_co.md, "Upgrading MariaDB: rebuild mysql_co").
# Only the version pinned in scripts/lib.sh (MARIADB_VERSION) has been tested.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root

# The installed package's version (1:10.11.18-0+deb12u1) and its upstream part (10.11.18).
pkg_ver=$(deb_version mariadb-server-core)
[ -n "$pkg_ver" ] || die "package mariadb-server-core is not installed: mysql_co is built for the installed
  Debian MariaDB server (scripts/bootstrap.sh installs $MARIADB_VERSION)"
upstream=${pkg_ver#*:}; upstream=${upstream%%[-+~]*}
case "$upstream" in
  10.11.*) ;;
  *) die "installed MariaDB is $pkg_ver: mysql_co is written for MariaDB 10.11.x only" ;;
esac
if [ "$pkg_ver" = "$MARIADB_VERSION" ]; then
  SRC="$COTX_CACHE/mariadb-src/mariadb-$MARIADB_UPSTREAM"   # where bootstrap.sh unpacks it
else
  SRC="$COTX_CACHE/mariadb-src/mariadb-${pkg_ver#*:}"
  log "building mysql_co for the installed MariaDB $pkg_ver (cotx is tested with $MARIADB_VERSION only)"
fi
BUILD="${MYSQL_CO_BUILD_DIR:-$COTX_CACHE/mariadb-build}"
PLUGIN_SRC="$COTX_ROOT/mysql_co_plugin"
PLUGIN_DIR="${COTX_MARIADB_PLUGIN_DIR:-/usr/lib/mysql/plugin}"
MARIADBD="${MARIADBD:-$(command -v mariadbd || echo /usr/sbin/mariadbd)}"
SYMS=/usr/share/doc/mariadb-server/mariadbd.sym.gz

# --- 1. the installed server must be exactly the source we compile against ----------------
[ -x "$MARIADBD" ] || die "mariadbd not found: run scripts/bootstrap.sh first"
srv_ver=$("$MARIADBD" --version | sed -n 's/.*Ver \([0-9][0-9.]*\)-MariaDB-\([^ ]*\) .*/\1-\2/p')
want_ver="$upstream-${pkg_ver##*-}"
if [ "$srv_ver" != "$want_ver" ]; then
  die "$MARIADBD says it is '$srv_ver', but package mariadb-server-core is '$pkg_ver' (expected
  '$want_ver'): mysql_co is compiled from the source package of the installed version, and
  $MARIADBD is not that build (a server not from Debian's packages? see docs/mysql_co.md,
  \"MariaDB from mariadb.org's packages\")."
fi

# --- 2. the source package (bootstrap normally fetched it) ---------------------------------
if [ ! -f "$SRC/debian/rules" ]; then
  log "downloading MariaDB source package $pkg_ver"
  mkdir -p "$COTX_CACHE/mariadb-src"
  (cd "$COTX_CACHE/mariadb-src" && apt-get source -qq --download-only "mariadb=$pkg_ver" >/dev/null \
     && dpkg-source -x --no-check "mariadb_${pkg_ver#*:}.dsc" "$SRC" >/dev/null) \
    || die "could not fetch the source package mariadb=$pkg_ver (apt needs a deb-src line for the
  repository the installed server came from, e.g. bookworm-security after a security update)"
fi
src_ver=$(awk -F= '/^MYSQL_VERSION_(MAJOR|MINOR|PATCH)/ {printf "%s%s", sep, $2; sep="."}' "$SRC/VERSION")
[ "$src_ver" = "$upstream" ] || die "source tree $SRC is version $src_ver, expected $upstream"
chlog_ver=$(dpkg-parsechangelog -l "$SRC/debian/changelog" -S Version)
[ "$chlog_ver" = "$pkg_ver" ] || die "source package in $SRC is $chlog_ver, expected $pkg_ver"

# One build at a time (build.sh and test runs of several checkouts share the build dir).
mkdir -p "$COTX_CACHE"
exec 8>"$COTX_CACHE/mysql-co-build.lock"
flock -w 1800 8 || die "another mysql_co build holds $COTX_CACHE/mysql-co-build.lock"

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
  "-DMYSQL_SERVER_SUFFIX=-${pkg_ver##*-}"
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
stamp_key=$(printf '%s\n' "$pkg_ver" "$SRC" "$CFLAGS" "$CXXFLAGS" "$LDFLAGS" "${CMAKE_ARGS[@]}" | sha256sum | cut -c1-16)
stamp="$BUILD/.cotx-configured-$stamp_key"
if [ ! -f "$stamp" ]; then
  log "configuring MariaDB $upstream in $BUILD (Debian's flags; about a minute)"
  rm -rf "$BUILD"; mkdir -p "$BUILD"
  (cd "$BUILD" && cmake "$SRC" "${CMAKE_ARGS[@]}" > "$BUILD/cotx-configure.log" 2>&1) \
    || { tail -30 "$BUILD/cotx-configure.log" >&2; die "cmake configure failed (full log: $BUILD/cotx-configure.log)"; }
  grep -q '^PLUGIN_MYSQL_CO:' "$BUILD/CMakeCache.txt" || die "configure did not pick up plugin/mysql_co"
  touch "$stamp"
fi

# --- 5. layout check input: offsets the installed binary uses ------------------------------
# Read from the machine code of exported accessors of the installed mariadbd; the plugin
# static_asserts its own view of these structures against them (mysql_co.cc, top), so a
# header/binary mismatch fails the build instead of crashing the server.
layout_h="$BUILD/plugin/mysql_co/mysql_co_layout.h"
disasm() {  # symbol -> intel-syntax disassembly of its first bytes
  local addr
  addr=$(nm -D --defined-only "$MARIADBD" | awk -v s="$1" '$3==s {print $1; exit}')
  [ -n "$addr" ] || die "layout check: symbol $1 not exported by $MARIADBD"
  objdump -d --no-show-raw-insn -M intel --start-address="0x$addr" \
    --stop-address="$(printf '0x%x' $((0x$addr + 64)))" "$MARIADBD" | awk 'NR>7'
}
first_off() {  # disassembly on stdin, ERE matching the instruction -> its displacement
  { grep -m1 -E "$1" | grep -oE '\+0x[0-9a-f]+\]' | tail -1 | tr -d '+]'; } || true
}
d_iso=$(disasm thd_tx_isolation); d_ro=$(disasm thd_tx_is_read_only)
d_cmd=$(disasm thd_sql_command); d_xid=$(disasm thd_get_xid)
d_had=$(disasm thd_get_ha_data); d_opt=$(disasm thd_test_options)
d_ilt=$(disasm thd_in_lock_tables)
off_iso=$(first_off 'mov +eax,DWORD PTR \[rdi\+0x' <<<"$d_iso")
off_ro=$(first_off 'movzx +eax,BYTE PTR \[rdi\+0x' <<<"$d_ro")
off_ilt=$(first_off 'movzx +eax,BYTE PTR \[rdi\+0x' <<<"$d_ilt")
off_lex=$(first_off 'mov +rax,QWORD PTR \[rdi\+0x' <<<"$d_cmd")
off_cmd=$(first_off 'mov +eax,DWORD PTR \[rax\+0x' <<<"$d_cmd")
off_trans=$(first_off 'mov +rdi,QWORD PTR \[rdi\+0x' <<<"$d_xid")
off_xs=$(first_off 'cmp +QWORD PTR \[rdi\+0x[0-9a-f]+\],0x0' <<<"$d_xid")
off_ixid=$(first_off 'lea +rax,\[rdi\+0x[0-9a-f]+\]$' <<<"$(grep -E -A3 'mov +rdi,QWORD PTR' <<<"$d_xid")")
off_slot=$(first_off 'mov +eax,DWORD PTR \[rsi\+0x' <<<"$d_had")
shl_had=$({ grep -m1 -oE 'shl +rax,0x[0-9a-f]+' <<<"$d_had" | grep -oE '0x[0-9a-f]+$'; } || true)
off_had=$({ grep -m1 -oE '\[rax\+rdi\*1\+0x[0-9a-f]+\]' <<<"$d_had" | grep -oE '0x[0-9a-f]+'; } || true)
off_opt=$(first_off 'mov +rax,QWORD PTR \[rdi\+0x' <<<"$d_opt")
for v in off_iso off_ro off_ilt off_lex off_cmd off_trans off_xs off_ixid off_slot shl_had off_had off_opt; do
  [ -n "${!v}" ] || die "layout check: could not read $v from the machine code of $MARIADBD
  (compiler output changed?). Inspect with: objdump -d -M intel --start-address=... $MARIADBD"
done
IFS=. read -r vmaj vmin vpat <<<"$upstream"
# The identity of the build, checked again when the plugin loads (mysql_co_server_check.h):
# the GNU build-id note of mariadbd and its version string.
build_id=$(readelf -n "$MARIADBD" | awk '/Build ID:/ {print $3; exit}')
[ -n "$build_id" ] || log "warning: $MARIADBD has no build-id note: at load mysql_co can check the version string only"
srv_version_string=$("$MARIADBD" --version | sed -n 's/.*Ver \([^ ]*\) .*/\1/p')
[ -n "$srv_version_string" ] || die "could not read the version string from '$MARIADBD --version'"
mkdir -p "$(dirname "$layout_h")"
new_layout="/* Generated by scripts/build-mysql-co.sh from $MARIADBD ($srv_ver). */
#define MYSQL_CO_EXPECT_VERSION_ID $((vmaj * 10000 + vmin * 100 + vpat))
#define MYSQL_CO_EXPECT_BUILD_ID \"$build_id\"
#define MYSQL_CO_EXPECT_SERVER_VERSION \"$srv_version_string\"
#define MYSQL_CO_OFF_THD_TX_ISOLATION $off_iso
#define MYSQL_CO_OFF_THD_TX_READ_ONLY $off_ro
#define MYSQL_CO_OFF_THD_IN_LOCK_TABLES $off_ilt
#define MYSQL_CO_OFF_THD_LEX $off_lex
#define MYSQL_CO_OFF_LEX_SQL_COMMAND $off_cmd
#define MYSQL_CO_OFF_THD_TRANSACTION $off_trans
#define MYSQL_CO_OFF_TRANS_XID_STATE $off_xs
#define MYSQL_CO_OFF_TRANS_IMPLICIT_XID $off_ixid
#define MYSQL_CO_OFF_THD_HA_DATA $off_had
#define MYSQL_CO_SIZEOF_HA_DATA (1 << $shl_had)
#define MYSQL_CO_OFF_HTON_SLOT $off_slot
#define MYSQL_CO_OFF_THD_OPTION_BITS $off_opt"
# Rewrite only on change, so make does not rebuild for nothing.
[ "$(cat "$layout_h" 2>/dev/null)" = "$new_layout" ] || printf '%s\n' "$new_layout" > "$layout_h"

# --- 6. build only the plugin ---------------------------------------------------------------
# make compares timestamps only: when the symlink now points at another checkout (or the
# sources changed to older files), force a rebuild by content.
src_hash=$(cd "$PLUGIN_SRC" && find . -path ./mysql-test -prune -o -type f -print | sort | xargs sha256sum | sha256sum | cut -c1-16)
hash_file="$BUILD/plugin/mysql_co/.cotx-src-hash"
if [ "$(cat "$hash_file" 2>/dev/null)" != "$src_hash" ]; then
  rm -f "$BUILD/plugin/mysql_co/mysql_co.so"
  find "$BUILD/plugin/mysql_co" -name '*.o' -delete 2>/dev/null || true
fi
log "building mysql_co (make -j2 mysql_co)"
(cd "$BUILD" && make -j2 mysql_co > "$BUILD/cotx-make.log" 2>&1) \
  || { grep -E 'error|static assertion' "$BUILD/cotx-make.log" | head -20 >&2; tail -20 "$BUILD/cotx-make.log" >&2;
       die "building mysql_co failed (full log: $BUILD/cotx-make.log)"; }
SO="$BUILD/plugin/mysql_co/mysql_co.so"
[ -f "$SO" ] || die "make finished but $SO is missing"
echo "$src_hash" > "$hash_file"
# Every symbol the plugin takes from the server must be exported by the installed binary.
missing=$(comm -23 <(nm -D --undefined-only "$SO" | awk '$1=="U" {print $2}' | sed 's/@.*//' | sort -u) \
                   <( { nm -D --defined-only "$MARIADBD"; for l in $(ldd "$MARIADBD" | grep -oE '/[^ ]+\.so[^ ]*'); do nm -D --defined-only "$l"; done; } 2>/dev/null | awk '{print $3}' | sed 's/@.*//' | sort -u))
[ -z "$missing" ] || die "mysql_co.so needs symbols the installed mariadbd does not export: $missing"

# --- 7. install: copy to a temporary name, then rename (never overwrite a loaded .so) -------
if [ "${MYSQL_CO_NO_INSTALL:-0}" = 1 ]; then log "built $SO (not installed: MYSQL_CO_NO_INSTALL=1)"; exit 0; fi
dest="$PLUGIN_DIR/mysql_co.so"
if cmp -s "$SO" "$dest"; then
  log "mysql_co.so is up to date in $PLUGIN_DIR"
else
  tmp="$PLUGIN_DIR/.mysql_co.so.tmp.$$"
  install -m 0644 "$SO" "$tmp"
  mv -f "$tmp" "$dest"
  log "installed $dest (servers that had it loaded keep the old copy until they restart)"
fi
