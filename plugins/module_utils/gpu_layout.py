# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The node layout: which GPUs of a host are passthrough and which carry which vGPU profile.

One schema, one validator, one planner and one applier, used by the
``cozystack.gpu.gpu_node_layout`` and ``cozystack.gpu.vgpu_profile`` modules and, unchanged,
by the boot restore unit of the ``vgpu_layout`` role: VFs and vGPU profiles are gone after
every reboot, so the unit re-applies the layout with the same code as the module.

The code is seven files in one directory, each importing only those listed before it:

* ``gpu_sysfs.py``: the sysfs inventory (owned by the controller package, linked here);
* ``gpu_layout_schema.py``: the layout document's shape and every refusal of it (the schema
  text is its docstring and ``docs/node-layout.md``);
* ``gpu_layout_resolve.py``: the layout matched to the host's GPUs, profile names to the
  card's type IDs (pure);
* ``gpu_layout_plan.py``: the steps that reach the resolved layout, and the refusals (pure:
  an inventory in, steps and refusals out);
* ``gpu_layout_predict.py``: the host as it will read once a plan has run (pure);
* ``gpu_layout_apply.py``: the steps run on the host, each read back;
* this file: ``nvidia-smi``, :func:`apply_layout` (read, plan, apply in rounds, read again,
  with the before/after summaries the module reports) and the CLI.

What the applier does, in order, and what it never does:

1. passthrough GPUs: ``driver_override`` = ``vfio-pci``, unbind, ``drivers_probe``. A GPU that
   carries vGPUs (a VF with a type, or an mdev) is never unbound: that would destroy them.
2. vgpu GPUs bound to vfio-pci go back to ``nvidia`` only with ``force`` (a VM may hold it).
3. SR-IOV VFs: ``sriov-manage -e <address>``, retried, and judged by ``sriov_numvfs`` alone,
   since it can exit 0 without creating any VF. VFs are never disabled.
4. Profiles: ``nvidia/current_vgpu_type`` read, compared, written and read back. A VF that
   carries another type is changed only with ``force``. mdev-based cards get mdevs with
   UUIDs derived from parent, type and ordinal, so a restore recreates the same UUIDs.
5. Nothing resets a GPU, disables VFs or reboots.

CLI (the boot restore unit runs this file as a script next to its six sibling files)::

    python3 gpu_layout.py {validate,plan,apply} LAYOUT_FILE [--root /] [--force]
        [--sriov-manage /usr/lib/nvidia/sriov-manage] [--nvidia-smi nvidia-smi]
        [--retries 5] [--retry-delay 3]

``LAYOUT_FILE`` is JSON (YAML too when PyYAML is installed). ``--root`` is the directory
below which ``sys/bus/pci/devices`` is read (``/`` on a host, a fixture tree in tests). The
result is one JSON object on stdout; exit status 0 on success (``apply``: the layout is in
place), 1 when applying failed or did not converge, 2 when the layout is invalid for this
host or asks for a change that needs ``--force``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gpu_layout_apply as layout_apply
    import gpu_layout_plan as layout_plan
    import gpu_layout_predict as layout_predict
    import gpu_layout_resolve as layout_resolve
    import gpu_layout_schema as layout_schema
    import gpu_sysfs
else:
    try:
        from ansible_collections.cozystack.gpu.plugins.module_utils import (
            gpu_layout_apply as layout_apply,
        )
        from ansible_collections.cozystack.gpu.plugins.module_utils import (
            gpu_layout_plan as layout_plan,
        )
        from ansible_collections.cozystack.gpu.plugins.module_utils import (
            gpu_layout_predict as layout_predict,
        )
        from ansible_collections.cozystack.gpu.plugins.module_utils import (
            gpu_layout_resolve as layout_resolve,
        )
        from ansible_collections.cozystack.gpu.plugins.module_utils import (
            gpu_layout_schema as layout_schema,
        )
        from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_sysfs
    except ImportError:  # run as a script (python3 -I too), next to its sibling files
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpu_layout_apply as layout_apply
        import gpu_layout_plan as layout_plan
        import gpu_layout_predict as layout_predict
        import gpu_layout_resolve as layout_resolve
        import gpu_layout_schema as layout_schema
        import gpu_sysfs

__all__ = [
    "CODE_FILES",
    "DEFAULT_NVIDIA_SMI",
    "ApplyResult",
    "NvidiaSmi",
    "apply_layout",
    "main",
    "read_host",
    "read_users",
]

DEFAULT_NVIDIA_SMI = "nvidia-smi"
# What the boot restore unit installs side by side: this file and every file it imports.
CODE_FILES = (
    "gpu_layout.py",
    "gpu_layout_apply.py",
    "gpu_layout_plan.py",
    "gpu_layout_predict.py",
    "gpu_layout_resolve.py",
    "gpu_layout_schema.py",
    "gpu_sysfs.py",
)


