#!/bin/sh
# Builds a small PCI sysfs fixture for the vfio scenario (molecule only): three NVIDIA
# functions on nvidia / no driver / vfio-pci, and a card whose VF carries a vGPU.
set -eu
root=$1
pci=$root/bus/pci
mkdir -p "$pci/devices" "$pci/drivers/nvidia" "$pci/drivers/vfio-pci" "$root/module"
: >"$pci/drivers_probe"
: >"$pci/drivers/nvidia/unbind"
: >"$pci/drivers/vfio-pci/unbind"

function_dir() { # address driver
  dev=$pci/devices/$1
  mkdir -p "$dev"
  printf '0x10de\n' >"$dev/vendor"
  printf '0x26b9\n' >"$dev/device"
  printf '0x030200\n' >"$dev/class"
  printf '(null)\n' >"$dev/driver_override"
  if [ -n "$2" ]; then ln -s "../../drivers/$2" "$dev/driver"; fi
}
function_dir 0000:41:00.0 nvidia
function_dir 0000:42:00.0 ""
function_dir 0000:43:00.0 vfio-pci
function_dir 0000:44:00.0 nvidia
function_dir 0000:44:00.4 nvidia
ln -s ../0000:44:00.4 "$pci/devices/0000:44:00.0/virtfn0"
mkdir -p "$pci/devices/0000:44:00.4/nvidia"
printf '1155\n' >"$pci/devices/0000:44:00.4/nvidia/current_vgpu_type"
