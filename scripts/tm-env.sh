# Sourced by scripts/test-java.sh and scripts/test-go.sh (and bootstrap-tm.sh): where the
# Java and Go toolchains' caches live, and a helper that starts the test servers.
COTX_M2="$COTX_CACHE/m2"
export GOPATH="$COTX_CACHE/go"
export GOMODCACHE="$COTX_CACHE/go/pkg/mod"
export GOCACHE="$COTX_CACHE/go/build-cache"
export GOTOOLCHAIN=local   # never download a toolchain behind our back
for d in /usr/local/go/bin /usr/lib/go/bin; do
  [ -x "$d/go" ] && case ":$PATH:" in *":$d:"*) ;; *) PATH="$d:$PATH";; esac
done
export PATH

# start_tm_servers DIR [--bare]: starts `python -m cotest up --info` (pg_co preloaded, mysql_co
# loaded) in the background, waits for its ports, and exports PG_PORT, MY_PORT, PG_DSN, MY_DSN.
# --bare: also a second pair without pg_co and mysql_co (a managed database's: client mode),
# started alongside, exported as BARE_PG_PORT, BARE_MY_PORT, BARE_PG_DSN, BARE_MY_DSN.
# stop_tm_servers stops them (call it from a trap).
TM_SERVERS_PIDS=()
start_tm_servers() {
  local main bare=
  _tm_up "$1/servers" --require-ext
  main=$!
  if [ "${2:-}" = --bare ]; then
    _tm_up "$1/bare" --no-ext
    bare=$!
  fi
  _tm_wait "$1/servers" "$main"
  # shellcheck disable=SC1090
  source "$1/servers.env"
  export PG_PORT MY_PORT PG_DSN MY_DSN
  if [ -n "$bare" ]; then
    _tm_wait "$1/bare" "$bare"
    eval "$(sed 's/^/BARE_/' "$1/bare.env")"   # the same lines as servers.env, prefixed
    export BARE_PG_PORT BARE_MY_PORT BARE_PG_DSN BARE_MY_DSN
  fi
}
# _tm_up BASE ARGS...: one `cotest up` in the background, writing BASE.env when ready, its output in BASE.log.
_tm_up() {
  "$COTX_VENV/bin/python" -m cotest up --info "$1.env" "${@:2}" >"$1.log" 2>&1 &
  TM_SERVERS_PIDS+=("$!")
}
# _tm_wait BASE PID: until BASE.env is there; dies when PID (its cotest) exits first.
_tm_wait() {
  local i
  for i in $(seq 1 1200); do
    [ -f "$1.env" ] && return 0
    kill -0 "$2" 2>/dev/null || { cat "$1.log" >&2; die "test servers did not start ($1.log)"; }
    sleep 0.1
  done
  die "test servers did not start within 120 s ($1.log)"
}
stop_tm_servers() {
  local pid
  for pid in "${TM_SERVERS_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${TM_SERVERS_PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  TM_SERVERS_PIDS=()
}
