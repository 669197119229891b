#!/usr/bin/env bash
# Bring-your-own-TM, Go: the Go client of our coordinator (clients/go) runs the overdraft
# against throwaway servers with pg_co / mysql_co and the real daemon, and in client mode
# against a second pair without them (BARE_PG_PORT / BARE_MY_PORT). Offline: the module
# cache was filled by bootstrap-tm.sh (GOPROXY=off makes a missing module an error, not a download).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/tm-env.sh"
require_root
command -v go >/dev/null || die "go missing: run scripts/bootstrap.sh"
work=$(mktemp -d /tmp/cotx-go-XXXXXX)
chmod 755 "$work"
trap 'stop_tm_servers; rm -rf "$work"' EXIT
start_tm_servers "$work" --bare
cd "$COTX_ROOT/clients/go"
GOPROXY=off GOFLAGS=-mod=readonly nice -n 5 go test -count=1 -v ${GO_TEST_ARGS:-} . 2>&1 \
  | grep -E -v '^=== (RUN|PAUSE|CONT)' 
exit "${PIPESTATUS[0]}"
