"""The cluster view's live migrations: KubeVirt's ``VirtualMachineInstanceMigration``
objects, by uid (the ``kubevirt.io/migrationJobUID`` label of a target pod names it) and
those still open (SPEC §12).

The binder places a migration's target as soon as it sees the migration, before
virt-controller renders the target pod, so the pod is pinned in one update when it comes;
and a target recorded on claims is kept only while its migration is open.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cozystack_gpu.objects import MutableObj, launcher
from cozystack_gpu.objects.translate import meta

Key = tuple[str, str]


class MigrationIndex:
    def __init__(self, raw: Callable[[], Mapping[Key, MutableObj]]) -> None:
        self._raw = raw
        self._by_uid: dict[str, Key] = {}
        self._open: set[Key] = set()
        # Opened or changed since the leader last looked (``take_fresh``): a turn's
        # catch-up places their targets ahead without walking every open migration.
        self._fresh: set[Key] = set()

    def on_event(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        if old is not None and self._by_uid.get(_uid(old)) == key:
            del self._by_uid[_uid(old)]
        self._open.discard(key)
        self._fresh.discard(key)
        if new is not None:
            self._by_uid[_uid(new)] = key
            if launcher.migration_open(new):
                self._open.add(key)
                self._fresh.add(key)

    def open(self) -> list[Key]:
        """The migrations not finished, failed or being deleted, in a stable order."""
        return sorted(self._open)

    def take_fresh(self) -> list[Key]:
        """The open migrations that came in or changed since the last call, in a stable
        order; each is handed out once."""
        fresh, self._fresh = sorted(self._fresh), set()
        return fresh

    def get(self, key: Key) -> MutableObj | None:
        return self._raw().get(key)

    def by_uid(self, uid: str) -> MutableObj | None:
        key = self._by_uid.get(uid)
        return self._raw().get(key) if key is not None else None


def _uid(obj: MutableObj) -> str:
    return str(meta(obj).get("uid") or "")
