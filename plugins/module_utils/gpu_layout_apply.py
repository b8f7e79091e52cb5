# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Running a node layout's steps on the host: sysfs writes and ``sriov-manage``, each verified.

Every step is read, compared, written and read back: a write the kernel or the vGPU driver
did not take is an :class:`ApplyFailed` naming the step and what sysfs shows, never a silent
success. ``sriov-manage -e`` is retried and judged by ``sriov_numvfs`` alone, since it can
exit 0 without creating any VF. Nothing here resets a GPU, disables VFs or reboots. The
steps come from ``gpu_layout_plan.py``; ``gpu_layout.py`` runs them in rounds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gpu_layout_plan as layout_plan
    import gpu_layout_resolve as layout_resolve
    import gpu_sysfs
else:
    try:
        from ansible_collections.cozystack.gpu.plugins.module_utils import (
            gpu_layout_plan as layout_plan,
        )
        from ansible_collections.cozystack.gpu.plugins.module_utils import (
            gpu_layout_resolve as layout_resolve,
        )
        from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_sysfs
    except ImportError:  # run as a script (python3 -I too), next to its sibling files
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpu_layout_plan as layout_plan
        import gpu_layout_resolve as layout_resolve
        import gpu_sysfs

__all__ = [
    "DEFAULT_SRIOV_MANAGE",
    "ApplyFailed",
    "Runner",
    "SysfsWriter",
    "execute_steps",
]

DEFAULT_SRIOV_MANAGE = "/usr/lib/nvidia/sriov-manage"


class ApplyFailed(Exception):
    """A step that did not take effect; the message names the step and what sysfs shows."""


Runner = Callable[[Sequence[str]], "tuple[int, str]"]


