"""The GPUClaim and GPUClass webhooks' work.

Claims are judged against this replica's snapshot (``feed``); a refusal that only a lagging
snapshot could give (the class is missing from it) is checked against the API server before
it is told. An order this replica cannot judge (before its first listing, or of a class its
view has not caught up with) is refused with 503 and "try again", never admitted unchecked.
Classes are few and written rarely: the shared-resource-name rule reads them
all from the API server, so two classes applied one after the other are judged against
each other; two applied at the same moment are the binder's to settle.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cozystack_gpu.admission import claim_rules
from cozystack_gpu.admission.access import ApiAccess
from cozystack_gpu.admission.errors import Refused
from cozystack_gpu.admission.feed import SnapshotFeed
from cozystack_gpu.class_rules import resource_name_conflicts
from cozystack_gpu.keys import AdmissionReason
from cozystack_gpu.model import Reason, Refusal
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.translate import meta

# How long an order of a class the API server has but this replica's view lacks waits for
# the view to catch up (a class created moments ago) before it is refused, retryably.
CLASS_LAG_WAIT_S = 2.0
CLASS_LAG_POLL_S = 0.05
# Refusals that only a replica behind the cluster gives: 503, so a client reads "try again".
RETRY_CODE = 503

NOT_SYNCED = (
    "this controller replica is starting and has not finished reading the cluster, so it "
    "cannot check the order against budgets and capacity yet; try again in a few seconds"
)


def class_not_seen(class_name: str) -> str:
    return (
        f"this controller replica has not seen GPUClass {class_name} yet (it was created "
        "moments ago), so it cannot check the order against budgets and capacity; try again "
        "in a few seconds"
    )


class ClaimWebhook:
    def __init__(self, feed: SnapshotFeed, access: ApiAccess, clock: Callable[[], float]) -> None:
        self.feed = feed
        self.access = access
        self.clock = clock

    def admit_create(self, claim: Obj) -> list[str]:
        """Warnings for the client; ``Refused`` when the order does not fit, or retryably
        when this replica cannot judge it yet."""
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
        # Never admitted unchecked: an order this replica cannot judge yet could take a
        # budget's last unit beside another, so it is refused with "try again" (the
        # replica is not ready meanwhile, and the webhook Service sends orders elsewhere).
        if not self.feed.synced.is_set():
            raise Refused(NOT_SYNCED, AdmissionReason.REPLICA_NOT_SYNCED, RETRY_CODE)
        refusal = self._judge(claim)
        if refusal is None:
            return []
        if refusal.reason is Reason.CLASS_MISSING:
            class_name = str((claim.get("spec") or {}).get("class", ""))
            if class_name in self.access.classes(latest=True):
                refusal = self._judge_once_seen(claim, class_name)
                if refusal is None:
                    return []
        raise Refused(refusal.message, refusal.reason)

    def _judge(self, claim: Obj) -> Refusal | None:
        now = self.clock()
        refusal: Refusal | None = self.feed.read(
            lambda snap: claim_rules.order_refusal(snap, claim, now)
        )
        return refusal

    def _judge_once_seen(self, claim: Obj, class_name: str) -> Refusal | None:
        """The order judged once this replica's view has the class the API server has;
        refused retryably if the view does not catch up within ``CLASS_LAG_WAIT_S``."""
        deadline = time.monotonic() + CLASS_LAG_WAIT_S
        while not self.feed.read(lambda snap: snap.gpu_class(class_name) is not None):
            if time.monotonic() >= deadline:
                raise Refused(
                    class_not_seen(class_name), AdmissionReason.REPLICA_NOT_SYNCED, RETRY_CODE
                )
            time.sleep(CLASS_LAG_POLL_S)
        return self._judge(claim)

    def admit_update(self, old: Obj, new: Obj) -> None:
        problem = claim_rules.update_refusal(old, new)
        if problem is not None:
            raise Refused(*problem)


class ClassWebhook:
    def __init__(self, access: ApiAccess) -> None:
        self.access = access

    def admit(self, gpu_class: Obj) -> None:
        """Refuse a class that shares a resource name with a stored class on overlapping
        nodes. Nothing is written: two classes created at the same moment through two
        replicas are each admitted before the other is stored, and the binder settles them
        (``class_rules.shadowing_class``: the newer takes no orders while the older
        exists), so a review from anyone but the API server changes nothing."""
        name = str(meta(gpu_class).get("name", ""))
        spec = gpu_class.get("spec") or {}
        classes = self.access.classes(latest=True)
        others = [(n, obj.get("spec") or {}) for n, obj in classes.items()]
        conflicts = resource_name_conflicts(name, spec, others)
        if conflicts:
            raise Refused(
                "; ".join(c.message(name) for c in conflicts),
                AdmissionReason.RESOURCE_NAME_SHARED,
            )
