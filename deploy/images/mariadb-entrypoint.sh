#!/bin/bash
# Entrypoint of the cotx MariaDB image (mariadb-mysql_co.Containerfile), run as mysql.
# An empty data directory gets the system tables first (mariadb-install-db) and root
# access over TCP; then mariadbd runs in the foreground as the container's main process,
# with mysql_co loaded at start by the package's /etc/mysql/mariadb.conf.d/60-mysql-co.cnf.
#   MARIADB_ROOT_PASSWORD               root@'%' password (needed, unless the next one is set)
#   MARIADB_ALLOW_EMPTY_ROOT_PASSWORD=1 root@'%' without password (tests only)
#   MARIADB_PORT                        the port (3306); with --network host pick a free one
# Arguments are passed to mariadbd (e.g. --innodb-buffer-pool-size=1G).
set -euo pipefail
data=/var/lib/mysql
if [ ! -d "$data/mysql" ]; then
  if [ -z "${MARIADB_ROOT_PASSWORD:-}" ] && [ "${MARIADB_ALLOW_EMPTY_ROOT_PASSWORD:-}" != 1 ]; then
    echo "mariadb-entrypoint: set MARIADB_ROOT_PASSWORD (or MARIADB_ALLOW_EMPTY_ROOT_PASSWORD=1 for tests)" >&2
    exit 1
  fi
  # root@localhost without a password at first (the init server below is reachable
  # through its socket only); the SQL below gives it the password.
  mariadb-install-db --datadir="$data" --skip-test-db --skip-name-resolve \
    --auth-root-authentication-method=normal >/dev/null
  # Root over TCP: the coordinator and the applications connect from outside. Done by a
  # server without networking, stopped again before the real one starts.
  sock=/run/mysqld/init.sock
  mariadbd --datadir="$data" --skip-networking --socket="$sock" &
  pid=$!
  for _ in $(seq 1 120); do
    mariadb-admin --socket="$sock" -uroot ping >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { echo "mariadb-entrypoint: the init server exited" >&2; exit 1; }
    sleep 0.5
  done
  # The password goes in on stdin as a quoted SQL string (not in any command line).
  pw=${MARIADB_ROOT_PASSWORD:-}
  pw=${pw//\\/\\\\}; pw=${pw//\'/\\\'}
  mariadb --socket="$sock" -uroot <<SQL
CREATE USER 'root'@'%' IDENTIFIED BY '$pw';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;
ALTER USER 'root'@'localhost' IDENTIFIED BY '$pw';
FLUSH PRIVILEGES;
SQL
  # SIGTERM: a clean shutdown (no password needed, unlike mariadb-admin shutdown now).
  kill -TERM "$pid"
  wait "$pid" || { echo "mariadb-entrypoint: the init server did not stop cleanly" >&2; exit 1; }
  echo "mariadb-entrypoint: initialized $data" >&2
fi
exec mariadbd --datadir="$data" --port="$MARIADB_PORT" --bind-address=0.0.0.0 "$@"
