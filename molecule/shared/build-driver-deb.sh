#!/bin/sh
# Builds a stand-in for the licensed vGPU KVM host driver package (molecule only): the
# nvidia-smi and sriov-manage stand-ins, the daemons as harmless units, and the fixture
# library they act through. Like the real package, it registers its module with DKMS and
# builds it for the running kernel when dkms is installed, and removes it again on removal or
# upgrade. Usage: build-driver-deb.sh OUT.deb COLLECTION_ROOT [VERSION]
set -eu
out=$1
collection=$2
version=${3:-550.54.16}
here=$(cd "$(dirname "$0")" && pwd)
pkg=$(mktemp -d)
trap 'rm -rf "$pkg"' EXIT
install -d "$pkg/DEBIAN"
sh "$here/stage-driver-files.sh" "$pkg" lib/systemd/system "$collection"
cat >"$pkg/DEBIAN/control" <<CONTROL
Package: nvidia-vgpu-kvm-stand-in
Version: $version-1
Architecture: all
Maintainer: Cozystack GPU team <noreply@example.invalid>
Depends: python3
Description: molecule stand-in for the NVIDIA vGPU host driver for KVM
 Not a driver: acts on a sysfs fixture tree for tests of cozystack.gpu.
CONTROL
# Like the real package (DKMS builds and loads the module): the module shows as loaded in the
# fixture tree once the package is installed; a module already loaded stays as it is until a
# reboot, as an upgrade leaves the old one running.
cat >"$pkg/DEBIAN/postinst" <<POSTINST
#!/bin/sh
set -e
if [ "\$1" = configure ] && command -v dkms >/dev/null 2>&1; then
  dkms add -m nvidia -v $version
  dkms install -m nvidia -v $version -k "\$(uname -r)"
fi
if [ "\$1" = configure ] && [ -r /etc/cozystack-gpu-stand-in/root ]; then
  module=\$(cat /etc/cozystack-gpu-stand-in/root)/sys/module/nvidia
  if [ ! -e "\$module/version" ]; then
    mkdir -p "\$module"
    echo $version >"\$module/version"
  fi
fi
POSTINST
cat >"$pkg/DEBIAN/prerm" <<PRERM
#!/bin/sh
set -e
if command -v dkms >/dev/null 2>&1; then
  dkms remove -m nvidia -v $version --all || true
fi
PRERM
chmod 0755 "$pkg/DEBIAN/postinst" "$pkg/DEBIAN/prerm"
dpkg-deb --root-owner-group --build "$pkg" "$out" >/dev/null
