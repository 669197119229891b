#!/usr/bin/env bash
# Operations tooling for the tests of deploy/ (regress/pytest/deploy/test_ops_prometheus.py):
# Debian's prometheus (prometheus + promtool). Idempotent; no service is started or left
# enabled to run: the test starts its own Prometheus on a free loopback port.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root
[ -n "$(deb_version prometheus)" ] && exit 0
log "installing prometheus (Debian package; promtool validates deploy/prometheus)"
apt-get update -qq
# Keep the package scripts from starting the system-wide Prometheus.
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
rm -f /usr/sbin/policy-rc.d; trap - EXIT
# Nor at the next boot: only the tests' own instances run.
systemctl disable prometheus.service >/dev/null 2>&1 || true