def _run_command(argv: Sequence[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, str(exc)
    return done.returncode, (done.stdout + done.stderr).strip()


class SysfsWriter:
    """Writes below the root. Tests subclass it to play the kernel's part on a fixture tree."""

    def __init__(self, root: str) -> None:
        self.root = root

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def write(self, path: str, value: str) -> None:
        with open(path, "w", encoding="ascii") as handle:
            handle.write(value)


def _device_path(writer: SysfsWriter, address: str, *parts: str) -> str:
    return writer.path(gpu_sysfs.PCI_DEVICES_DIR, address, *parts)


class _Applier:
    def __init__(
        self,
        root: str,
        writer: SysfsWriter,
        sriov_manage: str,
        runner: Runner,
        retries: int,
        retry_delay: float,
        sleep: Callable[[float], None],
        log: Callable[[str], None],
    ) -> None:
        self.root = root
        self.writer = writer
        self.sriov_manage = sriov_manage
        self.runner = runner
        self.retries = max(retries, 1)
        self.retry_delay = retry_delay
        self.sleep = sleep
        self.log = log
        # Every executable action and its handler, spelled out so grep finds the path.
        self.handlers: dict[str, Callable[[layout_plan.Step], str | None]] = {
            layout_plan.BIND_VFIO: self._bind_vfio,
            layout_plan.BIND_NVIDIA: self._bind_nvidia,
            layout_plan.ENABLE_VFS: self._enable_vfs,
            layout_plan.REMOVE_MDEV: self._remove_mdev,
            layout_plan.CLEAR_VGPU_TYPE: self._clear_vgpu_type,
            layout_plan.SET_VGPU_TYPE: self._set_vgpu_type,
            layout_plan.CREATE_MDEV: self._create_mdev,
        }

    def function(self, address: str) -> gpu_sysfs.GpuFunction:
        function = gpu_sysfs.read_function(self.root, address)
        if function is None:
            raise ApplyFailed(f"{address} is gone from sysfs")
        return function

    def run(self, step: layout_plan.Step) -> str | None:
        """Run one step; a string back means it was skipped for that reason."""
        handler = self.handlers.get(step.action)
        if handler is None:
            raise ApplyFailed(f"unknown step action {step.action!r}")
        return handler(step)

    def _bind(self, step: layout_plan.Step, driver: str, override: str) -> None:
        current = self.function(step.target)
        if current.driver == driver:
            return
        if driver == layout_plan.VFIO_DRIVER:
            pf_inventory = {current.address: current}
            for vf_address in current.sriov.vfs if current.sriov else []:
                vf = gpu_sysfs.read_function(self.root, vf_address)
                if vf is not None:
                    pf_inventory[vf_address] = vf
            live = layout_resolve.live_vgpus(pf_inventory, current)
            if live:
                raise ApplyFailed(
                    f"{step.target} carries live vGPUs ({', '.join(live)}); not unbinding it"
                )
        self.writer.write(_device_path(self.writer, step.target, "driver_override"), override)
        if current.driver is not None:
            self.writer.write(
                _device_path(self.writer, step.target, "driver", "unbind"), step.target
            )
        self.writer.write(self.writer.path("sys/bus/pci/drivers_probe"), step.target)
        after = self.function(step.target).driver
        if after != driver:
            raise ApplyFailed(
                f"{step.target}: still bound to {after or 'no driver'} after binding to {driver}"
            )

    def _bind_vfio(self, step: layout_plan.Step) -> None:
        self._bind(step, layout_plan.VFIO_DRIVER, layout_plan.VFIO_DRIVER)

    def _bind_nvidia(self, step: layout_plan.Step) -> None:
        # An empty line clears driver_override, so the device matches nvidia by its ID again.
        self._bind(step, layout_plan.NVIDIA_DRIVER, "\n")

    def _enable_vfs(self, step: layout_plan.Step) -> str | None:
        output = ""
        for attempt in range(1, self.retries + 1):
            before = self.function(step.target)
            if before.sriov is not None and (before.sriov.num_vfs or 0) > 0:
                return None if attempt > 1 else "VFs already enabled"
            code, output = self.runner([self.sriov_manage, "-e", step.target])
            after = self.function(step.target)
            # Judged by sriov_numvfs only: sriov-manage can exit 0 without creating VFs.
            if after.sriov is not None and (after.sriov.num_vfs or 0) > 0:
                return None
            self.log(
                f"{step.target}: sriov-manage -e attempt {attempt}/{self.retries} exited"
                f" {code}, sriov_numvfs is still 0: {output}"
            )
            if attempt < self.retries:
                self.sleep(self.retry_delay)
        raise ApplyFailed(
            f"{step.target}: no VFs after {self.retries} sriov-manage -e attempts"
            f" (sriov_numvfs 0); last output: {output or '(none)'}"
        )

    def _type_file(self, address: str) -> str:
        return _device_path(self.writer, address, "nvidia", "current_vgpu_type")

    def _write_type(self, address: str, type_id: int) -> None:
        self.writer.write(self._type_file(address), f"{type_id}\n")
        now = layout_resolve.current_type(self.function(address))
        if now != type_id:
            raise ApplyFailed(f"{address}: current_vgpu_type reads {now} after writing {type_id}")

    def _clear_vgpu_type(self, step: layout_plan.Step) -> str | None:
        if layout_resolve.current_type(self.function(step.target)) == 0:
            return "already clear"
        self._write_type(step.target, 0)
        return None

    def _set_vgpu_type(self, step: layout_plan.Step) -> str | None:
        if step.type_id is None:
            raise ApplyFailed("a set_vgpu_type step without a type ID")
        vf = self.function(step.target)
        current = layout_resolve.current_type(vf)
        if current == step.type_id:
            return "already set"
        if current and current != step.old_type_id:
            raise ApplyFailed(
                f"{step.target}: carries type {current} now, not {step.old_type_id or 0} as"
                " planned; not changing it"
            )
        if current:
            self._write_type(step.target, 0)
            vf = self.function(step.target)
        if step.type_id not in layout_resolve.creatable_ids(vf):
            if step.fill:
                return f"card full: {step.profile} no longer creatable on this VF"
            raise ApplyFailed(
                f"{step.target}: {step.profile} ({step.type_id}) is not creatable on this VF"
                " (the card has no room left for it)"
            )
        self._write_type(step.target, step.type_id)
        return None

    def _create_mdev(self, step: layout_plan.Step) -> str | None:
        if step.mdev_type is None or step.mdev_uuid is None:
            raise ApplyFailed("a create_mdev step without type or UUID")
        parent = self.function(step.target)
        if any(m.uuid == step.mdev_uuid for m in parent.mdevs):
            return "already present"
        mtype = next((t for t in parent.mdev_types if t.type_id == step.mdev_type), None)
        if mtype is None or (mtype.available_instances or 0) < 1:
            if step.fill:
                return f"card full: no {step.profile} instance available"
            raise ApplyFailed(f"{step.target}: no instance of {step.profile} available")
        self.writer.write(
            _device_path(
                self.writer,
                step.target,
                "mdev_supported_types",
                step.mdev_type,
                "create",
            ),
            step.mdev_uuid,
        )
        if not os.path.exists(self.writer.path(gpu_sysfs.MDEV_DEVICES_DIR, step.mdev_uuid)):
            raise ApplyFailed(f"{step.target}: mdev {step.mdev_uuid} missing after create")
        return None

    def _remove_mdev(self, step: layout_plan.Step) -> str | None:
        if step.mdev_uuid is None:
            raise ApplyFailed("a remove_mdev step without a UUID")
        base = self.writer.path(gpu_sysfs.MDEV_DEVICES_DIR, step.mdev_uuid)
        if not os.path.exists(base):
            return "already gone"
        self.writer.write(os.path.join(base, "remove"), "1")
        if os.path.exists(base):
            raise ApplyFailed(f"mdev {step.mdev_uuid} still present after remove")
        return None


def execute_steps(
    steps: Sequence[layout_plan.Step],
    root: str = "/",
    *,
    writer: SysfsWriter | None = None,
    sriov_manage: str = DEFAULT_SRIOV_MANAGE,
    runner: Runner | None = None,
    retries: int = 5,
    retry_delay: float = 3.0,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] | None = None,
    done: list[dict[str, Any]] | None = None,
    skipped: list[dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``steps`` in order; ``(done, skipped)``, appended to the lists given, if any.

    Raises :class:`ApplyFailed` at the first step that does not take effect; the steps
    before it stay done (and are in ``done``).
    """
    applier = _Applier(
        root=root,
        writer=writer or SysfsWriter(root),
        sriov_manage=sriov_manage,
        runner=runner or _run_command,
        retries=retries,
        retry_delay=retry_delay,
        sleep=sleep,
        log=log or (lambda message: None),
    )
    done = [] if done is None else done
    skipped = [] if skipped is None else skipped
    for step in steps:
        if step.action == layout_plan.PENDING:
            continue
        try:
            reason = applier.run(step)
        except (OSError, ApplyFailed) as exc:
            message = str(exc)
            where = (
                step.action if message.startswith(step.target) else f"{step.action} {step.target}"
            )
            raise ApplyFailed(f"{where}: {message}") from exc
        if reason:
            skipped.append({**step.to_dict(), "skipped": reason})
        else:
            done.append(step.to_dict())
    return done, skipped
