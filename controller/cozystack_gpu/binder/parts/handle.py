"""What the binder hands its parts (the gate, the reports, attachments, waiting notes): a
narrow handle, not the binder.

A part reads the cluster view (``ViewReader``, the reading half of ``ClusterView``), the
snapshot, the settings and the clock, and writes only by handing typed calls
(``binder.calls``) to ``send``, or to ``decide`` for a placement, which records it in the
snapshot and sends it in one step and refuses a claim whose placement write is still out.
The loop applies every answer to the view; a part never holds an API client. A part can be
tested against a fake handle that records the calls (tests/unit/binder/test_parts_handle.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.base import Call, CallKey
from cozystack_gpu.binder.calls.claims import Decision
from cozystack_gpu.binder.rules import gate
from cozystack_gpu.cluster.dra_index import DraIndex
from cozystack_gpu.cluster.migration_index import MigrationIndex
from cozystack_gpu.cluster.reservation_index import ReservationIndex
from cozystack_gpu.cluster.view import Key
from cozystack_gpu.config import Config
from cozystack_gpu.model import ClaimInfo, ClaimKey, NodeInfo, Snapshot
from cozystack_gpu.objects import MutableObj, translate, vmi_pods
from cozystack_gpu.objects.translate import VMIState


class ViewReader(Protocol):
    """The cluster view as a part may use it: reads only."""

    @property
    def gpu_names(self) -> frozenset[str]: ...

    @property
    def reservations(self) -> ReservationIndex: ...

    @property
    def migrations(self) -> MigrationIndex: ...

    @property
    def dra(self) -> DraIndex: ...

    @property
    def node_labels_version(self) -> int: ...

    def node(self, name: str) -> MutableObj | None: ...
    def gpunode(self, name: str) -> MutableObj | None: ...
    def nodes(self) -> Iterable[MutableObj]: ...
    def node_names(self) -> set[str]: ...
    def usage_records(self) -> Mapping[Key, MutableObj]: ...
    def claim(self, key: ClaimKey) -> MutableObj | None: ...
    def claims(self) -> Iterator[tuple[ClaimKey, MutableObj]]: ...
    def classes(self) -> Iterable[MutableObj]: ...
    def gpu_class(self, name: str) -> MutableObj | None: ...
    def inventory_stale(self, name: str) -> bool: ...
    def pod(self, key: Key) -> MutableObj | None: ...
    def vmi_object(self, key: Key) -> MutableObj | None: ...
    def pvc(self, namespace: str, name: str) -> MutableObj | None: ...
    def pv(self, name: str) -> MutableObj | None: ...
    def storage_class(self, name: str) -> MutableObj | None: ...
    def launcher_pod(self, vmi: Key, uid: str) -> Key | None: ...
    def migration_target(self, vmi: Key, uid: str, migration: str) -> Key | None: ...
    def gated_pods(self) -> list[Key]: ...
    def pinned_pods(self) -> list[Key]: ...
    def vmi(self, key: Key) -> VMIState | None: ...
    def attachment_seen_at(self, key: ClaimKey, now: float) -> float | None: ...
    def attached_vmi(self, key: ClaimKey) -> VMIState | None: ...
    def vmi_uid_exists(self, namespace: str, uid: str) -> bool: ...
    def template_owner_live(self, key: ClaimKey) -> bool: ...
    def holding_vmis(self) -> list[VMIState]: ...
    def attachments(self) -> list[tuple[Key, frozenset[ClaimKey]]]: ...
    def claim_info(self, key: ClaimKey, now: float) -> ClaimInfo | None: ...
    def node_info(self, name: str) -> NodeInfo | None: ...


class PartHandle(Protocol):
    """The binder as its parts see it."""

    @property
    def view(self) -> ViewReader: ...

    @property
    def snapshot(self) -> Snapshot: ...  # rebuilt on a fresh listing: read it each time

    @property
    def config(self) -> Config: ...

    def clock(self) -> float: ...

    def in_flight(self, keys: Iterable[ClaimKey]) -> bool:
        """Whether a placement write about any of these claims is still out."""

    def vacated_in_flight(self, node: str | None) -> bool:
        """Whether a decision taking a claim off ``node`` is still out: what it left there
        is placed into only once it is answered (``decide`` records it)."""

    def decide(self, claim: ClaimInfo, call: Decision) -> bool:
        """Record ``claim`` as decided in the snapshot and send ``call``, its status write;
        False, and nothing done, while a placement write of the claim is out."""

    def send(self, call: Call) -> None:
        """Send any other write."""

    def writing(self, key: CallKey) -> bool:
        """Whether a call of this key is out (sent and not answered)."""

    def event(
        self,
        obj: MutableObj,
        reason: str,
        message: str,
        warning: bool,
        kind: keys.ApiKind = keys.GPU_CLAIM,
    ) -> None:
        """An Event for people about ``obj`` (a claim unless ``kind`` says otherwise); a
        repeat raises the count of the Event already written (``events``)."""


class BinderPart:
    def __init__(self, handle: PartHandle) -> None:
        self.handle = handle

    @property
    def view(self) -> ViewReader:
        return self.handle.view

    @property
    def snapshot(self) -> Snapshot:
        return self.handle.snapshot

    @property
    def config(self) -> Config:
        return self.handle.config


class StartSet(NamedTuple):
    """A launcher pod, the VMI it starts and the keys of the VMI's claims."""

    pod_key: Key
    pod: dict[str, Any]
    vmi_key: Key
    vmi: dict[str, Any]
    members: list[ClaimKey]


def start_set(view: ViewReader, pod_key: Key, pod: dict[str, Any]) -> StartSet | None:
    """The VMI a launcher pod starts and the keys of its claims (held ones and those of
    its claim templates), or None when the pod is not one of ours."""
    vmi_name = vmi_pods.owning_vmi(pod)
    if vmi_name is None:
        return None
    vmi_key = (translate.namespace_of(pod), vmi_name)
    vmi = view.vmi_object(vmi_key)
    if vmi is None or translate.meta(vmi).get("uid") != vmi_pods.owning_vmi_uid(pod):
        return None  # not seen yet, or the view still has an earlier VMI of that name
    return StartSet(pod_key, pod, vmi_key, vmi, gate.claim_keys(vmi_key, vmi))
