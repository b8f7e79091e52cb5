#!/bin/sh
# Stages the files both driver stand-ins carry, the .deb (build-driver-deb.sh) and the
# .run (build-driver-run.sh): the nvidia-smi and sriov-manage stand-ins, the daemons as
# harmless units, and the fixture library they act through (molecule only).
# Usage: stage-driver-files.sh ROOT UNIT_DIR COLLECTION_ROOT, UNIT_DIR relative to ROOT
# (the .deb's lib/systemd/system; the .run's usr/lib/systemd/system, see there why).
set -eu
root=$1
units=$2
collection=$3
here=$(cd "$(dirname "$0")" && pwd)
install -d "$root/usr/bin" "$root/usr/lib/nvidia" "$root/$units" \
  "$root/usr/lib/cozystack-gpu-stand-in"
install -m 0755 "$here/stand-ins/nvidia-smi" "$root/usr/bin/nvidia-smi"
install -m 0755 "$here/stand-ins/sriov-manage" "$root/usr/lib/nvidia/sriov-manage"
install -m 0644 "$here/stand-ins/units/nvidia-vgpud.service" \
  "$here/stand-ins/units/nvidia-vgpu-mgr.service" "$root/$units/"
install -m 0644 "$collection/controller/cozystack_gpu_testkit/sysfs_tree.py" \
  "$collection/controller/cozystack_gpu_testkit/pci.ids" \
  "$here/stand-ins/nvidia_smi.py" "$here/stand-ins/sriov_manage.py" \
  "$root/usr/lib/cozystack-gpu-stand-in/"
