#!/usr/bin/env bash
# Installs the Debian packages the test platform's real node (kubelet + containerd,
# controller/cozystack_gpu_testkit/node.py) takes from the distribution rather than from
# source: runc (containerd's OCI runtime), containernetworking-plugins (the bridge,
# host-local and loopback CNI plugins, in /usr/lib/cni) and podman (builds the pause image,
# tools/build-binaries.sh). apt-get runs only when one of the programs is missing, so a
# prepared machine pays nothing; `make binaries` runs this first.
#
# Without root and with something missing it says what to install and exits 0: everything
# but the real node still builds, and the real node's tests fail saying what is missing.
set -euo pipefail

log() { echo "[node-packages] $*" >&2; }

missing=()
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || missing+=(runc)
for plugin in bridge host-local loopback; do
  if [ ! -x "/usr/lib/cni/$plugin" ]; then
    missing+=(containernetworking-plugins)
    break
  fi
done
command -v podman >/dev/null || missing+=(podman)

if [ ${#missing[@]} -eq 0 ]; then
  log "runc, the CNI plugins and podman already installed"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  log "missing ${missing[*]}: run 'apt-get install ${missing[*]}' as root for the real node"
  exit 0
fi
log "installing ${missing[*]}"
# The lock timeout lets this wait for another apt run on the machine instead of failing.
apt-get -o DPkg::Lock::Timeout=600 update -qq
DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
  --no-install-recommends "${missing[@]}" >/dev/null