# --- the host and its tools ----------------------------------------------------------------


def read_host(root: str) -> gpu_sysfs.Inventory:
    """The GPU inventory below ``root``, through the shared sysfs reader."""
    return gpu_sysfs.read_inventory(root)


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _vm_name(root: str, pid: str) -> str:
    """The VM a QEMU process runs, from its ``-name`` argument (KubeVirt: ``<ns>_<vmi>``)."""
    try:
        with open(os.path.join(root, "proc", pid, "cmdline"), "rb") as handle:
            argv = handle.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return f"pid {pid}"
    for index, arg in enumerate(argv[:-1]):
        if arg == "-name":
            value = argv[index + 1]
            for part in value.split(","):
                if part.startswith("guest="):
                    return f"VM {part[len('guest=') :]} (pid {pid})"
            return f"VM {value.split(',')[0]} (pid {pid})"
    return f"{os.path.basename(argv[0]) or 'process'} (pid {pid})"


def read_users(root: str, inventory: gpu_sysfs.Inventory) -> dict[str, list[str]]:
    """Functions and mdevs a running VM uses: PCI address or mdev UUID -> who uses it.

    sysfs shows which VFIO device node each one is reached through: ``/dev/vfio/<group>`` of
    its ``iommu_group`` link (an mdev has a group of its own), and ``/dev/vfio/devices/<name>``
    for each entry of its ``vfio-dev/`` directory (the iommufd character device). A process
    holding one of those open (``/proc/<pid>/fd``) is the VM's QEMU, named by its ``-name``.
    sysfs alone also shows a function on ``vfio-pci`` that userspace opened: vfio-pci enables
    the device at open and disables it at the last close, so its ``enable`` attribute reads 1
    only while a VM holds it. Unreadable entries are skipped: this is a guard, not an audit.
    """
    nodes: dict[str, list[str]] = {}
    enabled: list[str] = []
    devices_dir = os.path.join(root, gpu_sysfs.PCI_DEVICES_DIR)
    for function in inventory.functions:
        base = os.path.join(devices_dir, function.address)
        if function.iommu_group is not None and (
            function.driver in gpu_sysfs.VFIO_DRIVERS or function.physfn is not None
        ):
            nodes.setdefault(f"/dev/vfio/{function.iommu_group}", []).append(function.address)
        try:
            cdevs = os.listdir(os.path.join(base, "vfio-dev"))
        except OSError:
            cdevs = []
        for name in cdevs:
            nodes.setdefault(f"/dev/vfio/devices/{name}", []).append(function.address)
        if function.driver in gpu_sysfs.VFIO_DRIVERS:
            try:
                with open(os.path.join(base, "enable"), encoding="ascii") as handle:
                    if handle.read().strip() not in ("", "0"):
                        enabled.append(function.address)
            except OSError:
                pass
    for mdev in inventory.mdevs:
        group = _readlink(os.path.join(root, gpu_sysfs.MDEV_DEVICES_DIR, mdev.uuid, "iommu_group"))
        if group is not None:
            nodes.setdefault(f"/dev/vfio/{os.path.basename(group)}", []).append(mdev.uuid)
    users: dict[str, list[str]] = {}
    proc = os.path.join(root, "proc")
    try:
        pids = sorted((p for p in os.listdir(proc) if p.isdigit()), key=int)
    except OSError:
        pids = []
    for pid in pids:
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        held = {_readlink(os.path.join(fd_dir, fd)) for fd in fds}
        for node in sorted(n for n in held if n in nodes):
            name = _vm_name(root, pid)
            for device in nodes[node]:
                if name not in users.setdefault(device, []):
                    users[device].append(name)
    for address in enabled:
        users.setdefault(address, ["a process holding its vfio device open (enable is 1)"])
    return users


