"""Test stand-in for NVIDIA's /usr/lib/nvidia/sriov-manage (molecule only).

Acts on the sysfs fixture tree named in /etc/cozystack-gpu-stand-in/root through the
testkit's SysfsTree, the way the driver changes sysfs: ``-e BDF|ALL`` enables every VF of a
PF, ``-d BDF|ALL`` disables them. Like the real script it fails while nvidia-vgpu-mgr is not
up yet, and it can exit 0 without creating anything: each call consumes one count from
/etc/cozystack-gpu-stand-in/sriov-manage-noop (when present), doing nothing but exiting 0,
so callers must judge by sriov_numvfs. Every call is logged to the file named by
COZYSTACK_GPU_STAND_IN_CALLS (default /var/lib/stand-in/calls, where molecule's verify reads
it; the demo points it into its own directory).
"""
import os
import sys

CONF = os.environ.get("COZYSTACK_GPU_STAND_IN_CONF", "/etc/cozystack-gpu-stand-in")
sys.path.insert(0, os.environ.get("COZYSTACK_GPU_STAND_IN_LIB", "/usr/lib/cozystack-gpu-stand-in"))
from sysfs_tree import SysfsTree  # noqa: E402  pylint: disable=wrong-import-position,import-error


def log(line):
    path = os.environ.get("COZYSTACK_GPU_STAND_IN_CALLS", "/var/lib/stand-in/calls")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a", encoding="utf-8") as calls:
        calls.write(line + "\n")


def main(argv):
    if len(argv) != 2 or argv[0] not in ("-e", "-d"):
        print("usage: sriov-manage <-e|-d> <ssss:bb:dd.f|ALL>", file=sys.stderr)
        return 2
    action, target = argv
    log(f"sriov-manage {action} {target}")
    if not os.path.exists(os.environ.get("COZYSTACK_GPU_STAND_IN_READY", "/run/nvidia-vgpu-mgr.ready")):
        print("NVRM: Timeout occurred in event processing by vgpu_mgr daemon", file=sys.stderr)
        return 1
    noop = os.path.join(CONF, "sriov-manage-noop")
    if os.path.exists(noop):
        left = int(open(noop, encoding="utf-8").read().strip() or 0)
        if left > 0:
            with open(noop, "w", encoding="utf-8") as f:
                f.write(f"{left - 1}\n")
            log("sriov-manage: exited 0 without enabling (noop)")
            return 0
    root = open(os.path.join(CONF, "root"), encoding="utf-8").read().strip()
    tree = SysfsTree.open(root)
    pfs = sorted(a for a, m in tree.cards.items() if m.total_vfs and tree.driver_of(a) == "nvidia")
    targets = pfs if target == "ALL" else [target if target.count(":") == 2 else "0000:" + target]
    for pf in targets:
        try:
            if action == "-e":
                tree.enable_vfs(pf)
            else:
                tree.disable_vfs(pf)
        except OSError as exc:
            print(f"sriov-manage: {pf}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
