#!/bin/sh
# Builds a stand-in for the licensed vGPU KVM host driver's .run installer (molecule only):
# a self-extracting shell script, as NVIDIA's is, carrying the same stand-in files as
# build-driver-deb.sh. Run with --silent it logs its arguments to /var/lib/stand-in/calls;
# with --dkms it needs the dkms command (the real installer registers the module with DKMS),
# and fails saying so when it is missing; then it unpacks its files into / and, like the
# module DKMS builds and loads, shows the nvidia module as loaded in the fixture tree.
# Usage: build-driver-run.sh OUT.run COLLECTION_ROOT
set -eu
out=$1
collection=$2
here=$(cd "$(dirname "$0")" && pwd)
payload=$(mktemp -d)
trap 'rm -rf "$payload"' EXIT
# Everything under usr/: on a merged-/usr host /lib is a link that unpacking must not replace.
sh "$here/stage-driver-files.sh" "$payload" usr/lib/systemd/system "$collection"
cat >"$out.tmp" <<'HEADER'
#!/bin/sh
# Stand-in for NVIDIA-Linux-x86_64-550.54.16-vgpu-kvm.run (molecule only).
mkdir -p /var/lib/stand-in
echo "nvidia-installer $*" >>/var/lib/stand-in/calls
silent=no
dkms=no
for arg; do
  case "$arg" in
    --silent) silent=yes ;;
    --dkms) dkms=yes ;;
  esac
done
if [ "$silent" != yes ]; then
  echo "ERROR: the installer would ask questions; run it with --silent" >&2
  exit 1
fi
if [ "$dkms" = yes ] && ! command -v dkms >/dev/null 2>&1; then
  echo "ERROR: Failed to run \`dkms\`: install DKMS (and the kernel headers) first" >&2
  exit 1
fi
if [ "$dkms" = yes ]; then
  dkms add -m nvidia -v 550.54.16
  dkms install -m nvidia -v 550.54.16 -k "$(uname -r)"
fi
line=$(awk '/^__PAYLOAD__$/ { print NR + 1; exit }' "$0")
tail -n "+$line" "$0" | tar -xz --no-same-permissions --keep-directory-symlink -C /
if [ -r /etc/cozystack-gpu-stand-in/root ]; then
  module=$(cat /etc/cozystack-gpu-stand-in/root)/sys/module/nvidia
  mkdir -p "$module"
  echo 550.54.16 >"$module/version"
fi
exit 0
__PAYLOAD__
HEADER
tar -C "$payload" --owner=0 --group=0 -cz usr >>"$out.tmp"
chmod 0755 "$out.tmp"
mv "$out.tmp" "$out"
