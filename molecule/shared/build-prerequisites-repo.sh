#!/bin/sh
# Builds a local APT repository (molecule only) with stand-ins for what the nvidia_vgpu_host
# role installs before the driver: dkms (a dkms command that logs its calls),
# build-essential, and the headers of the running kernel. Debian's mirrors are not needed.
# Usage: build-prerequisites-repo.sh OUT_DIR KERNEL_RELEASE
set -eu
out=$1
kernel=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
package() {  # name, description; files come from $work/$1
  install -d "$work/$1/DEBIAN"
  cat >"$work/$1/DEBIAN/control" <<CONTROL
Package: $1
Version: 99.0-stand-in
Architecture: all
Maintainer: Cozystack GPU team <noreply@example.invalid>
Description: molecule stand-in: $2
CONTROL
  dpkg-deb --root-owner-group --build "$work/$1" "$out/$1_99.0-stand-in_all.deb" >/dev/null
}
install -d "$work/dkms/usr/sbin"
cat >"$work/dkms/usr/sbin/dkms" <<'DKMS'
#!/bin/sh
mkdir -p /var/lib/stand-in
echo "dkms $*" >>/var/lib/stand-in/calls
DKMS
chmod 0755 "$work/dkms/usr/sbin/dkms"
package dkms "Dynamic Kernel Module Support"
install -d "$work/build-essential/usr/share/doc/build-essential"
package build-essential "compilers for building the module"
install -d "$work/linux-headers-$kernel/usr/src/linux-headers-$kernel"
package "linux-headers-$kernel" "headers of kernel $kernel"
(cd "$out" && dpkg-scanpackages --multiversion . /dev/null >Packages 2>/dev/null)
