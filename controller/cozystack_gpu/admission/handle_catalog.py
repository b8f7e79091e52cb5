"""The GPUClaim and GPUClass webhooks' work.

Claims are judged against this replica's snapshot (``feed``); a refusal that only a lagging
snapshot could give (the class is missing from it) is checked against the API server before
it is told. An order this replica cannot judge (before its first listing, or of a class its
view has not caught up with) is refused with 503 and "try again", never admitted unchecked.
Classes are few and written rarely: the shared-resource-name rule reads them
all from the API server, so two classes applied one after the other are judged against
each other.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kubernetes.client.rest import ApiException

from cozystack_gpu.admission import claim_rules
from cozystack_gpu.admission.access import ApiAccess
from cozystack_gpu.admission.errors import Refused
from cozystack_gpu.admission.feed import SnapshotFeed
from cozystack_gpu.class_rules import (
    recent_admissions,
    resource_name_conflicts,
    resource_name_of,
    with_admission,
)
from cozystack_gpu.keys import AdmissionReason
from cozystack_gpu.model import Reason, Refusal
from cozystack_gpu.model.reservations import BookingSettings
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.translate import meta

ADMISSION_ATTEMPTS = 3
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
    """Orders (GPUClaim) and bookings (GPUReservation), judged at create time."""

    def __init__(
        self,
        feed: SnapshotFeed,
        access: ApiAccess,
        clock: Callable[[], float],
        settings: BookingSettings | None = None,
    ) -> None:
        self.feed = feed
        self.access = access
        self.clock = clock
        self.settings = settings or BookingSettings()

    def admit_create(self, claim: Obj) -> list[str]:
        """Warnings for the client; ``Refused`` when the order does not fit, or retryably
        when this replica cannot judge it yet."""
        if claim_rules.is_template(claim):
            problem = claim_rules.template_refusal(claim)
            if problem is not None:
                raise Refused(problem, AdmissionReason.TEMPLATE_LABEL_MISUSED)
            return []
        if claim_rules.has_window_label(claim):
            problem = claim_rules.window_label_refusal(claim)
            if problem is not None:
                raise Refused(problem, AdmissionReason.WINDOW_LABEL_MISUSED)
            return []
        self._judge_create(claim, self._judge)
        return []

    def _judge_create(self, obj: Obj, judge: Callable[[Obj], Refusal | None]) -> None:
        """An order or a booking judged on this replica's snapshot: refused retryably
        while it cannot judge, and with the model's words when it does not fit."""
        if self.feed.failure is not None:
            raise Refused(
                "GPUClaim orders and GPUReservation bookings cannot be checked on this "
                f"controller replica: its watch feed stopped ({self.feed.failure})",
                AdmissionReason.REPLICA_CANNOT_CHECK,
                500,
            )
        # Never admitted unchecked: an order this replica cannot judge yet could take a
        # budget's last unit beside another, so it is refused with "try again" (the
        # replica is not ready meanwhile, and the webhook Service sends orders elsewhere).
        if not self.feed.synced.is_set():
            raise Refused(NOT_SYNCED, AdmissionReason.REPLICA_NOT_SYNCED, RETRY_CODE)
        refusal = judge(obj)
        if refusal is None:
            return
        if refusal.reason is Reason.CLASS_MISSING:
            class_name = str((obj.get("spec") or {}).get("class", ""))
            if class_name in self.access.classes(latest=True):
                refusal = self._judge_once_seen(obj, class_name, judge)
                if refusal is None:
                    return
        raise Refused(refusal.message, refusal.reason)

    def admit_reservation(self, reservation: Obj) -> None:
        """``Refused`` when the window does not fit (SPEC §11: the earliest window that
        would is named), or retryably when this replica cannot judge it yet; the same
        checks as an order's, over the window."""
        problem = claim_rules.unreadable_window(reservation)
        if problem is not None:
            raise Refused(problem, AdmissionReason.WINDOW_UNREADABLE, 400)
        self._judge_create(reservation, self._judge_booking)

    def _judge_booking(self, reservation: Obj) -> Refusal | None:
        now = self.clock()
        refusal: Refusal | None = self.feed.read(
            lambda snap: claim_rules.booking_refusal(snap, reservation, now, self.settings)
        )
        return refusal

    def _judge(self, claim: Obj) -> Refusal | None:
        now = self.clock()
        refusal: Refusal | None = self.feed.read(
            lambda snap: claim_rules.order_refusal(snap, claim, now)
        )
        return refusal

    def _judge_once_seen(
        self, claim: Obj, class_name: str, judge: Callable[[Obj], Refusal | None]
    ) -> Refusal | None:
        """The order judged once this replica's view has the class the API server has;
        refused retryably if the view does not catch up within ``CLASS_LAG_WAIT_S``."""
        deadline = time.monotonic() + CLASS_LAG_WAIT_S
        while not self.feed.read(lambda snap: snap.gpu_class(class_name) is not None):
            if time.monotonic() >= deadline:
                raise Refused(
                    class_not_seen(class_name), AdmissionReason.REPLICA_NOT_SYNCED, RETRY_CODE
                )
            time.sleep(CLASS_LAG_POLL_S)
        return judge(claim)

    def admit_update(self, old: Obj, new: Obj) -> None:
        problem = claim_rules.update_refusal(old, new)
        if problem is not None:
            raise Refused(*problem)


class ClassWebhook:
    def __init__(self, access: ApiAccess, clock: Callable[[], float] = time.time) -> None:
        self.access = access
        self.clock = clock

    def admit(self, gpu_class: Obj, *, dry_run: bool = False) -> None:
        """Refuse a class that shares a resource name with another on overlapping nodes.

        A class being created is stored only after every webhook answered, so two created
        at once (through two replicas) would each pass against a listing without the other.
        Each admission therefore also judges the classes admitted moments before, as recorded
        in the admissions ConfigMap, and records itself there with the resourceVersion it
        read: of two racing admissions one writes first, and the other, answered 409, reads
        again and sees it.
        """
        name = str(meta(gpu_class).get("name", ""))
        spec = gpu_class.get("spec") or {}
        for _attempt in range(ADMISSION_ATTEMPTS):
            classes = self.access.classes(latest=True)
            record, version = self.access.class_admissions()
            now = self.clock()
            others = [(n, obj.get("spec") or {}) for n, obj in classes.items()]
            others += recent_admissions(record, now, classes)
            conflicts = resource_name_conflicts(name, spec, others)
            if conflicts:
                raise Refused(
                    "; ".join(c.message(name) for c in conflicts),
                    AdmissionReason.RESOURCE_NAME_SHARED,
                )
            if dry_run or resource_name_of(spec) is None:
                return
            try:
                self.access.write_class_admissions(with_admission(record, name, spec, now), version)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
        raise Refused(
            f"GPUClass {name} could not be judged against the classes admitted at the same "
            f"time ({ADMISSION_ATTEMPTS} tries); try again",
            AdmissionReason.RESOURCE_NAME_SHARED,
            409,
        )
