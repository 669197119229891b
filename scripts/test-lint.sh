#!/usr/bin/env bash
# Formatters and linters, as a Rust/Python/Go shop runs them in CI: a finding fails the
# suite, and the message says the command that fixes or shows it.
#   Rust:   cargo fmt --check (rustfmt.toml), clippy -D warnings on the daemon's crates,
#           pg_co's pure rules and the load driver (not yet pg_co's pgrx shell: clippy
#           would need pgrx's per-major build environment; its logic is in pg_co_rules)
#   Python: ruff check (ruff.toml; ruff pinned in requirements.txt)
#   Go:     gofmt -l, go vet (offline: the module cache bootstrap-tm.sh filled)
set -uo pipefail
source "$(dirname "$0")/lib.sh"
# Go's module and build caches under $COTX_CACHE, which bootstrap-tm.sh filled: go vet runs
# offline there, whatever GOPATH or GOMODCACHE the environment sets (an image's own ones
# lack the client's modules).
source "$(dirname "$0")/tm-env.sh"
cd "$COTX_ROOT"
export LIBSQLITE3_FLAGS="-DHAVE_FDATASYNC=1"   # as build-coordinator.sh: no SQLite rebuild
failed=()
step() {  # name, command...
  local name=$1; shift
  log "lint: $name"
  "$@" || failed+=("$name")
}
for tool in rustfmt clippy; do
  cargo "${tool/rustfmt/fmt}" --version >/dev/null 2>&1 \
    || die "cargo ${tool/rustfmt/fmt} is missing: rustup component add $tool --toolchain $(rustup show active-toolchain | cut -d' ' -f1)"
done
step "rustfmt (fix: cargo fmt --all; cd bench/loadgen && cargo fmt)" \
  bash -c 'cargo fmt --all --check && cd bench/loadgen && cargo fmt --check'
step "clippy (show: the same command without -q)" \
  bash -c "CARGO_TARGET_DIR='$COTX_CACHE/target-lint' nice -n 5 cargo clippy -q --locked --all-targets \
             -p coordinator-daemon -p cotx-protocol -p cotx-model -p pg_co_rules -- -D warnings \
           && cd bench/loadgen && CARGO_TARGET_DIR='$COTX_CACHE/target-lint-loadgen' nice -n 5 \
              cargo clippy -q --locked --all-targets -- -D warnings"
step "ruff (fix: $COTX_VENV/bin/ruff check --fix .)" "$COTX_VENV/bin/ruff" check -q .
step "gofmt (fix: gofmt -w clients/go)" bash -c 'out=$(gofmt -l clients/go); [ -z "$out" ] || { echo "not gofmt-formatted: $out"; exit 1; }'
step "go vet" bash -c 'cd clients/go && GOPROXY=off GOFLAGS=-mod=readonly go vet ./...'
if [ ${#failed[@]} -gt 0 ]; then
  log "lint failed: ${failed[*]}"
  exit 1
fi
log "lint: clean"
