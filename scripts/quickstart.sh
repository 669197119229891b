#!/usr/bin/env bash
# The quickstart on containers (README, "Quickstart on containers"): deploy/compose/compose.yaml
# run with Debian's podman-compose on this machine's podman storage (scripts/lib.sh, PODMAN),
# then the overdraft demo against it.
#   bash scripts/quickstart.sh          # up, demo, down
#   bash scripts/quickstart.sh up       # the images (scripts/images.sh: quick when built), the
#                                       # three containers; waits until the coordinator is ready
#   bash scripts/quickstart.sh demo [ARGS]   # demo/overdraft.py --external against them (ARGS: e.g. --rounds 20)
#   bash scripts/quickstart.sh down     # the containers and their volumes removed
# COTX_QUICKSTART_NO_BUILD=1 uses the images already built.
#
# Why not `podman-compose up -d` alone: Debian 12's podman-compose (1.0.3) gives every
# container `--net <project>_default --network-alias <service>`, and podman refuses a
# network alias beside `network_mode: host` ("--network-alias can only be set when the
# network mode is bridge"). So `up` takes podman-compose's own commands (--dry-run) and
# runs them without those two options; everything else (images, environment, volumes,
# mounts, limits, order) is podman-compose's reading of the compose file.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root
COMPOSE_FILE="$COTX_ROOT/deploy/compose/compose.yaml"
PROJECT=cotx-quickstart
# As compose.yaml and deploy/compose/coordinator.toml set them (the quickstart's, public).
PG_PORT=15432 MY_PORT=13306 COORD_URL=http://127.0.0.1:17420
CLIENT_TOKEN=quickstart-client-token-0123 OPERATOR_TOKEN=quickstart-operator-token-0123 DB_PASSWORD=quickstart
compose() { podman-compose --podman-args "${PODMAN[*]:1}" -p "$PROJECT" -f "$COMPOSE_FILE" "$@"; }

up() {
  podman_install
  [ "${COTX_QUICKSTART_NO_BUILD:-0}" = 1 ] || timed "images" bash "$COTX_ROOT/scripts/images.sh" >/dev/null
  local cmds
  cmds=$(compose --dry-run up -d 2>&1 | grep '^podman run ') || die "podman-compose wrote no podman run command"
  log "starting PostgreSQL (:$PG_PORT), MariaDB (:$MY_PORT) and the coordinator ($COORD_URL)"
  python3 - "$cmds" <<'PY' || die "podman run failed"
import shlex, subprocess, sys
for line in sys.argv[1].splitlines():
    args = shlex.split(line)
    for opt in ("--net", "--network-alias"):   # podman-compose 1.0.3's, refused with host networking
        if opt in args and "host" in args[args.index("--network") + 1:args.index("--network") + 2]:
            i = args.index(opt)
            del args[i:i + 2]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
PY
  # Ready: the coordinator's /readyz (its lease, its store), and both databases up with
  # their engine enforcing (pg_co and mysql_co answering), as the operator sees it in
  # /v1/resources: /readyz alone does not wait for a database that is still starting.
  local i
  for i in $(seq 1 240); do
    python3 - "$COORD_URL" "$OPERATOR_TOKEN" 2>/dev/null <<'PY' && { log "ready after $((i / 2)) s: $COORD_URL"; return 0; }
import json, sys, urllib.request
url, token = sys.argv[1:]
urllib.request.urlopen(url + "/readyz", timeout=2)
req = urllib.request.Request(url + "/v1/resources", headers={"Authorization": "Bearer " + token})
res = json.load(urllib.request.urlopen(req, timeout=2))["resources"]
sys.exit(0 if res and all(r["up"] and r["enforcement"]["mode"] == "engine" for r in res) else 1)
PY
    sleep 0.5
  done
  compose logs 2>&1 | tail -40 >&2
  die "the quickstart was not ready within 120 s ($COORD_URL/readyz, /v1/resources)"
}

demo() {
  COTX_TOKEN=$CLIENT_TOKEN COTX_DEMO_PG_PASSWORD=$DB_PASSWORD COTX_DEMO_MY_PASSWORD=$DB_PASSWORD \
    bash "$COTX_ROOT/scripts/demo.sh" --external "$PG_PORT" "$MY_PORT" "$COORD_URL" "$@"
}

down() { compose down -v >/dev/null 2>&1; log "quickstart containers and volumes removed"; }

case "${1:-all}" in
  up) up ;;
  demo) shift; demo "$@" ;;
  down) down ;;
  all) trap down EXIT; up; demo ;;
  *) die "usage: $0 [up | demo [ARGS] | down]" ;;
esac
