#!/usr/bin/env bash
# Builds the Python client's wheel, cotx-<version>-py3-none-any.whl, into OUT_DIR (default
# dist/): what a service installs with `pip install` without this tree (README, "Adding the
# clients to a service"). Built by the venv's pip and setuptools (requirements.txt), without
# build isolation, so nothing is downloaded; from a copy of clients/python, so the build's
# by-products (build/, *.egg-info) stay out of the checkout. No root needed.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
out=$(mkdir -p "${1:-$COTX_ROOT/dist}" && cd "${1:-$COTX_ROOT/dist}" && pwd)
[ -x "$COTX_VENV/bin/pip" ] || die "no venv at $COTX_VENV: run scripts/bootstrap.sh first"
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
# The package's own files only (no egg-info or caches of the editable install).
cp "$COTX_ROOT/clients/python/pyproject.toml" "$COTX_ROOT/clients/python/README.md" "$src/"
cp -r "$COTX_ROOT/clients/python/cotx" "$src/cotx"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
PYTHONWARNINGS=ignore "$COTX_VENV/bin/pip" wheel -q --no-deps --no-build-isolation -w "$out" "$src" >&2
whl="$out/cotx-$(release_version)-py3-none-any.whl"
[ -f "$whl" ] || die "the wheel $whl was not written (is clients/python/pyproject.toml's version the release's?)"
echo "$whl"
