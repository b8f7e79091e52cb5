#!/bin/sh
# Builds a local APT repository (molecule only) with stand-ins for what the nvidia_vgpu_host
# role installs before the driver: dkms (a dkms command that logs its calls and keeps a
# tree of what it built, as /var/lib/dkms), build-essential, and the headers of the running
# kernel and of each further kernel named (linux-headers-<release>, with the
# /lib/modules/<release>/build link DKMS builds against). Debian's mirrors are not needed.
# Usage: build-prerequisites-repo.sh OUT_DIR KERNEL_RELEASE [KERNEL_RELEASE ...]
set -eu
out=$1
shift
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
# dkms 3's calls and status lines, over a tree like its own: $tree/<module>/<version>/source
# once added, $tree/<module>/<version>/<kernel>/x86_64/module once built for <kernel>.
mkdir -p /var/lib/stand-in
echo "dkms $*" >>/var/lib/stand-in/calls
tree=/var/lib/dkms
headers() {
  if [ ! -e "/lib/modules/$1/build" ]; then
    echo "Error! Your kernel headers for kernel $1 cannot be found at /lib/modules/$1/build" >&2
    exit 1
  fi
}
case "$1" in
  status) # status -m MODULE
    for version_dir in "$tree/$3"/*/; do
      [ -d "$version_dir" ] || continue
      version=$(basename "$version_dir")
      built=no
      for kernel_dir in "$version_dir"*/; do
        [ -d "${kernel_dir}x86_64/module" ] || continue
        echo "$3/$version, $(basename "$kernel_dir"), x86_64: installed"
        built=yes
      done
      [ "$built" = yes ] || echo "$3/$version: added"
    done ;;
  add) mkdir -p "$tree/$3/$5/source" ;; # add -m MODULE -v VERSION
  install) headers "$7" && mkdir -p "$tree/$3/$5/$7/x86_64/module" ;; # install -m M -v V -k K
  remove) rm -rf "${tree:?}/$3/$5" ;; # remove -m MODULE -v VERSION --all
  autoinstall) # autoinstall -k KERNEL: the newest version of every added module
    headers "$3"
    for module_dir in "$tree"/*/; do
      [ -d "$module_dir" ] || continue
      newest=$(ls "$module_dir" | sort -V | tail -n 1)
      mkdir -p "$module_dir$newest/$3/x86_64/module"
    done ;;
esac
DKMS
chmod 0755 "$work/dkms/usr/sbin/dkms"
package dkms "Dynamic Kernel Module Support"
install -d "$work/build-essential/usr/share/doc/build-essential"
package build-essential "compilers for building the module"
for kernel; do
  install -d "$work/linux-headers-$kernel/usr/src/linux-headers-$kernel" \
    "$work/linux-headers-$kernel/usr/lib/modules/$kernel"
  ln -s "/usr/src/linux-headers-$kernel" "$work/linux-headers-$kernel/usr/lib/modules/$kernel/build"
  package "linux-headers-$kernel" "headers of kernel $kernel"
done
(cd "$out" && dpkg-scanpackages --multiversion . /dev/null >Packages 2>/dev/null)
