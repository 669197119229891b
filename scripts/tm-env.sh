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

# start_tm_servers DIR: starts tm_servers.py in the background, waits for its ports, and
# exports PG_PORT, MY_PORT, PG_DSN, MY_DSN; stop_tm_servers stops it (call it from a trap).
start_tm_servers() {
  TM_INFO="$1/servers.env"
  "$COTX_VENV/bin/python" "$COTX_ROOT/scripts/tm_servers.py" "$TM_INFO" >"$1/servers.log" 2>&1 &
  TM_SERVERS_PID=$!
  local i
  for i in $(seq 1 1200); do
    [ -f "$TM_INFO" ] && break
    kill -0 "$TM_SERVERS_PID" 2>/dev/null || { cat "$1/servers.log" >&2; die "test servers did not start"; }
    sleep 0.1
  done
  [ -f "$TM_INFO" ] || die "test servers did not start within 120 s"
  # shellcheck disable=SC1090
  source "$TM_INFO"
  export PG_PORT MY_PORT PG_DSN MY_DSN
}
stop_tm_servers() {
  if [ -n "${TM_SERVERS_PID:-}" ]; then
    kill -TERM "$TM_SERVERS_PID" 2>/dev/null || true
    wait "$TM_SERVERS_PID" 2>/dev/null || true
    TM_SERVERS_PID=
  fi
}
