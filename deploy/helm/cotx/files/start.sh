#!/bin/sh
# The daemon's start in a pod of the cotx chart (deploy/helm/cotx; the StatefulSet's
# command): renders this pod's config from the chart's template, then runs
# `cotx-coordinator <args> --config $COTX_CONFIG` in its place.
#
# The template's placeholders (the only things a pod adds to what Helm rendered):
#   @@NODE_ID@@    $COTX_NODE_ID_PREFIX + the pod's StatefulSet ordinal (cotx-2 -> c2):
#                  a node id stays with its ordinal across restarts and reschedules
#   @@POD_NAME@@   the pod's name (its DNS name under the headless Service: advertise_url)
#   @@env:NAME@@   the value of $NAME (a DSN with its password, from a Secret), escaped
#                  for a TOML string: it stays out of the ConfigMap and of `ps`
# Environment: POD_NAME, COTX_NODE_ID_PREFIX, COTX_CONFIG_TEMPLATE, COTX_CONFIG, and
# COTX_BIN (default /usr/bin/cotx-coordinator; the chart's test runs the built binary).
set -eu
: "${POD_NAME:?set by the StatefulSet (metadata.name)}"
: "${COTX_CONFIG_TEMPLATE:?}" "${COTX_CONFIG:?}"
ordinal=${POD_NAME##*-}
case $ordinal in
  ''|*[!0-9]*) echo "cotx: pod name '$POD_NAME' does not end in a StatefulSet ordinal" >&2; exit 2 ;;
esac
# An ordinal as the StatefulSet writes it: no leading zeros, so one ordinal, one node id.
ordinal=$((ordinal + 0))
node_id="${COTX_NODE_ID_PREFIX:-}$ordinal"
tmp="$COTX_CONFIG.tmp.$$"
awk -v node_id="$node_id" -v pod="$POD_NAME" '
  function fail(msg) { print "cotx: " msg > "/dev/stderr"; failed = 1; exit 2 }
  # TOML basic string: backslash and quote escaped; a control character (a secret that
  # ends in a newline) cannot be written and is refused rather than cut.
  function esc(s,    out, i, c) {
    out = ""
    for (i = 1; i <= length(s); i++) {
      c = substr(s, i, 1)
      if (c == "\\" || c == "\"") out = out "\\" c
      else if (c < " ") fail("a value of " name " holds a control character (a trailing newline?)")
      else out = out c
    }
    return out
  }
  {
    line = $0; out = ""
    while (match(line, /@@[A-Za-z0-9_:]+@@/)) {
      key = substr(line, RSTART + 2, RLENGTH - 4)
      if (key == "NODE_ID") val = node_id
      else if (key == "POD_NAME") val = pod
      else if (substr(key, 1, 4) == "env:") {
        name = substr(key, 5)
        if (!(name in ENVIRON) || ENVIRON[name] == "") fail(name " is not set: the config names it (a Secret the pod reads)")
        val = esc(ENVIRON[name])
      } else fail("unknown placeholder @@" key "@@ in " FILENAME)
      out = out substr(line, 1, RSTART - 1) val
      line = substr(line, RSTART + RLENGTH)
    }
    print out line
  }' "$COTX_CONFIG_TEMPLATE" > "$tmp" || { rm -f "$tmp"; exit 2; }
mv "$tmp" "$COTX_CONFIG"
exec "${COTX_BIN:-/usr/bin/cotx-coordinator}" "$@" --config "$COTX_CONFIG"
