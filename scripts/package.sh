#!/usr/bin/env bash
# Builds Debian packages of the three installable parts into dist/ (gitignored):
#   postgresql-<major>-pg-co_<v>_amd64.deb   pg_co for each major of $COTX_PG_MAJORS, in Debian's
#                                            paths /usr/lib/postgresql/<major>/lib and
#                                            /usr/share/postgresql/<major>/extension
#   mariadb-plugin-mysql-co_<v>_amd64.deb    mysql_co.so in /usr/lib/mysql/plugin, loaded at
#                                            server start by /etc/mysql/mariadb.conf.d/60-mysql-co.cnf
#   cotx-coordinator_<v>_amd64.deb           /usr/bin/cotx-coordinator, its systemd unit,
#                                            /etc/cotx/coordinator.toml, the system user cotx
# Runs the build scripts first (each skips work when its inputs are unchanged), so it
# works from a fresh clone after scripts/bootstrap.sh; COTX_PACKAGE_NO_BUILD=1 packages
# what is already built. Control files and maintainer scripts are written here; plain
# dpkg-deb, no debhelper. Idempotent: every run restages from scratch and rewrites the
# .debs, byte-identical for the same inputs (file times clamped to the last commit's).
#
#   bash scripts/package.sh                  # all packages into dist/
#   COTX_PG_MAJORS=15 bash scripts/package.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root
umask 022

DIST="${COTX_DIST:-$COTX_ROOT/dist}"
MAINTAINER="${COTX_DEB_MAINTAINER:-cotx maintainers <maintainers@cotx.invalid>}"
ARCH=$(dpkg --print-architecture)
[ "$ARCH" = amd64 ] || die "packages are built for amd64 only (this machine: $ARCH)"
VERSION=$(release_version)
[ -n "$VERSION" ] || die "could not read the release version from Cargo.toml ([workspace.package])"
PG_CO_VERSION=$VERSION COORD_VERSION=$VERSION MYSQL_CO_VERSION=$VERSION
# Timestamps in the packages: dpkg-deb's only (not exported: cc-rs rebuilds C dependencies
# of the daemon when SOURCE_DATE_EPOCH changes).
epoch="${SOURCE_DATE_EPOCH:-$(git -C "$COTX_ROOT" log -1 --format=%ct 2>/dev/null || date +%s)}"

# --- 1. build (each script is a no-op when up to date) -----------------------------------
if [ "${COTX_PACKAGE_NO_BUILD:-0}" != 1 ]; then
  for part in pg-co mysql-co coordinator; do
    timed "build $part" bash "$COTX_ROOT/scripts/build-$part.sh"
  done
fi

