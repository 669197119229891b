#!/usr/bin/env bash
# The headless browser of the web console's test (regress/pytest/coordinator/test_coordinator_console.py):
# Debian's chromium, chromium-common and chromium-driver, all three at one version, so the
# driver always matches the browser. Selenium (requirements.txt) drives it through
# /usr/bin/chromedriver and never downloads a browser or a driver of its own.
#
# The version is CHROMIUM_VERSION (scripts/lib.sh) while apt offers it. bookworm-security
# keeps only its newest chromium build and drops the one before within weeks, so an exact
# pin cannot outlive it: a fresh machine would then have no browser, and no CI run could
# pass, until someone edited the pin. When the pin is gone the newest build apt offers is
# installed instead (still Debian's archive, all three packages at that one version), with
# a warning that names both versions. Idempotent: nothing happens when the three are
# installed at one version that is the pin, or newer than a pin apt no longer offers.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root
pkgs=(chromium chromium-common chromium-driver)
offered() { apt-cache madison chromium 2>/dev/null | awk '{print $3}' | grep -qxF "$1"; }
installed=$(deb_version chromium)
same=1
for p in "${pkgs[@]}"; do [ "$(deb_version "$p")" = "$installed" ] || same=0; done
if [ -n "$installed" ] && [ $same = 1 ]; then
  [ "$installed" = "$CHROMIUM_VERSION" ] && exit 0
  if ! offered "$CHROMIUM_VERSION" && dpkg --compare-versions "$installed" gt "$CHROMIUM_VERSION"; then
    log "warning: chromium $installed is installed; the pin $CHROMIUM_VERSION (scripts/lib.sh) is no longer offered by apt: update CHROMIUM_VERSION to $installed"
    exit 0
  fi
fi
apt-get update -qq
version=$CHROMIUM_VERSION
if ! offered "$version"; then
  version=$(apt-cache policy chromium | awk '/Candidate:/ {print $2}')
  [ -n "$version" ] && [ "$version" != "(none)" ] \
    || die "apt offers no chromium (apt-cache policy chromium): the web console's test needs Debian's chromium and chromium-driver"
  log "warning: chromium $CHROMIUM_VERSION (the pin, scripts/lib.sh) is no longer offered by apt (bookworm-security keeps only its newest build); installing $version, the browser and its driver alike: update CHROMIUM_VERSION to $version"
fi
log "installing chromium, chromium-common and chromium-driver $version (Debian packages; the console test's headless browser)"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-downgrades --no-install-recommends \
  "${pkgs[@]/%/=$version}" >/dev/null
