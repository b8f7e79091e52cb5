"""Each claim of a ``dra`` class gets its ResourceClaim (SPEC §13): made once the claim is
held, reserved for the claim once kube-scheduler has allocated it at the VM's first start,
let go when the claim is held elsewhere, its entry taken out when the claim is deleted
(``rules.dra_claims`` says which step; ``calls.dra_claims`` writes it).

The part looks at a claim when the view saw it or its ResourceClaim change (the view marks
the claim dirty for either), and again when the answer to its write comes, whatever the
answer changed; on taking over it looks at every claim once. One write per ResourceClaim is
out at a time, and a claim whose write is out is not looked at until it is answered: during
a burst thousands of creates wait behind the binds, and walking them every turn was most of
the leader's time. The binder never writes an allocation: kube-scheduler does, on the node
the launcher pod is pinned to.
"""

from __future__ import annotations

from collections.abc import Iterable

from cozystack_gpu.binder.calls.base import Answer
from cozystack_gpu.binder.calls.dra_claims import (
    ResourceClaimCreate,
    ResourceClaimDelete,
    ResourceClaimReservation,
)
from cozystack_gpu.binder.parts.handle import BinderPart, PartHandle
from cozystack_gpu.binder.rules.dra_claims import Step, next_step, reserved_for_with
from cozystack_gpu.keys import EventReason
from cozystack_gpu.model import ClaimKey
from cozystack_gpu.objects import MutableObj, dra, translate


class DraClaims(BinderPart):
    def __init__(self, handle: PartHandle) -> None:
        super().__init__(handle)
        # The claims to look at, in the order they came (a dict keeps it: the same turn
        # sends the same writes in the same order).
        self._work: dict[ClaimKey, None] = {}
        self._seen_all = False

    def took_over(self) -> None:
        self._seen_all = False

    def changed(self, claims: Iterable[ClaimKey]) -> None:
        self._work.update(dict.fromkeys(claims))

    def run(self) -> None:
        if self.config.dra != "true":
            return  # no ResourceClaim is read, so none is written
        if not self._seen_all:
            self._seen_all = True
            self._work.update(dict.fromkeys(key for key, _obj in self.view.claims()))
        work, self._work = self._work, {}
        for key in work:
            # One whose write is out is looked at again on the answer (``_heard``).
            if not self.handle.writing((ResourceClaimCreate.what, key.namespace, key.name)):
                self._step(key)

    def _heard(self, answer: Answer) -> None:
        call = answer.call
        self._work[ClaimKey(call.namespace, call.name)] = None

    def _step(self, key: ClaimKey) -> None:
        """Send the claim's next step, if it needs one now."""
        claim = self.view.claim(key)
        class_name = str(((claim or {}).get("spec") or {}).get("class") or "")
        gpu_class = self.view.gpu_class(class_name) if class_name else None
        source = dra.dra_source(gpu_class) if gpu_class is not None else None
        resource_claim = self.view.dra.resource_claim(key)
        step = next_step(claim, source, resource_claim)
        if step is Step.NONE:
            return
        if claim is None or source is None:
            if resource_claim is not None and step is Step.RELEASE:  # its claim is gone
                self._reserve(key, resource_claim, None, listed=False)
            return
        if step is Step.CREATE:
            body = dra.resource_claim_for(claim, source)
            self.handle.send(ResourceClaimCreate(*key, body, heard=self._heard))
        elif step is Step.NAME_TAKEN:
            words = (
                f"ResourceClaim {key.namespace}/{key.name} was not made by the controller for "
                "this claim: its VM cannot start on the class's devices until it is deleted"
            )
            self.handle.event(claim, EventReason.RESOURCE_CLAIM_TAKEN.value, words, True)
        elif resource_claim is not None and step in (Step.RESERVE, Step.RELEASE):
            self._reserve(key, resource_claim, claim, listed=step is Step.RESERVE)
        elif resource_claim is not None and step is Step.DELETE:
            uid = str(translate.meta(resource_claim).get("uid") or "")
            self.handle.send(ResourceClaimDelete(*key, uid, heard=self._heard))

    def _reserve(
        self, key: ClaimKey, resource_claim: MutableObj, claim: MutableObj | None, *, listed: bool
    ) -> None:
        """The claim's entry put in or taken out of the ResourceClaim's ``reservedFor``."""
        consumers = reserved_for_with(resource_claim, claim, listed)
        version = translate.meta(resource_claim).get("resourceVersion")
        body = {"metadata": {"resourceVersion": version}, "status": {"reservedFor": consumers}}
        self.handle.send(ResourceClaimReservation(*key, body, heard=self._heard))