WORK=$(mktemp -d /tmp/cotx-package.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$DIST"
built=()

# Shared-library dependencies of the given ELF files (dpkg-shlibdeps wants a debian/control
# to read; the one written here names no binary package it would look up).
shlibs() {
  local d="$WORK/shlibs"; mkdir -p "$d/debian"
  printf 'Source: cotx\n\nPackage: cotx\nArchitecture: any\n' > "$d/debian/control"
  local args=() f
  for f in "$@"; do args+=("-e$f"); done
  local deps
  deps=$(cd "$d" && dpkg-shlibdeps -O "${args[@]}" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
  [ -n "$deps" ] || die "dpkg-shlibdeps found no library dependencies of $*"
  echo "$deps"
}

# copyright file (Debian policy: every package has /usr/share/doc/<package>/copyright).
copyright() {
  install -d "$1/usr/share/doc/$2"
  cat > "$1/usr/share/doc/$2/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: cotx
Comment: serializable multi-database transactions (commitment ordering in PostgreSQL and
 MariaDB, a 2PC coordinator). Built from the project's sources by scripts/package.sh.

Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
EOF
  chmod 0644 "$1/usr/share/doc/$2/copyright"
}

# $1 staged root (with DEBIAN/control lacking Installed-Size), $2 package file name.
build_deb() {
  local root=$1 name=$2
  local size; size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
  rm -f "$DIST/${name%%_*}_"*"_$ARCH.deb"   # this package's earlier versions
  sed -i "/^Architecture:/a Installed-Size: $size" "$root/DEBIAN/control"
  chmod 0755 "$root"; find "$root" -type d -exec chmod g-w,o-w {} +
  SOURCE_DATE_EPOCH=$epoch dpkg-deb --root-owner-group -Zxz --build "$root" "$DIST/$name" >/dev/null
  built+=("$DIST/$name")
}

# --- 2. pg_co, one package per PostgreSQL major ------------------------------------------
for major in $COTX_PG_MAJORS; do
  reason=$(pg_unavailable "$major")
  if [ -n "$reason" ]; then log "PostgreSQL $major: SKIPPED ($reason)"; continue; fi
  pg_config=$(readlink -f "$(pg_config_of "$major")")
  [ -x "$pg_config" ] || die "no PostgreSQL $major at $pg_config: run scripts/bootstrap.sh"
  pkglibdir=$("$pg_config" --pkglibdir); sharedir=$("$pg_config" --sharedir)
  # The tree `cargo pgrx package` made for this major (build-pg-co.sh): exactly this
  # build's files, with the frozen install scripts of earlier versions added.
  tree="$COTX_TARGET_PG/pg$major/release/pg_co-pg$major"
  if [ ! -f "$tree$pkglibdir/pg_co.so" ] || [ ! -f "$tree$sharedir/extension/pg_co.control" ]; then
    [ "${COTX_PACKAGE_NO_BUILD:-0}" != 1 ] || die "no pg_co build for PostgreSQL $major in $tree: run scripts/build-pg-co.sh"
    log "PostgreSQL $major: the package tree $tree is gone; rebuilding pg_co"
    rm -f "$COTX_CACHE/pg_co.installed.pg$major"
    COTX_PG_MAJORS=$major bash "$COTX_ROOT/scripts/build-pg-co.sh"
  fi
  # Package what the servers here run and the test suites test.
  cmp -s "$tree$pkglibdir/pg_co.so" "$pkglibdir/pg_co.so" \
    || die "$tree$pkglibdir/pg_co.so differs from the installed $pkglibdir/pg_co.so: run scripts/build-pg-co.sh"
  ctl_version=$(sed -n "s/^default_version = '\(.*\)'$/\1/p" "$tree$sharedir/extension/pg_co.control")
  [ "$ctl_version" = "$PG_CO_VERSION" ] \
    || die "pg_co.control of PostgreSQL $major says default_version '$ctl_version', pg_co_ext/Cargo.toml $PG_CO_VERSION"

  pkg="postgresql-$major-pg-co"
  root="$WORK/$pkg"
  lib="$root/usr/lib/postgresql/$major/lib"; ext="$root/usr/share/postgresql/$major/extension"
  install -d "$lib" "$ext" "$root/DEBIAN"
  install -m 0644 "$tree$pkglibdir/pg_co.so" "$lib/"
  install -m 0644 "$tree$sharedir/extension/pg_co.control" "$tree$sharedir/extension"/pg_co--*.sql "$ext/"
  copyright "$root" "$pkg"
  built_against=$("$pg_config" --version)
  libs=$(shlibs "$lib/pg_co.so")
  cat > "$root/DEBIAN/control" <<EOF
Package: $pkg
Version: $PG_CO_VERSION
Architecture: $ARCH
Maintainer: $MAINTAINER
Depends: postgresql-$major, $libs
Section: database
Priority: optional
Description: cotx pg_co: commitment ordering for PostgreSQL $major two-phase commit
 The PostgreSQL extension pg_co refuses a PREPARE TRANSACTION or COMMIT that
 would let 2PC histories across databases stop being serializable. Load it with
 shared_preload_libraries = 'pg_co', then CREATE EXTENSION pg_co.
 .
 Built against $built_against. pg_co checks at server start that
 the server's SSI layout is the one it was built for and refuses to start
 otherwise.
EOF
  build_deb "$root" "${pkg}_${PG_CO_VERSION}_$ARCH.deb"
done

# --- 3. mysql_co ---------------------------------------------------------------------------
so="${MYSQL_CO_BUILD_DIR:-$COTX_CACHE/mariadb-build}/plugin/mysql_co/mysql_co.so"
[ -f "$so" ] || die "no mysql_co build at $so: run scripts/build-mysql-co.sh"
# The plugin is compiled from the source of exactly this server (build-mysql-co.sh checks).
server_version=$(dpkg-query -W -f='${Version}' mariadb-server 2>/dev/null || true)
[ "$server_version" = "$MARIADB_VERSION" ] \
  || die "mariadb-server here is '$server_version', mysql_co is built for $MARIADB_VERSION (scripts/lib.sh)"
pkg=mariadb-plugin-mysql-co
root="$WORK/$pkg"
install -d "$root/usr/lib/mysql/plugin" "$root/etc/mysql/mariadb.conf.d" "$root/DEBIAN"
install -m 0644 "$so" "$root/usr/lib/mysql/plugin/mysql_co.so"
cat > "$root/etc/mysql/mariadb.conf.d/60-mysql-co.cnf" <<'EOF'
# mysql_co (package mariadb-plugin-mysql-co): commitment ordering for XA transactions.
# Loaded at server start, which arms its restart gate (INSTALL SONAME does not; see the
# project's docs/mysql_co.md, "Loading"). Restart MariaDB after installing or upgrading;
# then SHOW GLOBAL STATUS LIKE 'Mysql_co_health' answers OK.
[mariadb]
plugin-load-add=mysql_co.so
EOF
chmod 0644 "$root/etc/mysql/mariadb.conf.d/60-mysql-co.cnf"
echo /etc/mysql/mariadb.conf.d/60-mysql-co.cnf > "$root/DEBIAN/conffiles"
copyright "$root" "$pkg"
libs=$(shlibs "$root/usr/lib/mysql/plugin/mysql_co.so")
cat > "$root/DEBIAN/control" <<EOF
Package: $pkg
Version: $MYSQL_CO_VERSION
Architecture: $ARCH
Maintainer: $MAINTAINER
Depends: mariadb-server (= $MARIADB_VERSION), $libs
Section: database
Priority: optional
Description: cotx mysql_co: commitment ordering for MariaDB XA transactions
 The MariaDB server plugin mysql_co refuses an XA PREPARE or commit that would
 let 2PC histories across databases stop being serializable. Loaded at server
 start by /etc/mysql/mariadb.conf.d/60-mysql-co.cnf: restart MariaDB after
 installing it.
 .
 Compiled from the source of MariaDB $MARIADB_VERSION and for that server only.
EOF
build_deb "$root" "${pkg}_${MYSQL_CO_VERSION}_$ARCH.deb"

# --- 4. the coordinator daemon -------------------------------------------------------------
bin="$COTX_CACHE/bin/cotx-coordinator"
[ -x "$bin" ] || die "no daemon at $bin: run scripts/build-coordinator.sh"
pkg=cotx-coordinator
root="$WORK/$pkg"
install -d "$root/usr/bin" "$root/lib/systemd/system" "$root/DEBIAN"
install -d -m 0750 "$root/etc/cotx"
install -m 0755 "$bin" "$root/usr/bin/cotx-coordinator"
# The unit of deploy/, its manual-install comment replaced and ExecStart pointed at /usr/bin.
unit="$root/lib/systemd/system/cotx-coordinator.service"
{
  echo "# systemd unit of the cotx coordinator (package cotx-coordinator). Configure"
  echo "# /etc/cotx/coordinator.toml and the token file first (that file's comment says how), then:"
  echo "#   systemctl enable --now cotx-coordinator"
  echo
  sed '1,/^$/d' "$COTX_ROOT/deploy/cotx-coordinator.service" \
    | sed 's#^ExecStart=/usr/local/bin/cotx-coordinator #ExecStart=/usr/bin/cotx-coordinator #'
} > "$unit"
chmod 0644 "$unit"
grep -q '^ExecStart=/usr/bin/cotx-coordinator serve --config /etc/cotx/coordinator.toml$' "$unit" \
  || die "deploy/cotx-coordinator.service: its ExecStart is not the expected /usr/local/bin/cotx-coordinator serve --config /etc/cotx/coordinator.toml"
# The example production config with the token file named relative to the config file
# (/etc/cotx/token; the operator writes it) and its comment block about the repository replaced.
conf="$root/etc/cotx/coordinator.toml"
{
  cat <<'EOF'
# cotx coordinator configuration (package cotx-coordinator; the project's example
# production config). Before starting the service:
#   - set node_id, the decision store's DSN and the resources (every CHANGE-ME);
#   - write the API token, the placeholder below ("token", i.e. /etc/cotx/token):
#       (umask 027; head -c 32 /dev/urandom | base64 > /etc/cotx/token); chgrp cotx /etc/cotx/token
#   - cotx-coordinator check-config --config /etc/cotx/coordinator.toml
#   - systemctl enable --now cotx-coordinator
# This file holds database passwords in the DSNs: mode 0640, owner root, group cotx.
EOF
  sed '1,/^$/{/^#/d}' "$COTX_ROOT/deploy/coordinator.prod.toml" \
    | sed 's|^token_file = "/etc/cotx/token"$|token_file = "token"   # relative to this file: /etc/cotx/token|'
} > "$conf"
chmod 0640 "$conf"
grep -q '^token_file = "token"' "$conf" \
  || die "deploy/coordinator.prod.toml no longer has the line token_file = \"/etc/cotx/token\""
echo /etc/cotx/coordinator.toml > "$root/DEBIAN/conffiles"

# Maintainer scripts. DPKG_ROOT is set (non-empty) by dpkg --root=DIR: the tree being
# installed is not this system, so its users and services are not this system's either.
cat > "$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
# postinst of cotx-coordinator (written by the project's scripts/package.sh)
set -e
[ "$1" = configure ] || exit 0
if [ -n "${DPKG_ROOT:-}" ]; then
  # Installed into another root: create the state directory only; the system user
  # belongs to that system (there: adduser --system --group --home /var/lib/cotx cotx,
  # then chown cotx:cotx /var/lib/cotx; chgrp cotx /etc/cotx /etc/cotx/coordinator.toml).
  install -d -m 0750 "$DPKG_ROOT/var/lib/cotx"
  echo "cotx-coordinator: installed under $DPKG_ROOT: system user cotx not created" >&2
  exit 0
fi
if ! getent passwd cotx >/dev/null; then
  if getent group cotx >/dev/null; then group="--ingroup cotx"; else group="--group"; fi
  adduser --system $group --home /var/lib/cotx --no-create-home --shell /usr/sbin/nologin \
    --gecos "cotx coordinator" cotx >/dev/null
  install -d -m 0750 -o cotx -g cotx /var/lib/cotx
  # Purge removes the user only if this package created it.
  touch /var/lib/cotx/.user-created-by-package
fi
install -d -m 0750 -o cotx -g cotx /var/lib/cotx
if [ -z "${2:-}" ]; then
  # First installation: the service reads its config through the group.
  chgrp cotx /etc/cotx /etc/cotx/coordinator.toml
  chmod 0750 /etc/cotx
  chmod 0640 /etc/cotx/coordinator.toml
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
  # Upgrade: a running daemon restarts on the new binary (every decision is durable).
  if [ -n "${2:-}" ] && systemctl is-active --quiet cotx-coordinator.service; then
    systemctl restart cotx-coordinator.service || true
  fi
fi
exit 0
EOF
cat > "$root/DEBIAN/prerm" <<'EOF'
#!/bin/sh
# prerm of cotx-coordinator (written by the project's scripts/package.sh)
set -e
if [ "$1" = remove ] && [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl stop cotx-coordinator.service || true
fi
exit 0
EOF
cat > "$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
# postrm of cotx-coordinator (written by the project's scripts/package.sh)
set -e
case "$1" in
  purge)
    rm -f "${DPKG_ROOT:-}/etc/systemd/system/multi-user.target.wants/cotx-coordinator.service"
    created=no
    [ -e "${DPKG_ROOT:-}/var/lib/cotx/.user-created-by-package" ] && created=yes
    # The state directory: an SQLite decision store there goes with it.
    rm -rf "${DPKG_ROOT:-}/var/lib/cotx"
    if [ -z "${DPKG_ROOT:-}" ] && [ "$created" = yes ] && getent passwd cotx >/dev/null; then
      deluser --system cotx >/dev/null || true
      if getent group cotx >/dev/null; then delgroup --system --only-if-empty cotx >/dev/null || true; fi
    fi
    ;;
  remove)
    if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
    ;;
esac
exit 0
EOF
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"
copyright "$root" "$pkg"
libs=$(shlibs "$root/usr/bin/cotx-coordinator")
cat > "$root/DEBIAN/control" <<EOF
Package: $pkg
Version: $COORD_VERSION
Architecture: $ARCH
Maintainer: $MAINTAINER
Depends: adduser, $libs
Section: database
Priority: optional
Description: cotx coordinator: durable 2PC decisions across PostgreSQL and MariaDB
 The daemon that runs two-phase commit for global transactions whose branches
 live in PostgreSQL (with pg_co) and MariaDB (with mysql_co), and its operator
 CLI (check-config, in-doubt, show, force, audit). Runs as the system user
 cotx from the systemd unit cotx-coordinator.service, configured in
 /etc/cotx/coordinator.toml; state in /var/lib/cotx.
EOF
build_deb "$root" "${pkg}_${COORD_VERSION}_$ARCH.deb"

echo "built ${#built[@]} packages in $DIST:"
for f in "${built[@]}"; do
  printf '  %s  (%s %s, %s KiB)\n' "$(basename "$f")" "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" "$(( $(stat -c %s "$f") / 1024 ))"
done
