"""The GPUClaim and GPUClass webhooks' work.

Claims are judged against this replica's snapshot (``feed``); a refusal that only a lagging
snapshot could give (the class is missing from it) is checked against the API server before
it is told. Classes are few and written rarely: the shared-resource-name rule reads them
all from the API server, so two classes applied one after the other are judged against
each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cozystack_gpu.admission import claim_rules
from cozystack_gpu.admission.access import ApiAccess
from cozystack_gpu.admission.errors import Refused
from cozystack_gpu.admission.feed import SnapshotFeed
from cozystack_gpu.binder.translate import meta
from cozystack_gpu.class_rules import resource_name_conflicts
from cozystack_gpu.keys import AdmissionReason
from cozystack_gpu.model import Reason, Refusal

Obj = Mapping[str, Any]


def unchecked(why: str) -> str:
    """The warning of an order admitted without the create-time check."""
    return (
        f"{why}, so the order was not checked against budgets and capacity now; the binder "
        "judges it, and it waits Pending with its reason if it does not fit"
    )


NOT_SYNCED = unchecked("this controller replica has not finished reading the cluster")


class ClaimWebhook:
    def __init__(self, feed: SnapshotFeed, access: ApiAccess, clock: Callable[[], float]) -> None:
        self.feed = feed
        self.access = access
        self.clock = clock

    def admit_create(self, claim: Obj) -> list[str]:
        """Warnings for the client; ``Refused`` when the order does not fit."""
        if claim_rules.is_template(claim):
            problem = claim_rules.template_refusal(claim)
            if problem is not None:
                raise Refused(problem, AdmissionReason.TEMPLATE_LABEL_MISUSED)
            return []
        if self.feed.failure is not None:
            raise Refused(
                "GPUClaim orders cannot be checked on this controller replica: its watch "
                f"feed stopped ({self.feed.failure})",
                AdmissionReason.REPLICA_CANNOT_CHECK,
                500,
            )
        now = self.clock()
        refusal: Refusal | None = self.feed.read(
            lambda snap: claim_rules.order_refusal(snap, claim, now)
        )
        if not self.feed.synced.is_set():
            return [NOT_SYNCED]
        if refusal is None:
            return []
        if refusal.reason is Reason.CLASS_MISSING:
            class_name = str((claim.get("spec") or {}).get("class", ""))
            if class_name in self.access.classes(latest=True):
                return [unchecked(f"this controller replica has not seen class {class_name} yet")]
        raise Refused(refusal.message, refusal.reason)

    def admit_update(self, old: Obj, new: Obj) -> None:
        problem = claim_rules.update_refusal(old, new)
        if problem is not None:
            raise Refused(*problem)


class ClassWebhook:
    def __init__(self, access: ApiAccess) -> None:
        self.access = access

    def admit(self, gpu_class: Obj) -> None:
        name = str(meta(gpu_class).get("name", ""))
        classes = self.access.classes(latest=True)
        others = [(n, obj.get("spec") or {}) for n, obj in classes.items()]
        conflicts = resource_name_conflicts(name, gpu_class.get("spec") or {}, others)
        if conflicts:
            raise Refused(
                "; ".join(c.message(name) for c in conflicts), AdmissionReason.RESOURCE_NAME_SHARED
            )
