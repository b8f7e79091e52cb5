#!/bin/sh
# Builds a stand-in for the licensed vGPU KVM host driver package (molecule only): the
# nvidia-smi and sriov-manage stand-ins, the daemons as harmless units, and the fixture
# library they act through. Usage: build-driver-deb.sh OUT.deb COLLECTION_ROOT
set -eu
out=$1
collection=$2
here=$(cd "$(dirname "$0")" && pwd)
pkg=$(mktemp -d)
trap 'rm -rf "$pkg"' EXIT
install -d "$pkg/DEBIAN"
sh "$here/stage-driver-files.sh" "$pkg" lib/systemd/system "$collection"
cat >"$pkg/DEBIAN/control" <<CONTROL
Package: nvidia-vgpu-kvm-stand-in
Version: 550.54.16-1
Architecture: all
Maintainer: Cozystack GPU team <noreply@example.invalid>
Depends: python3
Description: molecule stand-in for the NVIDIA vGPU host driver for KVM
 Not a driver: acts on a sysfs fixture tree for tests of cozystack.gpu.
CONTROL
# Like the real package (DKMS builds and loads the module): the module shows as loaded in the
# fixture tree once the package is installed.
cat >"$pkg/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -r /etc/cozystack-gpu-stand-in/root ]; then
  module=$(cat /etc/cozystack-gpu-stand-in/root)/sys/module/nvidia
  mkdir -p "$module"
  echo 550.54.16 >"$module/version"
fi
POSTINST
chmod 0755 "$pkg/DEBIAN/postinst"
dpkg-deb --root-owner-group --build "$pkg" "$out" >/dev/null
