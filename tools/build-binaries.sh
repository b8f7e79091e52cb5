#!/usr/bin/env bash
# Builds the binaries of the local test control plane from source through the Go module
# proxy (no registry ships kube-apiserver) into a per-machine cache outside the repository,
# so a fresh clone (CI) on the same machine reuses them. A binary is rebuilt only when its
# pinned version changes: the cache directory is named after the versions.
#
# Prints the directory holding kube-apiserver, kube-scheduler, kube-controller-manager,
# kubectl, etcd, helm, prometheus, promtool, kubevirt-crds.yaml (KubeVirt's CRDs as its
# virt-operator generates them), KubeVirt's virt-controller and virt-api, and
# kubevirt-manifests.yaml (what virt-operator would install for virt-controller and virt-api),
# and the real node's kubelet, containerd, containerd-shim-runc-v2, ctr, pause.oci.tar (the
# sandbox image as an OCI archive) and pause-image (its reference) on its last line.
#
# COZYSTACK_GPU_BUILD_JOBS: how many packages go builds at once (go's -p; the number of CPUs
# by default), for a machine shared with other work.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.env"

# The wrapper modules pin the same versions; a mismatch would build one release and label it
# (ldflags, cache directory) as another.
grep -q "k8s.io/kubernetes ${KUBERNETES_VERSION}$" "$here/k8s/go.mod" ||
  { echo "tools/k8s/go.mod does not require k8s.io/kubernetes ${KUBERNETES_VERSION} (versions.env)" >&2; exit 1; }
grep -q "go.etcd.io/etcd/server/v3 ${ETCD_VERSION}$" "$here/etcd/go.mod" ||
  { echo "tools/etcd/go.mod does not require etcd ${ETCD_VERSION} (versions.env)" >&2; exit 1; }
pins_kubevirt() { # module dir, version
  grep -q "kubevirt.io/kubevirt $2$" "$here/$1/go.mod" &&
    grep -q "kubevirt.io/api => kubevirt.io/api $2$" "$here/$1/go.mod"
}
pins_kubevirt kubevirt "$KUBEVIRT_VERSION" ||
  { echo "tools/kubevirt/go.mod does not pin kubevirt ${KUBEVIRT_VERSION} (versions.env)" >&2; exit 1; }
pins_kubevirt kubevirt-components "$KUBEVIRT_COMPONENTS_VERSION" ||
  { echo "tools/kubevirt-components/go.mod does not pin kubevirt ${KUBEVIRT_COMPONENTS_VERSION} (versions.env)" >&2; exit 1; }

cache_root=${COZYSTACK_GPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cozystack-gpu}
bin_dir="$cache_root/bin/k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}"
mkdir -p "$bin_dir"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
jobs=${COZYSTACK_GPU_BUILD_JOBS:-$(nproc)}

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

