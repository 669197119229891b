#!/bin/bash
# Entrypoint of the cotx PostgreSQL image (postgres-pg_co.Containerfile), run as postgres.
# An empty data directory gets a cluster first (initdb, pg_co's settings, CREATE EXTENSION
# pg_co in template1 and postgres so that every database has its views); then the server
# runs in the foreground as the container's main process.
#   POSTGRES_PASSWORD          the superuser postgres's password (scram-sha-256 over TCP)
#   POSTGRES_HOST_AUTH_METHOD  trust: no password over TCP (tests only); one of the two is needed
#   PGPORT                     the port (5432); with --network host pick a free one
# Arguments are passed to postgres (e.g. -c max_connections=200).
set -euo pipefail
bin=/usr/lib/postgresql/$PG_MAJOR/bin
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -n "${POSTGRES_PASSWORD:-}" ]; then
    auth=scram-sha-256
  elif [ "${POSTGRES_HOST_AUTH_METHOD:-}" = trust ]; then
    auth=trust
  else
    echo "postgres-entrypoint: set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust for tests)" >&2
    exit 1
  fi
  pwfile=$(mktemp)
  printf '%s\n' "${POSTGRES_PASSWORD:-}" > "$pwfile"
  # Local socket: trust (only processes inside the container reach it); TCP: $auth.
  "$bin/initdb" -D "$PGDATA" -U postgres -E UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host="$auth" ${POSTGRES_PASSWORD:+--pwfile="$pwfile"} >/dev/null
  rm -f "$pwfile"
  # Any address (bridge networks come from outside loopback), with the same method.
  echo "host all all all $auth" >> "$PGDATA/pg_hba.conf"
  cat >> "$PGDATA/postgresql.conf" <<CONF

# cotx image (postgres-entrypoint.sh): pg_co enforces commitment ordering for 2PC
# (docs/pg_co.md, "Loading"). Prepared transactions are what the coordinator's branches are.
listen_addresses = '*'
shared_preload_libraries = 'pg_co'
max_prepared_transactions = 100
# pg_co protects SERIALIZABLE transactions and refuses to prepare others
# (pg_co.require_serializable): make that the default for every session.
default_transaction_isolation = 'serializable'
CONF
  # The extension's views and functions (co.stats, co.in_doubt) in the default database
  # and in template1, so that CREATE DATABASE copies them. A server on the socket only.
  "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses='' -p $PGPORT" -w start >/dev/null
  for db in template1 postgres; do
    "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h /var/run/postgresql -p "$PGPORT" -U postgres -d "$db" \
      -c 'CREATE EXTENSION IF NOT EXISTS pg_co'
  done
  "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
  echo "postgres-entrypoint: initialized $PGDATA with pg_co" >&2
fi
exec "$bin/postgres" -D "$PGDATA" -p "$PGPORT" "$@"
