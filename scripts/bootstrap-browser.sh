#!/usr/bin/env bash
# The headless browser of the web console's test (regress/pytest/coordinator/test_coordinator_console.py):
# Debian's chromium and chromium-driver at CHROMIUM_VERSION (scripts/lib.sh). Idempotent:
# nothing happens when that version is installed. Selenium (requirements.txt) drives it
# through /usr/bin/chromedriver and never downloads a browser or a driver of its own.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root
want=("chromium=$CHROMIUM_VERSION" "chromium-driver=$CHROMIUM_VERSION" "chromium-common=$CHROMIUM_VERSION")
missing=()
for p in "${want[@]}"; do
  [ "$(deb_version "${p%%=*}")" = "$CHROMIUM_VERSION" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
log "installing ${missing[*]} (Debian packages; the console test's headless browser)"
apt-get update -qq
# bookworm-security replaces chromium often and drops the old build: say what to change.
apt-cache madison chromium | awk '{print $3}' | grep -qxF "$CHROMIUM_VERSION" \
  || die "chromium $CHROMIUM_VERSION is no longer offered by apt (apt-cache policy chromium shows what is): update CHROMIUM_VERSION in scripts/lib.sh"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-downgrades --no-install-recommends "${missing[@]}" >/dev/null
