"""Claim status writes: a placement decision, and a note that only tells."""

from __future__ import annotations

import itertools
import json
import logging
from abc import abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from cozystack_gpu import keys, metrics
from cozystack_gpu.binder.calls import base
from cozystack_gpu.binder.calls.base import (
    Answer,
    Call,
    CallKey,
    Clients,
    Heard,
    Outcome,
    Priority,
    claims_of,
    describe,
    refused_and_read_again,
    status_of,
)
from cozystack_gpu.cluster.informer import LIST_TIMEOUT_S, slim
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.leader import Term
from cozystack_gpu.model import ClaimKey
from cozystack_gpu.objects import MutableObj

log = logging.getLogger(__name__)


_unversioned = itertools.count(1)


def fenced(body: MutableObj, term: Term | None) -> MutableObj:
    """``body`` carrying this leader's fencing token in ``status.writer``: its term of the
    Lease, and the claim version the body was built on.

    A write can reach the API server long after it was sent: a partition holds it in the
    network, and no deadline the write carries counts that time. The claim-fence policy
    (chart ``claim-fence-policy.yaml``) refuses a write whose token is new on the claim and
    names a term that is not the Lease's: the late write of a leader that has been
    overtaken. ``basedOn`` makes every token new (a write is built on the claim's current
    version, the token on the claim came from an earlier one), so a write of an old term
    never passes as one that left the token alone, as the VMI webhook's attachments do."""
    if term is None:
        return body
    based_on = str((body.get("metadata") or {}).get("resourceVersion") or "")
    token = {
        "holder": term.holder,
        "term": term.transitions,
        "basedOn": based_on or f"unversioned-{next(_unversioned)}",
    }
    status = {**(body.get("status") or {}), keys.CLAIM_STATUS_WRITER: token}
    return {**body, "status": status}


@dataclass(frozen=True)
class _ClaimStatus(Call):
    """A status merge patch of a claim, carrying the resourceVersion its body was built on:
    a claim changed since answers 409, and the fresh claim comes back to be judged again."""

    takes: ClassVar[keys.ApiKind] = keys.GPU_CLAIM  # written, or as it is now after a refusal
    namespace: str
    name: str
    body: MutableObj

    @property
    def claim(self) -> ClaimKey:
        return ClaimKey(self.namespace, self.name)

    @property
    @abstractmethod
    def label(self) -> str:
        """The purpose in metrics and logs."""

    def request(self, api: Clients) -> MutableObj:
        metrics.STATUS_WRITES.labels(self.label).inc()
        response = api.custom.patch_namespaced_custom_object_status(
            *claims_of(self.namespace),
            self.name,
            fenced(self.body, api.term()),
            _preload_content=False,
            _request_timeout=base.REQUEST_TIMEOUT_S,
        )
        return dict(json.loads(response.data))

    def refused(self, exc: Exception, api: Clients) -> Answer:
        def read() -> object:
            return api.custom.get_namespaced_custom_object(
                *claims_of(self.namespace), self.name, _request_timeout=base.REQUEST_TIMEOUT_S
            )

        return refused_and_read_again(self, exc, read, self.label)


@dataclass(frozen=True)
class Decision(_ClaimStatus):
    """A placement (bind, move, lose, rebind, attach, detach, a rejected node): recorded in
    the snapshot when sent, and the claim held in flight until it is answered."""

    what: ClassVar[str] = "claim-decision"
    priority: ClassVar[Priority] = Priority.BIND
    step: str = ""
    heard: Heard | None = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        return self.step

    def apply(self, answer: Answer, view: ClusterView) -> None:
        super().apply(answer, view)
        if answer.outcome is Outcome.GONE:
            view.forget(keys.GPU_CLAIM.kind, self.claim)
        view.dirty.claims.add(self.claim)  # judged again on what the API now holds


