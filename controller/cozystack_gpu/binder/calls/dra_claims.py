"""The writes on a claim's ResourceClaim (SPEC §13, ``rules.dra_claims``): made, reserved
for the claim (or its entry taken out), deleted. Each answer's object is taken into the
view, so the part judges the next step on what the API server holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from cozystack_gpu import keys
from cozystack_gpu.binder.calls import base
from cozystack_gpu.binder.calls.base import Answer, Call, Clients, Heard, Priority
from cozystack_gpu.objects import MutableObj

_RC = (keys.RESOURCE_CLAIM.group, keys.RESOURCE_CLAIM.version)


@dataclass(frozen=True)
class ResourceClaimCreate(Call):
    """The claim's ResourceClaim made. One made before (409) is brought by the watch.
    Sent behind the binds, as a usage record is: a burst of orders is bound first; a VM
    started meanwhile waits in kube-scheduler until the ResourceClaim its pod names exists."""

    what: ClassVar[str] = "resourceclaim"
    priority: ClassVar[Priority] = Priority.RECORD
    done_when: ClassVar[frozenset[int]] = frozenset({409})
    unwritten: ClassVar[str] = "ResourceClaim %s not created"
    takes: ClassVar[keys.ApiKind] = keys.RESOURCE_CLAIM
    namespace: str
    name: str
    body: MutableObj
    heard: Heard | None = field(default=None, compare=False, repr=False)

    def request(self, api: Clients) -> MutableObj:
        return dict(
            api.custom.create_namespaced_custom_object(
                *_RC, self.namespace, keys.RESOURCE_CLAIM.plural, self.body,
                _request_timeout=base.REQUEST_TIMEOUT_S,
            )
        )  # fmt: skip


@dataclass(frozen=True)
class ResourceClaimReservation(Call):
    """The ResourceClaim's ``status.reservedFor`` as ``body`` gives it (the claim's entry in
    or out), over the version read: a conflict is read again and judged again."""

    what: ClassVar[str] = "resourceclaim"
    priority: ClassVar[Priority] = Priority.BIND
    takes: ClassVar[keys.ApiKind] = keys.RESOURCE_CLAIM
    namespace: str
    name: str
    body: MutableObj
    heard: Heard | None = field(default=None, compare=False, repr=False)

    def request(self, api: Clients) -> MutableObj | Answer:
        try:
            return dict(
                api.custom.patch_namespaced_custom_object_status(
                    *_RC, self.namespace, keys.RESOURCE_CLAIM.plural, self.name, self.body,
                    _request_timeout=base.REQUEST_TIMEOUT_S,
                )
            )  # fmt: skip
        except Exception as exc:  # read again, as a claim status write is
            return base.refused_and_read_again(
                self,
                exc,
                lambda: api.custom.get_namespaced_custom_object(
                    *_RC, self.namespace, keys.RESOURCE_CLAIM.plural, self.name
                ),
                "reservedFor",
            )


@dataclass(frozen=True)
class ResourceClaimDelete(Call):
    """The ResourceClaim deleted, only the very one judged (its uid as a precondition)."""

    what: ClassVar[str] = "resourceclaim"
    priority: ClassVar[Priority] = Priority.BIND
    done_when: ClassVar[frozenset[int]] = frozenset({404})
    unwritten: ClassVar[str] = "ResourceClaim %s not deleted"
    namespace: str
    name: str
    uid: str
    heard: Heard | None = field(default=None, compare=False, repr=False)

    def request(self, api: Clients) -> None:
        api.custom.delete_namespaced_custom_object(
            *_RC, self.namespace, keys.RESOURCE_CLAIM.plural, self.name,
            body={"preconditions": {"uid": self.uid}},
            _request_timeout=base.REQUEST_TIMEOUT_S,
        )  # fmt: skip
