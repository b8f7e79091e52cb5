"""Where VMs' disks are, as the cluster view indexes it: each VM's PVC names, the VMs that
use each PVC, and the PVCs bound to each PV.

A binding or a PV's node affinity changes where a VM's volumes can be used, and so where
its claims may go: the index answers which VMs such a change touches, and the view reads
their claims into the model again. The PVs themselves stay in the view; the index reads
them through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cozystack_gpu.model import VolumeAffinity
from cozystack_gpu.objects import MutableObj, volumes

Key = tuple[str, str]  # (namespace, name), as the view keys objects


class VolumeIndex:
    """VMs' PVCs, the PVCs' VMs and PVs, and the volumes' node affinity of each VM."""

    def __init__(self, pv: Callable[[str], MutableObj | None]) -> None:
        self._pv = pv
        self._vm_pvcs: dict[Key, tuple[str, ...]] = {}
        self._pvc_vms: dict[Key, set[Key]] = {}
        self._pvc_pv: dict[Key, str] = {}
        self._pv_pvcs: dict[str, set[Key]] = {}

    def on_vm(self, key: Key, new: MutableObj | None) -> None:
        for name in self._vm_pvcs.pop(key, ()):
            _unindex(self._pvc_vms, (key[0], name), key)
        pvcs = volumes.vm_volume_claims(new) if new is not None else ()
        if pvcs:
            self._vm_pvcs[key] = pvcs
            for name in pvcs:
                self._pvc_vms.setdefault((key[0], name), set()).add(key)

    def on_pvc(self, key: Key, new: MutableObj | None) -> set[Key]:
        """Index the PVC's binding; the VMs using it when the PV it is bound to changed."""
        before = self._pvc_pv.pop(key, None)
        if before is not None:
            _unindex(self._pv_pvcs, before, key)
        volume = volumes.pvc_volume_name(new) if new is not None else None
        if volume is not None:
            self._pvc_pv[key] = volume
            self._pv_pvcs.setdefault(volume, set()).add(key)
        return self._vms_using({key}) if before != volume else set()

    def on_pv(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> set[Key]:
        """The VMs using the PV when its node affinity changed."""
        old_affinity = volumes.volume_affinity(old) if old is not None else None
        new_affinity = volumes.volume_affinity(new) if new is not None else None
        if old_affinity == new_affinity:
            return set()
        return self._vms_using(self._pv_pvcs.get(key[1], set()))

    def vm_volumes(self, vm: Key) -> tuple[VolumeAffinity, ...]:
        """The node affinity of each bound PV among a VirtualMachine's volumes."""
        found = []
        for name in self._vm_pvcs.get(vm, ()):
            volume = self._pvc_pv.get((vm[0], name))
            pv = self._pv(volume) if volume is not None else None
            affinity = volumes.volume_affinity(pv) if pv is not None else None
            if affinity is not None:
                found.append(affinity)
        return tuple(found)

    def _vms_using(self, pvcs: set[Key]) -> set[Key]:
        return {vm for pvc in pvcs for vm in self._pvc_vms.get(pvc, ())}


def _unindex(table: dict[Any, set[Key]], key: Any, item: Key) -> None:
    members = table.get(key)
    if members is not None:
        members.discard(item)
        if not members:
            del table[key]