class NvidiaSmi:
    """GPU UUIDs and supported vGPU types from the ``nvidia-smi`` command.

    Only used where sysfs cannot answer: sysfs knows no GPU UUIDs, and a card whose VFs do
    not exist yet or are all in use lists no creatable types to resolve a profile name by.
    """

    def __init__(self, path: str = DEFAULT_NVIDIA_SMI, timeout: float = 60.0) -> None:
        self.path = path
        self.timeout = timeout
        self._uuids: dict[str, str] | None = None

    def _run(self, *args: str) -> str | None:
        try:
            done = subprocess.run(
                [self.path, *args],
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    def uuid_to_address(self, gpu_uuid: str) -> str | None:
        if self._uuids is None:
            self._uuids = {}
            out = self._run("--query-gpu=pci.bus_id,uuid", "--format=csv,noheader")
            for line in (out or "").splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 2:
                    address, ref = (
                        layout_schema.canonical_pci(parts[0]),
                        layout_schema.canonical_gpu_ref(parts[1]),
                    )
                    if address and ref:
                        self._uuids[ref] = address
        return self._uuids.get(gpu_uuid)

    def supported_vgpu_types(self, address: str) -> dict[str, int]:
        """Profile name -> type ID, from ``nvidia-smi vgpu -s -v -i <address>``."""
        out = self._run("vgpu", "-s", "-v", "-i", address)
        types: dict[str, int] = {}
        type_id: int | None = None
        for line in (out or "").splitlines():
            key, _colon, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "vGPU Type ID":
                try:
                    type_id = int(value, 0)
                except ValueError:
                    type_id = None
            elif key == "Name" and type_id is not None:
                types.setdefault(value, type_id)
                type_id = None
        return types


# --- reading, planning and applying together ---------------------------------------------


def _with_vfs(gpus: Sequence[str], inventory: gpu_sysfs.Inventory) -> set[str]:
    """``gpus`` and the VFs each of them has in ``inventory``."""
    wanted = set(gpus)
    return wanted | {f.address for f in inventory.functions if f.physfn in wanted}


@dataclass
class ApplyResult:
    """What happened: the plan at the start, the steps run, and what is still missing.

    ``before`` and ``after`` summarise the declared GPUs and their VFs (``host_summary``):
    ``before`` from the read the plan came from; ``after`` from the last read of the host,
    or predicted from the plan in check mode. A caller reports its diff from them without
    reading sysfs or resolving GPU UUIDs again. ``inventory_before`` is that first read and
    ``inventory_after`` the last one (in check mode: predicted, with the GPUs it cannot
    foresee in ``unforeseen``); ``users`` names what running VMs use (``read_users``).
    """

    layout: layout_schema.Layout
    plan: layout_plan.Plan
    done: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    remaining: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    check_mode: bool = False
    # Canonical addresses of the declared GPUs, UUIDs resolved.
    gpus: list[str] = field(default_factory=list)
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    inventory_before: gpu_sysfs.Inventory | None = None
    inventory_after: gpu_sysfs.Inventory | None = None
    unforeseen: list[str] = field(default_factory=list)
    users: dict[str, list[str]] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.done) or (self.check_mode and bool(self.plan.steps))

    @property
    def ok(self) -> bool:
        return self.error is None and not self.remaining and not self.plan.refusals

    @property
    def diff(self) -> dict[str, Any]:
        return {"before": self.before, "after": self.after}

    def to_dict(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "ok": self.ok,
            "layout": self.layout.to_dict(),
            "plan": self.plan.to_dict(),
            "done": self.done,
            "skipped": self.skipped,
            "remaining": self.remaining,
            "error": self.error,
        }


def _finish(result: ApplyResult, inventory: gpu_sysfs.Inventory) -> ApplyResult:
    """``result`` with ``after`` read from ``inventory``, VFs the run created included."""
    addresses = set(result.before) | _with_vfs(result.gpus, inventory)
    result.after = layout_predict.host_summary(inventory, sorted(addresses))
    result.inventory_after = inventory
    return result


