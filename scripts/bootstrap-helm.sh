#!/usr/bin/env bash
# Helm, for the test of the chart in deploy/helm (regress/pytest/deploy/test_helm_chart.py): built from its Go
# module with `go install` (the Go module proxy is the registry that serves it here; no
# release binary is downloaded), pinned by HELM_VERSION in lib.sh, into
# $COTX_CACHE/tools/helm-<version>/helm. Idempotent: a second run checks that file and ends.
# The first build takes a few minutes on 2 cores (helm pulls in Kubernetes' client libraries).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/tm-env.sh"   # GOPATH, the module and build caches under $COTX_CACHE
[ -x "$HELM_BIN" ] && exit 0
# helm's go.mod asks for this Go; GOTOOLCHAIN=local (tm-env.sh) never downloads another.
have_minor=$(go env GOVERSION 2>/dev/null | sed -n 's/^go1\.\([0-9]*\).*/\1/p')
[ -n "$have_minor" ] && [ "$have_minor" -ge "$HELM_GO_MINOR" ] \
  || die "helm $HELM_VERSION needs Go 1.$HELM_GO_MINOR or newer to build (found: $(go env GOVERSION 2>/dev/null || echo 'no go'))"
log "building helm $HELM_VERSION from its Go module into $(dirname "$HELM_BIN") (a few minutes, once)"
mkdir -p "$COTX_CACHE/tools"
tmp=$(mktemp -d "$COTX_CACHE/tools/.helm-build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# The link-time settings of helm's own Makefile: its version (else "v3.22"), and the
# Kubernetes version that `helm template` and `helm lint` assume, 1.<minor of k8s.io/client-go
# in helm's go.mod> (else 1.20, older than the chart's kubeVersion allows).
gomod=$(cd / && go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
k8s_minor=$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$gomod")
[ -n "$k8s_minor" ] || die "no k8s.io/client-go version in helm $HELM_VERSION's go.mod ($gomod)"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for pkg in pkg/lint/rules pkg/chartutil; do
  ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$k8s_minor"
done
# -trimpath: no build paths in the binary; CGO off: a static binary, as helm's releases are.
(cd / && CGO_ENABLED=0 GOBIN="$tmp" long_step "helm $HELM_VERSION" 240 nice -n 10 go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION") \
  || die "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION failed (Go module proxy reachable?)"
[ "$("$tmp/helm" version --template '{{.Version}}')" = "$HELM_VERSION" ] || die "the helm just built does not run or is not $HELM_VERSION"
mkdir -p "$(dirname "$HELM_BIN")"
mv "$tmp/helm" "$HELM_BIN"   # last: an interrupted build leaves no half-installed helm
log "helm $HELM_VERSION installed: $HELM_BIN"
