#!/usr/bin/env bash
# Builds the binaries of the local test control plane from source through the Go module
# proxy (no registry ships kube-apiserver) into a per-machine cache outside the repository,
# so a fresh clone (CI) on the same machine reuses them. A binary is rebuilt only when its
# pinned version changes: the cache directory is named after the versions.
#
# Prints the directory holding kube-apiserver, kubectl, etcd and helm on its last line.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.env"

# The wrapper modules pin the same versions; a mismatch would build one release and label it
# (ldflags, cache directory) as another.
grep -q "k8s.io/kubernetes ${KUBERNETES_VERSION}$" "$here/k8s/go.mod" ||
  { echo "tools/k8s/go.mod does not require k8s.io/kubernetes ${KUBERNETES_VERSION} (versions.env)" >&2; exit 1; }
grep -q "go.etcd.io/etcd/server/v3 ${ETCD_VERSION}$" "$here/etcd/go.mod" ||
  { echo "tools/etcd/go.mod does not require etcd ${ETCD_VERSION} (versions.env)" >&2; exit 1; }

cache_root=${COZYSTACK_GPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cozystack-gpu}
bin_dir="$cache_root/bin/k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}"
mkdir -p "$bin_dir"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { echo "[build-binaries] $*" >&2; }

k8s_ldflags() {
  local v=$KUBERNETES_VERSION minor=${KUBERNETES_VERSION#v1.}
  minor=${minor%%.*}
  # Without these the server reports v0.0.0 and Helm's kubeVersion checks fail.
  echo "-s -w -X k8s.io/component-base/version.gitVersion=$v \
    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
    -X k8s.io/component-base/version.gitTreeState=clean \
    -X k8s.io/client-go/pkg/version.gitVersion=$v \
    -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
}

build() { # name, module dir, package, ldflags
  local name=$1 dir=$2 pkg=$3 ldflags=$4
  if [ -x "$bin_dir/$name" ]; then
    log "$name: cached in $bin_dir"
    return
  fi
  log "$name: building $pkg (a first build takes several minutes on 2 cores)..."
  local start=$SECONDS
  (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$bin_dir/$name.tmp" "$pkg")
  mv "$bin_dir/$name.tmp" "$bin_dir/$name"
  log "$name: built in $((SECONDS - start)) s"
}

build etcd "$here/etcd" . "-s -w"
build kube-apiserver "$here/k8s" k8s.io/kubernetes/cmd/kube-apiserver "$(k8s_ldflags)"
build kubectl "$here/k8s" k8s.io/kubernetes/cmd/kubectl "$(k8s_ldflags)"
if [ ! -x "$bin_dir/helm" ]; then
  log "helm: building helm.sh/helm/v3/cmd/helm@$HELM_VERSION..."
  start=$SECONDS
  GOBIN="$bin_dir" GOFLAGS= go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  log "helm: built in $((SECONDS - start)) s"
else
  log "helm: cached in $bin_dir"
fi
echo "$bin_dir"