build() { # name, module dir, package, ldflags[, output dir]
  local name=$1 dir=$2 pkg=$3 ldflags=$4 out=${5:-$bin_dir}
  if [ -x "$out/$name" ]; then
    log "$name: cached in $out"
    return
  fi
  log "$name: building $pkg (a first build takes several minutes on 2 cores)..."
  local start=$SECONDS
  (cd "$dir" && go build -p "$jobs" -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg")
  mv "$out/$name.tmp" "$out/$name"
  log "$name: built in $((SECONDS - start)) s"
}

build etcd "$here/etcd" . "-s -w"
build kube-apiserver "$here/k8s" k8s.io/kubernetes/cmd/kube-apiserver "$(k8s_ldflags)"
build kubectl "$here/k8s" k8s.io/kubernetes/cmd/kubectl "$(k8s_ldflags)"
# The real scheduler and controller-manager judge pins, gates and owner references in tests.
build kube-scheduler "$here/k8s" k8s.io/kubernetes/cmd/kube-scheduler "$(k8s_ldflags)"
build kube-controller-manager "$here/k8s" k8s.io/kubernetes/cmd/kube-controller-manager "$(k8s_ldflags)"
# The real node's kubelet (controller/cozystack_gpu_testkit/node.py), same release and flags.
build kubelet "$here/k8s" k8s.io/kubernetes/cmd/kubelet "$(k8s_ldflags)"
if [ ! -x "$bin_dir/helm" ]; then
  log "helm: building helm.sh/helm/v3/cmd/helm@$HELM_VERSION..."
  start=$SECONDS
  GOBIN="$bin_dir" GOFLAGS='' go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  log "helm: built in $((SECONDS - start)) s"
else
  log "helm: cached in $bin_dir"
fi

# KubeVirt's CRDs, printed by virt-operator's own generator at the pinned release, in a cache
# directory of their own (named after that release) so a KubeVirt bump leaves the
# Kubernetes binaries alone. Other files of the generator's package import modules the
# proxy refuses (see tools/kubevirt/go.mod), so the build compiles a scratch module holding
# just the generator's files, taken unchanged from the checksum-verified module download.
kubevirt_crds() {
  local dir="$cache_root/bin/kubevirt-${KUBEVIRT_VERSION}"
  local components=pkg/virt-operator/resource/generate/components
  if [ -s "$dir/crds.yaml" ]; then
    log "kubevirt CRDs: cached in $dir"
    return
  fi
  log "kubevirt CRDs: building virt-operator's generator at kubevirt.io/kubevirt@$KUBEVIRT_VERSION..."
  local start=$SECONDS src stage
  src=$(cd "$here/kubevirt" && go mod download -json "kubevirt.io/kubevirt@$KUBEVIRT_VERSION" |
    sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -d "$src/$components" ] ||
    { echo "kubevirt.io/kubevirt@$KUBEVIRT_VERSION: no $components in the download" >&2; exit 1; }
  stage=$(mktemp -d)
  mkdir -p "$stage/kubevirt/pkg/pointer" "$stage/kubevirt/$components" "$dir"
  cp "$src/go.mod" "$stage/kubevirt/"
  cp "$src/pkg/pointer/pointer.go" "$stage/kubevirt/pkg/pointer/"
  cp "$src/$components/crds.go" "$src/$components/validations_generated.go" \
    "$stage/kubevirt/$components/"
  cp "$here/kubevirt/go.mod" "$here/kubevirt/go.sum" "$stage/"
  chmod -R u+w "$stage"
  echo "replace kubevirt.io/kubevirt => $stage/kubevirt" >>"$stage/go.mod"
  (cd "$here/kubevirt" &&
    go build -modfile="$stage/go.mod" -trimpath -ldflags "-s -w" -o "$dir/kubevirt-crds.tmp" .)
  rm -rf "$stage"
  "$dir/kubevirt-crds.tmp" >"$dir/crds.yaml.tmp"
  mv "$dir/kubevirt-crds.tmp" "$dir/kubevirt-crds"
  mv "$dir/crds.yaml.tmp" "$dir/crds.yaml"
  log "kubevirt CRDs: built and generated in $((SECONDS - start)) s"
}
kubevirt_crds

# KubeVirt's own virt-controller and virt-api at KUBEVIRT_COMPONENTS_VERSION (why not
# KUBEVIRT_VERSION: tools/versions.env), and what virt-operator would install for them (CRDs,
# RBAC, virt-api's webhook configurations, printed by virt-operator's own generators), in a
# cache directory named after that release. The test kit runs both in the namespace
# "kubevirt": the one they pick outside a pod (kubevirt.io/client-go/util.GetNamespace).
#
# The printer is ours and changes more often than the release: its binary and its output
# are named after a hash of its source and module files, so a changed printer is built and
# run again (a cache by file existence alone would keep the old output for ever), and the
# kit's kubevirt-manifests.yaml links to the output of the printer in this checkout.
kubevirt_components() {
  local v=$KUBEVIRT_COMPONENTS_VERSION
  local dir="$cache_root/bin/kubevirt-components-$v" mod="$here/kubevirt-components"
  # Without these virt-controller reports v0.0.0-master.
  local ldflags="-s -w -X kubevirt.io/client-go/version.gitVersion=$v \
    -X kubevirt.io/client-go/version.gitTreeState=clean"
  mkdir -p "$dir"
  build virt-controller "$mod" kubevirt.io/kubevirt/cmd/virt-controller "$ldflags" "$dir"
  build virt-api "$mod" kubevirt.io/kubevirt/cmd/virt-api "$ldflags" "$dir"
  local printer
  printer="kubevirt-manifests-$(cat "$mod"/manifests/*.go "$mod/go.mod" "$mod/go.sum" |
    sha256sum | cut -c1-12)"
  build "$printer" "$mod" ./manifests "-s -w" "$dir"
  if [ ! -s "$dir/$printer.yaml" ]; then
    "$dir/$printer" kubevirt >"$dir/$printer.yaml.tmp"
    mv "$dir/$printer.yaml.tmp" "$dir/$printer.yaml"
  fi
  ln -sfn "$dir/$printer.yaml" "$bin_dir/kubevirt-manifests.yaml"
}
kubevirt_components
# Prometheus and promtool at the pinned release, in a cache directory of their own (named
# after that release) so adding or bumping them leaves the Kubernetes binaries alone. Built
# without the web UI's assets (the builtinassets tag): the tests use only the HTTP API; and
# without the service discoveries of clouds and the like (remove_all_sd): the tests scrape
# static targets, and those SDs' SDKs would double the build.
prometheus() {
  local mv=$PROMETHEUS_MODULE_VERSION minor patch v
  # The module's v0.3XX.Y is the release v3.XX.Y.
  minor=${mv#v0.3}
  patch=${minor#*.}
  minor=${minor%%.*}
  v="v3.$((10#$minor)).$patch"
  local dir="$cache_root/bin/prometheus-$v"
  mkdir -p "$dir"
  local name
  for name in prometheus promtool; do
    if [ -x "$dir/$name" ]; then
      log "$name: cached in $dir"
      continue
    fi
    log "$name: building github.com/prometheus/prometheus/cmd/$name@$mv ($v; a first build takes several minutes on 2 cores)..."
    local start=$SECONDS stage
    stage=$(mktemp -d)
    GOBIN="$stage" GOFLAGS='' go install -trimpath -tags remove_all_sd \
      -ldflags "-s -w -X github.com/prometheus/common/version.Version=${v#v} \
        -X github.com/prometheus/common/version.Branch=HEAD \
        -X github.com/prometheus/common/version.Revision=module-$mv" \
      "github.com/prometheus/prometheus/cmd/$name@$mv"
    mv "$stage/$name" "$dir/$name"
    rm -rf "$stage"
    log "$name: built in $((SECONDS - start)) s"
  done
  ln -sfn "$dir/prometheus" "$bin_dir/prometheus"
  ln -sfn "$dir/promtool" "$bin_dir/promtool"
}
prometheus
# containerd v2 (the daemon, its runc shim, and ctr to import images) for the real node, in a
# cache directory named after its release. Without the btrfs, devmapper and zfs snapshotters:
# their cgo libraries are not here, and the node uses overlayfs.
containerd() {
  local v=$CONTAINERD_VERSION dir="$cache_root/bin/containerd-$CONTAINERD_VERSION"
  local names=(containerd containerd-shim-runc-v2 ctr) name missing=0
  mkdir -p "$dir"
  for name in "${names[@]}"; do [ -x "$dir/$name" ] || missing=1; done
  if [ "$missing" = 0 ]; then
    log "containerd $v: cached in $dir"
  else
    log "containerd $v: building containerd, containerd-shim-runc-v2 and ctr (about 1.5 minutes warm)..."
    local start=$SECONDS stage pkgs=()
    stage=$(mktemp -d)
    for name in "${names[@]}"; do pkgs+=("github.com/containerd/containerd/v2/cmd/$name@$v"); done
    GOBIN="$stage" GOFLAGS='' go install -p "$jobs" -trimpath -tags "no_btrfs no_devmapper no_zfs" \
      -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$v \
        -X github.com/containerd/containerd/v2/version.Revision=module-$v" "${pkgs[@]}"
    for name in "${names[@]}"; do mv "$stage/$name" "$dir/$name"; done
    rm -rf "$stage"
    log "containerd $v: built in $((SECONDS - start)) s"
  fi
  for name in "${names[@]}"; do ln -sfn "$dir/$name" "$bin_dir/$name"; done
}
containerd
# The real node's sandbox (pause) image: tools/pause built static, put in a FROM-scratch image
# by podman and saved as an OCI archive that the kit imports into containerd; no registry.
# Named after a hash of its sources, so a change builds it again. Needs podman (root).
pause_image() {
  local src="$here/pause" key dir ref
  key=$(cat "$src/main.go" "$src/go.mod" "$src/Containerfile" | sha256sum | cut -c1-12)
  dir="$cache_root/bin/pause-$key"
  ref="localhost/cozystack-gpu/pause:$key"
  # One build at a time per machine: two checkouts' builds share the podman tag.
  mkdir -p "$cache_root/bin"
  exec 9>"$cache_root/bin/.pause.lock"
  flock 9
  if [ -s "$dir/pause.oci.tar" ] && [ -s "$dir/pause-image" ]; then
    log "pause image: cached in $dir"
  elif ! command -v podman >/dev/null; then
    log "pause image: no podman (tools/node-packages.sh installs it); the real node cannot start"
    return
  else
    log "pause image: building $ref..."
    local start=$SECONDS stage
    stage=$(mktemp -d)
    (cd "$src" && go build -p "$jobs" -trimpath -ldflags "-s -w" -o "$stage/pause" .)
    cp "$src/Containerfile" "$stage/"
    mkdir -p "$dir"
    podman build --quiet --tag "$ref" "$stage" >/dev/null
    rm -f "$dir/pause.oci.tar.tmp"
    podman save --quiet --format oci-archive --output "$dir/pause.oci.tar.tmp" "$ref"
    podman rmi --force "$ref" >/dev/null
    rm -rf "$stage"
    mv "$dir/pause.oci.tar.tmp" "$dir/pause.oci.tar"
    echo "$ref" >"$dir/pause-image"
    log "pause image: built in $((SECONDS - start)) s"
  fi
  ln -sfn "$dir/pause.oci.tar" "$bin_dir/pause.oci.tar"
  ln -sfn "$dir/pause-image" "$bin_dir/pause-image"
  exec 9>&-
}
pause_image
# The test kit finds everything in one directory.
ln -sfn "$cache_root/bin/kubevirt-${KUBEVIRT_VERSION}/crds.yaml" "$bin_dir/kubevirt-crds.yaml"
for f in virt-controller virt-api; do
  ln -sfn "$cache_root/bin/kubevirt-components-${KUBEVIRT_COMPONENTS_VERSION}/$f" "$bin_dir/$f"
done
echo "$bin_dir"
