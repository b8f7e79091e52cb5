"""The start path's writes on other objects: the launcher pod's pin and delete, a VMI's
template claims and a window's claim made and deleted, a VMI that can never run deleted,
and a VM halted at its window's end."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar

from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.binder.calls import base
from cozystack_gpu.binder.calls.base import (
    Call,
    Clients,
    Heard,
    Priority,
    claims_of,
    discard,
)
from cozystack_gpu.objects import MutableObj

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodPin(Call):
    """The launcher pod's one update: pinned to the set's node and ungated (or only
    ungated), as a merge patch."""

    what: ClassVar[str] = "pod"
    priority: ClassVar[Priority] = Priority.BIND
    unwritten: ClassVar[str] = "launcher pod %s not updated"
    takes: ClassVar[keys.ApiKind] = keys.POD
    namespace: str
    name: str
    body: MutableObj

    def request(self, api: Clients) -> MutableObj:
        return dict(
            api.core.patch_namespaced_pod(
                self.name,
                self.namespace,
                self.body,
                _content_type="application/merge-patch+json",
                _preload_content=False,
                _request_timeout=base.REQUEST_TIMEOUT_S,
            ).json()
        )


@dataclass(frozen=True)
class PodDelete(Call):
    """A pinned launcher pod its node refused, deleted: only the very pod judged (its uid
    as a precondition); one gone or replaced since (404, 409) is as good."""

    what: ClassVar[str] = "pod"  # one update of a pod at a time, pin or delete
    priority: ClassVar[Priority] = Priority.BIND
    done_when: ClassVar[frozenset[int]] = frozenset({404, 409})
    unwritten: ClassVar[str] = "launcher pod %s not deleted"
    namespace: str
    name: str
    uid: str | None

    def request(self, api: Clients) -> None:
        discard(
            api.core.delete_namespaced_pod(
                self.name,
                self.namespace,
                body={"preconditions": {"uid": self.uid}},
                _preload_content=False,
                _request_timeout=base.REQUEST_TIMEOUT_S,
            )
        )


@dataclass(frozen=True)
class ClaimCreate(Call):
    """A claim the controller makes: a VMI's template claim, or a reservation's at its
    window's start. One created before (409) is brought by the watch. One the API server
    refuses as invalid is told to its sender (``heard``), which sends it no more."""

    what: ClassVar[str] = "claim-create"
    priority: ClassVar[Priority] = Priority.BIND
    done_when: ClassVar[frozenset[int]] = frozenset({409})
    unwritten: ClassVar[str] = "claim %s not created"
    takes: ClassVar[keys.ApiKind] = keys.GPU_CLAIM
    namespace: str
    name: str
    body: MutableObj
    heard: Heard | None = field(default=None, compare=False, repr=False)

    def request(self, api: Clients) -> MutableObj:
        return dict(
            api.custom.create_namespaced_custom_object(
                *claims_of(self.namespace), self.body, _request_timeout=base.REQUEST_TIMEOUT_S
            )
        )


# --- deletes of what is left over -------------------------------------------------------


@dataclass(frozen=True)
class VmiDelete(Call):
    """A VMI pinned to a node that is gone before it ever ran: deleted, the VM starts
    again elsewhere."""

    what: ClassVar[str] = "vmi-delete"
    priority: ClassVar[Priority] = Priority.BIND
    done_when: ClassVar[frozenset[int]] = frozenset({404})
    namespace: str
    name: str
    heard: Heard | None = field(default=None, compare=False, repr=False)

    def request(self, api: Clients) -> None:
        api.custom.delete_namespaced_custom_object(
            keys.VMI.group,
            keys.VMI.version,
            self.namespace,
            keys.VMI.plural,
            self.name,
            _request_timeout=base.REQUEST_TIMEOUT_S,
        )
        log.info("deleted VMI %s: its node is gone and it never ran", self.path)


@dataclass(frozen=True)
class ClaimDelete(Call):
    """A template claim whose VMI is gone, or a window's claim at its end, deleted: only
    the very one judged (its uid as a precondition), so a claim of the same name made
    since is not touched."""

    what: ClassVar[str] = "claim-delete"
    priority: ClassVar[Priority] = Priority.BIND
    done_when: ClassVar[frozenset[int]] = frozenset({404})
    unwritten: ClassVar[str] = "claim %s not deleted"
    namespace: str
    name: str
    uid: str
    why: str
    heard: Heard | None = field(default=None, compare=False, repr=False)

    def request(self, api: Clients) -> None:
        api.custom.delete_namespaced_custom_object(
            *claims_of(self.namespace),
            self.name,
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=self.uid)),
            _request_timeout=base.REQUEST_TIMEOUT_S,
        )
        log.info("deleted GPUClaim %s: %s", self.path, self.why)


@dataclass(frozen=True)
class VmHalt(Call):
    """A VirtualMachine whose window ended, halted: ``runStrategy: Halted`` as a merge patch
    (the controller's one right on VMs). One gone meanwhile (404) is as good."""

    what: ClassVar[str] = "vm-halt"
    priority: ClassVar[Priority] = Priority.BIND
    done_when: ClassVar[frozenset[int]] = frozenset({404})
    unwritten: ClassVar[str] = "VM %s not halted"
    namespace: str
    name: str
    body: MutableObj

    def request(self, api: Clients) -> None:
        discard(
            api.custom.patch_namespaced_custom_object(
                keys.VM.group,
                keys.VM.version,
                self.namespace,
                keys.VM.plural,
                self.name,
                self.body,
                _preload_content=False,
                _request_timeout=base.REQUEST_TIMEOUT_S,
            )
        )
        log.info("halted VM %s: its reservation's window ended", self.path)
