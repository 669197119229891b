#!/usr/bin/env bash
# Installs the project's own Python packages into the venv, editable (a change to their
# code needs no reinstall): cotx (clients/python), cotest (harness), checker, bench.
# Idempotent: the stamp holds the checkout's path and the pyproject files' hash, so the
# install is redone only when one of them changes. The venv is machine-wide; an editable
# install points at one checkout, so running this from another checkout re-points it.
# Called by bootstrap.sh after the venv exists.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
PKGS=(clients/python harness checker bench)
key=$( { echo "$COTX_ROOT"; for p in "${PKGS[@]}"; do cat "$COTX_ROOT/$p/pyproject.toml"; done; } | sha256sum | cut -c1-16)
stamp="$COTX_VENV/.pkgs-$key"
[ -f "$stamp" ] && exit 0
log "installing the project's Python packages (editable) from $COTX_ROOT"
args=()
for p in "${PKGS[@]}"; do args+=(-e "$COTX_ROOT/$p"); done
# Without build isolation: setuptools comes from requirements.txt, so no download. The
# backend's warnings are informational ("editable installation"): not shown.
PYTHONWARNINGS=ignore "$COTX_VENV/bin/pip" install -q --no-build-isolation --no-deps "${args[@]}"
rm -f "$COTX_VENV"/.pkgs-*; touch "$stamp"