def apply_layout(
    layout: layout_schema.Layout,
    root: str = "/",
    *,
    force: bool = False,
    check_mode: bool = False,
    drained: bool = False,
    nvidia: layout_resolve.NvidiaSmiLike | None = None,
    sriov_manage: str = layout_apply.DEFAULT_SRIOV_MANAGE,
    writer: layout_apply.SysfsWriter | None = None,
    runner: layout_apply.Runner | None = None,
    retries: int = 5,
    retry_delay: float = 3.0,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] | None = None,
) -> ApplyResult:
    """Validate ``layout`` against the host below ``root``, plan, and (unless check mode) apply.

    Raises :class:`~gpu_layout_schema.LayoutError` when the layout does not fit the host.
    Refusals (changes that need ``force``, and changes to what a running VM uses, named with
    the VM) are reported in ``plan.refusals`` and stop the run before any write. ``drained``:
    every hold on the node has been moved off it, so vGPUs no VM uses may be replaced
    without ``force`` (see ``plan_layout``). Runs in rounds, since VF and mdev steps can
    only be planned once the card is bound and its VFs exist: at most three rounds, then one
    last read tells what is still missing (and what ``after`` shows).
    """
    inventory = read_host(root)
    users = read_users(root, inventory)
    resolved = layout_resolve.resolve_layout(layout, inventory, nvidia)
    plan = layout_plan.plan_layout(resolved, inventory, force, in_use=users, drained=drained)
    gpus = sorted({t.address for t in resolved.targets} | {s.gpu for s in plan.steps})
    result = ApplyResult(
        layout=layout,
        plan=plan,
        check_mode=check_mode,
        gpus=gpus,
        inventory_before=inventory,
        users=users,
    )
    result.before = layout_predict.host_summary(inventory, sorted(_with_vfs(gpus, inventory)))
    if check_mode:
        result.after = layout_predict.predict_summary(result.before, plan)
        result.inventory_after, result.unforeseen = layout_predict.predict_inventory(
            inventory, plan
        )
        return result
    if plan.refusals:
        # Nothing was written: the host still reads as it did.
        result.after = json.loads(json.dumps(result.before))
        result.inventory_after = inventory
        return result
    current = plan
    for _round in range(3):
        try:
            layout_apply.execute_steps(
                current.steps,
                root,
                writer=writer,
                sriov_manage=sriov_manage,
                runner=runner,
                retries=retries,
                retry_delay=retry_delay,
                sleep=sleep,
                log=log,
                done=result.done,
                skipped=result.skipped,
            )
        except layout_apply.ApplyFailed as exc:
            result.error = str(exc)
            return _finish(result, read_host(root))
        if not any(s.action == layout_plan.PENDING for s in current.steps):
            break
        inventory = read_host(root)
        try:
            resolved = layout_resolve.resolve_layout(layout, inventory, nvidia)
        except layout_schema.LayoutError as exc:
            result.error = str(exc)
            return _finish(result, inventory)
        current = layout_plan.plan_layout(resolved, inventory, force, in_use=users, drained=drained)
        if current.refusals:
            result.error = "; ".join(current.refusals)
            return _finish(result, inventory)
    inventory = read_host(root)
    try:
        final = layout_plan.plan_layout(
            layout_resolve.resolve_layout(layout, inventory, nvidia),
            inventory,
            force,
            in_use=users,
            drained=drained,
        )
    except layout_schema.LayoutError as exc:
        result.error = str(exc)
        return _finish(result, inventory)
    skipped_targets = {(s["action"], s["target"]) for s in result.skipped}
    result.remaining = [
        s.to_dict() for s in final.steps if not (s.fill and (s.action, s.target) in skipped_targets)
    ]
    return _finish(result, inventory)


# --- the CLI -----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu_layout.py",
        description="Validate, plan or apply a cozystack.gpu node layout on this host.",
    )
    parser.add_argument("command", choices=("validate", "plan", "apply"))
    parser.add_argument("layout", help="layout file (JSON, or YAML with PyYAML)")
    parser.add_argument("--root", default="/", help="directory holding sys/ (default /)")
    parser.add_argument("--force", action="store_true", help="replace other vGPU types")
    parser.add_argument("--sriov-manage", default=layout_apply.DEFAULT_SRIOV_MANAGE)
    parser.add_argument("--nvidia-smi", default=DEFAULT_NVIDIA_SMI)
    parser.add_argument("--retries", type=int, default=5)
    parser.add_argument("--retry-delay", type=float, default=3.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; returns the exit status (0 ok, 1 apply failed, 2 invalid or refused)."""
    args = _parser().parse_args(argv)

    def emit(data: Mapping[str, Any]) -> None:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")

    def log(message: str) -> None:
        sys.stderr.write(f"gpu_layout: {message}\n")

    try:
        layout = layout_schema.parse_layout(layout_schema.load_layout_file(args.layout))
        if args.command == "validate":
            inventory = read_host(args.root)
            resolved = layout_resolve.resolve_layout(layout, inventory, NvidiaSmi(args.nvidia_smi))
            emit({"ok": True, "layout": layout.to_dict(), "deferred": resolved.deferred})
            return 0
        result = apply_layout(
            layout,
            args.root,
            force=args.force,
            check_mode=args.command == "plan",
            nvidia=NvidiaSmi(args.nvidia_smi),
            sriov_manage=args.sriov_manage,
            retries=args.retries,
            retry_delay=args.retry_delay,
            log=log,
        )
    except layout_schema.LayoutError as exc:
        for problem in exc.problems:
            log(problem)
        emit({"ok": False, "problems": exc.problems})
        return 2
    except OSError as exc:
        log(str(exc))
        emit({"ok": False, "problems": [str(exc)]})
        return 2
    emit(result.to_dict())
    for refusal in result.plan.refusals:
        log(refusal)
    if result.plan.refusals:
        return 2
    if args.command == "plan":
        return 0
    if result.error:
        log(result.error)
    for step in result.remaining:
        log(f"not in place: {step['action']} {step['target']} ({step['reason']})")
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