@dataclass(frozen=True)
class ClaimRead(Call):
    """A claim read again after a placement write whose answer was lost, when the read
    that follows a failure failed too (the server was away). The write may have landed,
    so the claim stays held as decided, its units counted, until this read (or the watch)
    says what the API holds; it is then judged again on that."""

    what: ClassVar[str] = "claim-read"
    priority: ClassVar[Priority] = Priority.BIND
    takes: ClassVar[keys.ApiKind] = keys.GPU_CLAIM

    namespace: str
    name: str

    @property
    def claim(self) -> ClaimKey:
        return ClaimKey(self.namespace, self.name)

    def request(self, api: Clients) -> MutableObj:
        return dict(
            api.custom.get_namespaced_custom_object(
                *claims_of(self.namespace), self.name, _request_timeout=base.REQUEST_TIMEOUT_S
            )
        )

    def refused(self, exc: Exception, api: Clients) -> Answer:
        if status_of(exc) == 404:
            return Answer(self, Outcome.GONE)
        return Answer(self, Outcome.FAILED, error=describe(exc))

    def apply(self, answer: Answer, view: ClusterView) -> None:
        super().apply(answer, view)
        if answer.outcome is Outcome.GONE:
            view.forget(keys.GPU_CLAIM.kind, self.claim)
        view.dirty.claims.add(self.claim)


@dataclass(frozen=True)
class ClaimListing(Call):
    """Every claim, listed afresh when this replica starts to lead: nothing is decided until
    it is in the view.

    A standby's view lags whenever its watches do: broken by a restart of etcd or the API
    server and still listing again, it held 34 of 59 claims when it won the Lease. Every
    write of the leader before it has landed by then (``DeadlineApiClient``), so a listing
    sent after the takeover holds all of them: budgets and capacity are judged with every
    hold, not only those the watch had brought. A leader's own later holds are its own
    decisions, already in its snapshot when sent."""

    what: ClassVar[str] = "claim-listing"
    priority: ClassVar[Priority] = Priority.BIND
    term: int  # the term of leading it was sent for: only that term's listing counts
    namespace: str = ""
    name: str = ""

    def request(self, api: Clients) -> MutableObj:
        response = api.custom.list_cluster_custom_object(
            keys.GPU_CLAIM.group,
            keys.GPU_CLAIM.version,
            keys.GPU_CLAIM.plural,
            _preload_content=False,
            _request_timeout=LIST_TIMEOUT_S,
        )
        return dict(json.loads(response.data))

    def apply(self, answer: Answer, view: ClusterView) -> None:
        if answer.obj is None:
            return
        items = answer.obj.get("items") or []
        for item in items:
            item.setdefault("kind", keys.GPU_CLAIM.kind)
            slim(item)
        version = (answer.obj.get("metadata") or {}).get("resourceVersion")
        view.relist(keys.GPU_CLAIM.kind, items, int(version or 0))


class Note(StrEnum):
    """Status writes that only tell: not placements, so queued behind every bind and never
    held in flight."""

    WAIT = "Wait"  # why an order waits
    DELETING = "Deleting"  # why a claim's deletion waits
    PLACED = "Placed"  # where a VM's set starts, or why it cannot
    WITHDRAWN = "Withdrawn"  # its class is being deleted
    MIGRATION = "Migration"  # why a live migration's target waits


@dataclass(frozen=True)
class ClaimNote(_ClaimStatus):
    """A condition that tells; a newer one of the same note on the claim replaces one
    still queued (it was built on a claim version the older would have changed)."""

    what: ClassVar[str] = "claim-note"
    priority: ClassVar[Priority] = Priority.STATUS
    supersedes: ClassVar[bool] = True
    note: Note = Note.WAIT
    heard: Heard | None = field(default=None, compare=False, repr=False)

    @property
    def key(self) -> CallKey:
        return (f"{self.what}/{self.note}", self.namespace, self.name)

    @property
    def label(self) -> str:
        return self.note.value
