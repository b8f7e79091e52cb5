"""Test stand-in for nvidia-smi (molecule only), answering from the sysfs fixture tree named
in /etc/cozystack-gpu-stand-in/root: ``-q`` (with Host VGPU Mode), ``--query-gpu=pci.bus_id,
uuid --format=csv,noheader`` and ``vgpu -s -v -i <address>`` (the card model's types)."""
import os
import sys
import uuid

CONF = os.environ.get("COZYSTACK_GPU_STAND_IN_CONF", "/etc/cozystack-gpu-stand-in")
sys.path.insert(0, os.environ.get("COZYSTACK_GPU_STAND_IN_LIB", "/usr/lib/cozystack-gpu-stand-in"))
from sysfs_tree import SysfsTree  # noqa: E402  pylint: disable=wrong-import-position,import-error

NAMESPACE = uuid.UUID("0b7c2c55-7e0c-4bd4-8f54-2f1b8d9e3a11")


def gpus(tree):
    """Physical GPUs on the nvidia driver, as nvidia-smi lists them (not VFs)."""
    found = []
    for address, model in sorted(tree.cards.items()):
        device = tree.device_dir(address)
        if (device / "physfn").exists() or tree.driver_of(address) != "nvidia":
            continue
        if not model.class_code.startswith("0x03"):
            continue
        found.append((address, model))
    return found


def long_address(address):
    return "0000" + address


def main(argv):
    tree = SysfsTree.open(open(os.path.join(CONF, "root"), encoding="utf-8").read().strip())
    found = gpus(tree)
    if argv == ["-q"]:
        print("==============NVSMI LOG==============\n")
        print("Driver Version                            : 550.54.16")
        print(f"Attached GPUs                             : {len(found)}")
        for address, model in found:
            mode = "SR-IOV" if model.total_vfs else "Non SR-IOV"
            print(f"GPU {long_address(address)}")
            print(f"    Product Name                          : NVIDIA {model.key.upper()}")
            print("    GPU Virtualization Mode")
            print("        Virtualization Mode               : Host VGPU")
            print(f"        Host VGPU Mode                    : {mode}")
        return 0
    if argv[:1] and argv[0].startswith("--query-gpu=") and "--format=csv,noheader" in argv:
        for address, _model in found:
            gpu_uuid = uuid.uuid5(NAMESPACE, address)
            print(f"{long_address(address)}, GPU-{gpu_uuid}")
        return 0
    if argv[:3] == ["vgpu", "-s", "-v"] and len(argv) == 5 and argv[3] == "-i":
        wanted = argv[4] if argv[4].count(":") == 2 else "0000:" + argv[4]
        for address, model in found:
            if address != wanted:
                continue
            print(f"GPU {long_address(address)}")
            for vgpu in model.vgpu_types:
                print(f"    vGPU Type ID                          : {vgpu.type_id:#x}")
                print(f"        Name                              : {vgpu.name}")
            return 0
        print(f"No GPU at {argv[4]}", file=sys.stderr)
        return 6
    print(f"nvidia-smi stand-in: unsupported arguments {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
