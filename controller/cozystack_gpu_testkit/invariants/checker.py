"""``Invariants``: the rules (those of every look, the start path's, those of a settled
cluster), the looks (``check``, ``settled``, ``wait_settled``) and ``watching``, which looks
in a thread and follows every version of every claim (see the package docstring)."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.binder.rules import records
from cozystack_gpu.cluster.informer import Event, EventType, Informer, source
from cozystack_gpu.objects import MutableObj, dra
from cozystack_gpu.objects.launcher import raw_usage
from cozystack_gpu.objects.translate import vmi_state, whole_quantity
from cozystack_gpu_testkit.invariants.reading import (
    HOLDING,
    _ancestors,
    _bound_reason,
    _budget_key,
    _claims_request,
    _class_resource,
    _count,
    _dra_capacity,
    _foreign_template,
    _name,
    _namespace,
    _node_ready,
    _owner_ref,
    _owning_vmi,
    _raw_pods,
    _resource_name,
    _running_since,
    _running_vmis,
    _template,
    _uncovered_launcher_usage,
    required_pins,
)
from cozystack_gpu_testkit.invariants.state import (
    ATTACHED_MOVED,
    BOUND_TWICE,
    BUDGET,
    CAPACITY,
    DRA_NOT_FOLLOWED,
    FOREIGN_TEMPLATE,
    NOT_ATTACHED,
    NOT_JUDGED,
    POD_ELSEWHERE,
    RECORDS,
    SERVES_TWO,
    UNPINNED,
    UNPROTECTED,
    WINDOW_NOT_KEPT,
    Scope,
    State,
    Violation,
    _meta,
    read_state,
)
from cozystack_gpu_testkit.invariants.windows import (
    WINDOW_RECORDED,
    _billed_window,
    _booked_budgets,
    _claim_holds,
    _open_windows,
    _owner_uid,
    _window,
    _windows,
)

log = logging.getLogger(__name__)


# Bound-condition reasons of a decision that gives a claim another node (or boundAt).
MOVED_BY_DECISION = frozenset(
    r.value for r in (keys.ClaimReason.MOVED, keys.ClaimReason.REBOUND, keys.ClaimReason.REATTACHED)
)
# Leader writes that follow a start or a node's return (template attachment, finalizer)
# get this long; a leader killed in between takes its Lease and a sync to come back.
START_GRACE_S = 15.0
# A node that loses a unit (a GPU gone from allocatable) while claims hold it all is the
# hardware's doing; a claim bound there later than this after the loss is the binder's.
CAPACITY_LOSS_GRACE_S = 3.0
# The field that records the attached VMI's uid (issue 18, item 3); until it exists a
# claim without it is judged by name alone.
ATTACHED_TO_UID = "attachedToUID"


@dataclass
class _Seen:
    """What the history rules remember of one claim (by uid)."""

    name: str
    node: str | None = None
    bound_at: str | None = None
    attached: tuple[str, str] | None = None  # (VMI, node) while attached
    # The attachment's VMI was seen placed on its node (its launcher pod bound there, or
    # the VMI reporting the node): from then on the VM may run there.
    started: bool = False
    # The node a live migration's target was recorded on (SPEC §12): the one node an
    # attached claim may move to, when its VM lands there.
    migrating_to: str | None = None


class Invariants:
    """Looks at the cluster and says what breaks a rule; remembers claims between looks."""

    def __init__(
        self,
        api: client.ApiClient,
        scope: Scope | None = None,
        *,
        start_grace_s: float = START_GRACE_S,
    ) -> None:
        self.api = api
        self.scope = scope or Scope()
        self.start_grace_s = start_grace_s
        self.looks = 0
        self.checks = 0  # rule evaluations, summed over every look
        self.seen: list[Violation] = []  # every distinct violation of any look
        # node: when it last lost a unit, and when it got it back (epoch; None: not yet)
        self._capacity_lost: dict[str, tuple[float, float | None]] = {}
        self.moves = 0  # claims seen on another node by a decision (packing, rebinds)
        # launcher pods pinned to a node their finished VMI's claims have since left: the
        # claims were detached at the VMI's end and may move (SPEC §5); not a violation
        self.pins_left_after_the_end: set[str] = set()
        self._history: dict[str, _Seen] = {}
        self._lock = threading.Lock()

    # --- looking -------------------------------------------------------------------------

    def check(self, state: State | None = None) -> list[Violation]:
        """The rules that hold at every moment, on ``state`` or a fresh read."""
        state = state or read_state(self.api)
        with self._lock:
            found = [
                *self._capacity(state),
                *self._budgets(state),
                *self._history_rules(state),
                *self._pods(state),
                *self._start_path(state),
                *self._pins(state),
            ]
            self._remember(found)
            self.looks += 1
        return found

    def settled(self, state: State | None = None) -> list[Violation]:
        """Every rule, the eventual ones included: for a cluster with nothing in flight."""
        state = state or read_state(self.api)
        found = self.check(state)
        with self._lock:
            eventual = [
                *self._judged(state),
                *self._records(state),
                *self._windows_kept(state),
                *self._dra_followed(state),
            ]
            found += eventual
        return found

    def wait_settled(self, timeout: float, interval: float = 1.0) -> list[Violation]:
        """Looks until every rule holds or ``timeout`` passes; the last look's violations
        (empty when it settled). A look the API server does not answer is tried again."""
        deadline = time.monotonic() + timeout
        last: list[Violation] = [Violation("look", "cluster", "no look answered yet")]
        while True:
            try:
                last = self.settled()
            except Exception as exc:  # the server may still be coming back
                last = [Violation("look", "cluster", f"{type(exc).__name__}: {exc}")]
            if not last or time.monotonic() >= deadline:
                return last
            time.sleep(interval)

    @contextmanager
    def watching(self, interval: float = 1.0) -> Iterator[Invariants]:
        """Looks every ``interval`` seconds in a thread while the block runs; violations
        collect in ``seen``. Looks the API server does not answer (a fault) are skipped."""
        stop = threading.Event()
        versions: queue.Queue[Event] = queue.Queue()
        # Every version of every claim, so a move is seen as the decision that made it even
        # when the claim is attached before the next look.
        claims = Informer(self.api, source(self.api, keys.GPU_CLAIM), versions, stop)

        def run() -> None:
            next_look = time.monotonic() + interval
            while not stop.is_set():
                try:
                    event = versions.get(timeout=max(0.0, next_look - time.monotonic()))
                except queue.Empty:
                    next_look = time.monotonic() + interval
                    try:
                        self.check()
                    except Exception as exc:  # the server is away: look again later
                        log.debug("invariant look skipped: %s", exc)
                    continue
                with self._lock:
                    changed = event.objects if event.type is EventType.LISTED else (event.obj,)
                    self._remember(v for obj in changed if obj for v in self._version(obj))

        thread = threading.Thread(target=run, name="invariants", daemon=True)
        claims.start()
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            claims.join(10)
            thread.join(30)

    def _remember(self, found: Iterable[Violation]) -> None:
        known = {(v.rule, v.subject) for v in self.seen}
        for violation in found:
            if (violation.rule, violation.subject) not in known:
                known.add((violation.rule, violation.subject))
                self.seen.append(violation)
                log.error("invariant broken: %s", violation)

    def capacity_lost(self, node: str) -> None:
        """The node is about to lose a unit by a test's hand: until it is back, the claims
        bound there before the loss (and ``CAPACITY_LOSS_GRACE_S`` after it) may hold more
        than it has without the binder having placed them wrongly."""
        with self._lock:
            self._capacity_lost[node] = (time.time(), None)

    def capacity_restored(self, node: str) -> None:
        """The unit is back: a look read from now on is judged without the loss; one read
        before (the watching thread's, judged a moment later) still with it."""
        with self._lock:
            lost = self._capacity_lost.get(node)
            if lost is not None and lost[1] is None:
                self._capacity_lost[node] = (lost[0], time.time())

    # --- rules at every look -------------------------------------------------------------

    def _capacity(self, state: State) -> Iterator[Violation]:
        resource_of = {_name(c): _class_resource(c) for c in state.classes}
        held: dict[tuple[str, str], int] = {}
        # What holds each node's units, for the violation's detail.
        holders: dict[tuple[str, str], list[str]] = {}

        # The latest boundAt of the claims holding each node (inf: a pod holds some, or a
        # claim with no boundAt), for a node that lost a unit under them.
        latest_bind: dict[tuple[str, str], float] = {}

        def add(
            node: str, resource: str, units: int, who: str = "", bound_at: float | None = None
        ) -> None:
            held[(node, resource)] = held.get((node, resource), 0) + units
            holders.setdefault((node, resource), []).append(f"{who} {units}")
            when = float("inf") if bound_at is None else bound_at
            latest_bind[(node, resource)] = max(latest_bind.get((node, resource), 0.0), when)

        # A window's end is the leader's to write, as a start's attachment is: the same grace.
        window_claims = _claim_holds(state, resource_of, add, holders, self.start_grace_s)
        gpu_names = set(resource_of.values())
        for pod in _raw_pods(state):
            usage = raw_usage(pod)
            if usage is None or usage.node is None:
                continue
            for resource, units in usage.requests.items():
                if resource in gpu_names:
                    add(usage.node, resource, units, f"raw pod {_namespace(pod)}/{_name(pod)}")
        for pod_name, usage in _uncovered_launcher_usage(state, resource_of):
            for resource, units in usage.requests.items():
                if resource in gpu_names and usage.node is not None:
                    add(usage.node, resource, units, f"uncovered launcher {pod_name}")
        # Booked windows: the units they hold at their busiest moment from now on count as
        # held (SPEC §11: no order, and no other booking, may leave a window short).
        windows = _windows(state, resource_of, window_claims)
        for (node_name, resource), (peak, who, booked_at) in windows.items():
            add(node_name, resource, peak, who, booked_at)
        devices = {_name(g): (g.get("status") or {}).get("devices") or [] for g in state.gpunodes}
        dra_capacity = _dra_capacity(state)
        for node in state.nodes:
            if not self.scope.has_node(node):
                continue
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            for resource in sorted(gpu_names):
                self.checks += 1
                units = held.get((_name(node), resource), 0)
                if not units:
                    continue
                if _resource_name(resource):
                    reported = sum(
                        int(d.get("allocatable") or 0)
                        for d in devices.get(_name(node), [])
                        if d.get("resourceName") == resource
                    )
                    capacity = min(reported, whole_quantity(allocatable.get(resource, 0)) or 0)
                else:  # a dra class: the devices of the node's slices it matches
                    capacity = dra_capacity.get((_name(node), resource), 0)
                lost_at, back_at = self._capacity_lost.get(_name(node), (None, None))
                if back_at is not None and state.read_at >= back_at:
                    lost_at = None  # read with the unit back
                if units > capacity and (
                    lost_at is None
                    or latest_bind[(_name(node), resource)] > lost_at + CAPACITY_LOSS_GRACE_S
                ):
                    detail = f"{units} units held on a node that has {capacity}: " + "; ".join(
                        holders.get((_name(node), resource), [])
                    )
                    yield Violation(CAPACITY, f"{_name(node)}/{resource}", detail)

    def _budgets(self, state: State) -> Iterator[Violation]:
        ancestors = {_name(ns): _ancestors(ns) for ns in state.namespaces}
        resource_of = {_name(c): _class_resource(c) for c in state.classes}
        gpu_names = set(resource_of.values())
        used: dict[tuple[str, str], int] = {}

        def charge(namespace: str, budget_keys: Iterable[str], units: int) -> None:
            for tenant in ancestors.get(namespace, frozenset({namespace})):
                for key in budget_keys:
                    used[(tenant, key)] = used.get((tenant, key), 0) + units

        # The claim an Active window made counts until the window's end (SPEC §11).
        open_windows = _open_windows(state, self.start_grace_s)
        window_claims: list[tuple[MutableObj, float]] = []
        for claim in state.claims:
            phase = (claim.get("status") or {}).get("phase")
            if phase not in (*HOLDING, "Lost"):
                continue
            end = open_windows.get(_owner_uid(claim, keys.KIND_RESERVATION) or "")
            if end is not None and phase in HOLDING:
                window_claims.append((claim, end))
                continue
            class_name = str((claim.get("spec") or {}).get("class"))
            charged = [keys.QUOTA_KEY_TOTAL, keys.quota_key(class_name)]
            resource = resource_of.get(class_name, "")
            if _resource_name(resource):
                charged += keys.raw_quota_keys(resource)
            charge(_namespace(claim), charged, _count(claim))
        for pod in _raw_pods(state):
            usage = raw_usage(pod)
            if usage is None:
                continue
            for resource, units in usage.requests.items():
                if resource in gpu_names:
                    charge(usage.namespace, keys.raw_quota_keys(resource), units)
        # Windows booked (or Lost, still counted) hold their units under every key at their
        # busiest moment from now on.
        booked = _booked_budgets(state, ancestors, resource_of, window_claims)
        for (tenant, key), peak in booked.items():
            used[(tenant, key)] = used.get((tenant, key), 0) + peak
        for quota in state.quotas:
            tenant = _namespace(quota)
            if not self.scope.has_namespace(tenant):
                continue
            for key, value in ((quota.get("spec") or {}).get("hard") or {}).items():
                limit = whole_quantity(value)
                if limit is None or not _budget_key(key, gpu_names):
                    continue
                self.checks += 1
                if used.get((tenant, key), 0) > limit:
                    detail = f"{used[(tenant, key)]} units counted against a limit of {limit}"
                    yield Violation(BUDGET, f"{tenant}/{key}", detail)

    def _history_rules(self, state: State) -> Iterator[Violation]:
        placed = {
            (str((_owner_ref(pod, "VirtualMachineInstance") or {}).get("uid")), node)
            for pod in state.pods
            if (node := (pod.get("spec") or {}).get("nodeName"))
        } | {
            (str(_meta(vmi).get("uid")), node)
            for vmi in state.vmis
            if (node := (vmi.get("status") or {}).get("nodeName"))
        }
        for claim in state.claims:
            status = claim.get("status") or {}
            seen = self._history.get(str(_meta(claim).get("uid")))
            uid, node = status.get(ATTACHED_TO_UID), status.get("nodeName")
            if seen is not None and seen.attached is not None and (str(uid), node) in placed:
                seen.started = seen.started or seen.attached[1] == node
            yield from self._version(claim)

    def _version(self, claim: MutableObj) -> Iterator[Violation]:
        """One version of a claim, against what earlier versions showed (call under the
        lock). A claim that holds a node keeps it and its ``boundAt`` unless a decision
        says it moved (Moved, Rebound, Reattached); one that shows a new node as a fresh
        "Bound" was bound twice. An attached claim keeps its node whatever it says."""
        if not self.scope.has_namespace(_namespace(claim)):
            return
        self.checks += 1
        status = claim.get("status") or {}
        node, phase = status.get("nodeName") or None, status.get("phase")
        uid = str(_meta(claim).get("uid"))
        seen = self._history.setdefault(uid, _Seen(f"{_namespace(claim)}/{_name(claim)}"))
        if phase in HOLDING and node:
            bound_at = status.get("boundAt")
            if seen.node is not None and (node, bound_at) != (seen.node, seen.bound_at):
                reason = _bound_reason(status)
                if reason in MOVED_BY_DECISION:
                    self.moves += 1
                elif reason == keys.ClaimReason.BOUND.value:
                    detail = (
                        f"bound to {seen.node} at {seen.bound_at}, "
                        f"then bound again to {node} at {bound_at}"
                    )
                    yield Violation(BOUND_TWICE, seen.name, detail)
                else:  # moved, then told something else before this look: a move
                    self.moves += 1
            seen.node, seen.bound_at = node, bound_at
        vmi = status.get("attachedTo")
        # Every VMI of a VM has the VM's name: once claims record the VMI's uid, another
        # uid under the same name is another attachment.
        if vmi and status.get(ATTACHED_TO_UID):
            vmi = f"{vmi} (uid {status[ATTACHED_TO_UID]})"
        target = (status.get("migration") or {}).get("node")
        if phase == "Attached" and vmi and node:
            if seen.attached is None or seen.attached[0] != vmi:
                seen.attached, seen.started = (str(vmi), str(node)), False
            elif seen.attached[1] != node and seen.migrating_to == node:
                # Its VM live-migrated there, the target recorded first: the hold followed.
                seen.attached = (str(vmi), str(node))
                self.moves += 1
            elif seen.attached[1] != node and seen.started:
                detail = f"attached to VMI {vmi} on {seen.attached[1]}, now on {node}"
                yield Violation(ATTACHED_MOVED, seen.name, detail)
            elif seen.attached[1] != node:
                # A starting VM's set placed again before its VMI was placed anywhere (a
                # cordon between the bind and the pin): the gate's to do, nothing ran there.
                seen.attached = (str(vmi), str(node))
                self.moves += 1
        elif not vmi:
            seen.attached, seen.started = None, False
        seen.migrating_to = str(target) if target else None

    def _pods(self, state: State) -> Iterator[Violation]:
        """A launcher pod the scheduler placed sits where its VMI's claims are."""
        nodes_of: dict[tuple[str, str], set[str]] = {}
        for claim in state.claims:
            status = claim.get("status") or {}
            if status.get("attachedTo") and status.get("phase") in HOLDING:
                vmi_key = (_namespace(claim), str(status["attachedTo"]))
                nodes_of.setdefault(vmi_key, set()).add(str(status.get("nodeName")))
        moving = _migrating(state)
        for pod in state.pods:
            node = (pod.get("spec") or {}).get("nodeName")
            owner = _owning_vmi(pod)
            if not node or owner is None or not self.scope.has_namespace(_namespace(pod)):
                continue
            claim_nodes = nodes_of.get((_namespace(pod), owner))
            if not claim_nodes or _in_migration(pod, moving):
                continue
            self.checks += 1
            if claim_nodes != {node}:
                detail = f"on {node}, its claims on {', '.join(sorted(claim_nodes))}"
                yield Violation(POD_ELSEWHERE, f"{_namespace(pod)}/{_name(pod)}", detail)

    # --- the start path ------------------------------------------------------------------

    def _start_path(self, state: State) -> Iterator[Violation]:
        """Every running VMI's claims are Attached to it and protected; the template claims
        it uses are its own; no claim serves two running VMIs."""
        claims = {(_namespace(c), _name(c)): c for c in state.claims}
        nodes = {_name(n): n for n in state.nodes}
        users: dict[tuple[str, str], list[str]] = {}
        for vmi, node in _running_vmis(state):
            namespace, name = _namespace(vmi), _name(vmi)
            if not self.scope.has_namespace(namespace):
                continue
            request = _claims_request(vmi)
            if request is None:
                continue
            since = _running_since(vmi)
            ready, ready_since = _node_ready(nodes.get(node))
            settling = max(since or 0.0, ready_since or 0.0) + self.start_grace_s > state.read_at
            uses = [(held, False, None) for held in request.claims] + [
                (keys.template_claim_name(name, entry.name), True, entry)
                for entry in request.templates
            ]
            for claim_name, template, entry in uses:
                self.checks += 1
                key = (namespace, claim_name)
                users.setdefault(key, []).append(name)
                subject = f"{namespace}/{claim_name}"
                claim = claims.get(key)
                what = "template claim" if template else "claim"
                if claim is None:
                    if not (template and settling):
                        detail = f"gone while VMI {name} runs on {node}"
                        yield Violation(NOT_ATTACHED, subject, detail)
                    continue
                if template and entry is not None:
                    foreign = _foreign_template(claim, vmi, entry.gpu_class, entry.count)
                    if foreign:
                        yield Violation(FOREIGN_TEMPLATE, subject, f"VMI {name}: {foreign}")
                # Held claims are attached before the VMI is stored; a template claim's
                # attachment and any finalizer are the leader's, after the start.
                lenient = settling and template
                status = claim.get("status") or {}
                phase, attached = status.get("phase"), status.get("attachedTo")
                uid = status.get(ATTACHED_TO_UID)
                held_on = status.get("nodeName")
                following = (status.get("migration") or {}).get("node") == node
                if phase in HOLDING and held_on and held_on != node and not following:
                    # No grace: a claim of a running VM holds the node it runs on.
                    detail = f"{what} of VMI {name} running on {node} holds {held_on} ({phase})"
                    yield Violation(NOT_ATTACHED, subject, detail)
                    continue
                lost_ok = phase == "Lost" and (not ready or settling)
                other_vmi = bool(attached) and attached != name
                wrong_uid = uid is not None and uid != _meta(vmi).get("uid")
                if other_vmi or wrong_uid or (not attached and ready):
                    # A NotReady node's claims go Lost; they keep no other VMI's name.
                    if not lenient or other_vmi:
                        detail = (
                            f"{what} of VMI {name} (uid {_meta(vmi).get('uid')}) running on "
                            f"{node} is attached to {attached!r} (uid {uid!r}), phase {phase}"
                        )
                        yield Violation(NOT_ATTACHED, subject, detail)
                elif phase != "Attached" and not lost_ok and not lenient:
                    detail = f"{what} of VMI {name} running on {node} is {phase}"
                    yield Violation(NOT_ATTACHED, subject, detail)
                finalizers = _meta(claim).get("finalizers") or []
                if keys.FINALIZER_CLAIM not in finalizers and not lenient:
                    detail = f"{what} of VMI {name} running on {node} has no {keys.FINALIZER_CLAIM}"
                    yield Violation(UNPROTECTED, subject, detail)
        for (namespace, claim_name), vmis in sorted(users.items()):
            self.checks += 1
            if len(vmis) > 1:
                detail = f"used by running VMIs {', '.join(sorted(vmis))}"
                yield Violation(SERVES_TWO, f"{namespace}/{claim_name}", detail)

    def _pins(self, state: State) -> Iterator[Violation]:
        """A launcher pod that uses claims leaves the gate only pinned, in every required
        node-selector term, to the one node its claims hold."""
        vmis = {(_namespace(v), str(_meta(v).get("uid"))): v for v in state.vmis}
        claims = {(_namespace(c), _name(c)): c for c in state.claims}
        moving = _migrating(state)
        for pod in state.pods:
            namespace = _namespace(pod)
            labels = _meta(pod).get("labels") or {}
            if labels.get(keys.LABEL_CLAIMS_REF) != keys.LABEL_CLAIMS_REF_VALUE:
                continue
            owner = _owner_ref(pod, "VirtualMachineInstance")
            if owner is None or not self.scope.has_namespace(namespace):
                continue
            spec = pod.get("spec") or {}
            if any(
                g.get("name") == keys.SCHEDULING_GATE_CLAIMS
                for g in spec.get("schedulingGates") or []
            ):
                continue
            vmi = vmis.get((namespace, str(owner.get("uid"))))
            request = _claims_request(vmi) if vmi is not None else None
            if vmi is not None and request is None:
                continue  # a VMI without claims: its pod is ungated and not pinned
            self.checks += 1
            subject = f"{namespace}/{_name(pod)}"
            pins = required_pins(spec)
            if not pins or any(p is None for p in pins) or len(set(pins)) != 1:
                detail = f"ungated with required terms pinning {pins}"
                yield Violation(UNPINNED, subject, detail)
                continue
            pin = pins[0]
            if request is None or vmi is None or _in_migration(pod, moving):
                continue
            names = list(request.claims) + [
                keys.template_claim_name(_name(vmi), e.name) for e in request.templates
            ]
            held = {
                str((claims[(namespace, n)].get("status") or {}).get("nodeName"))
                for n in names
                if (namespace, n) in claims
                and (claims[(namespace, n)].get("status") or {}).get("phase") in HOLDING
            }
            if held and held != {pin}:
                if vmi_state(vmi).final:
                    # The VMI ended: its claims went back to Bound and may move, while the
                    # pod of the ended VMI still stands until it is deleted.
                    self.pins_left_after_the_end.add(subject)
                    continue
                phase = vmi_state(vmi).phase
                detail = (
                    f"pinned to {pin}, its claims held on {', '.join(sorted(held))} (VMI {phase})"
                )
                yield Violation(UNPINNED, subject, detail)

    # --- rules of a settled cluster ------------------------------------------------------

    def _judged(self, state: State) -> Iterator[Violation]:
        """Every order Bound or Attached on a node, or waiting with a reason: Pending (or
        Lost) with a False Bound condition; a VM's template claim may instead wait at the
        gate with a False Placed condition."""
        for claim in state.claims:
            deleting = _meta(claim).get("deletionTimestamp")
            if deleting or not self.scope.has_namespace(_namespace(claim)):
                continue
            self.checks += 1
            status = claim.get("status") or {}
            phase = status.get("phase")
            subject = f"{_namespace(claim)}/{_name(claim)}"
            if phase in HOLDING:
                if not status.get("nodeName"):
                    yield Violation(NOT_JUDGED, subject, f"{phase} without a node")
                continue
            told = {
                str(c.get("type"))
                for c in status.get("conditions") or []
                if c.get("status") == "False" and c.get("reason") and c.get("message")
            }
            waits = phase in ("Pending", "Lost") and keys.CONDITION_BOUND in told
            at_gate = _template(claim) and keys.CONDITION_PLACED in told
            if not (waits or at_gate):
                created = _meta(claim).get("creationTimestamp")
                detail = (
                    f"phase {phase!r}, status {json.dumps(status, sort_keys=True)}, "
                    f"created {created}, resourceVersion {_meta(claim).get('resourceVersion')}"
                )
                yield Violation(NOT_JUDGED, subject, detail)

    def _windows_kept(self, state: State) -> Iterator[Violation]:
        """SPEC §11, once nothing is in flight: a booked window that has opened is Active
        with the claim it made Bound or Attached on its booked node (Lost only when that
        node is gone), and a window that has ended is Ended. So no window starts short of
        its units, and none outlives its end."""
        claims = {(_namespace(c), _name(c)): c for c in state.claims}
        nodes = {_name(n) for n in state.nodes}
        for reservation in state.reservations:
            if not self.scope.has_namespace(_namespace(reservation)):
                continue
            window = _window(reservation)
            status = reservation.get("status") or {}
            phase, node = status.get("phase"), status.get("nodeName")
            if window is None or state.read_at < window[0]:
                continue
            self.checks += 1
            subject = f"{_namespace(reservation)}/{_name(reservation)}"
            if state.read_at >= window[1]:
                if phase != "Ended":
                    yield Violation(WINDOW_NOT_KEPT, subject, f"{phase} after its window's end")
                continue
            if phase == "Booked":
                yield Violation(WINDOW_NOT_KEPT, subject, "still Booked in its window")
            if phase != "Active":
                continue
            claim = claims.get((_namespace(reservation), _name(reservation)))
            owner = _owner_ref(claim, keys.KIND_RESERVATION) if claim is not None else None
            made = owner is not None and owner.get("uid") == _meta(reservation).get("uid")
            claim_status = (claim or {}).get("status") or {}
            held = claim_status.get("phase") in HOLDING and claim_status.get("nodeName") == node
            lost = claim_status.get("phase") == "Lost" and node not in nodes
            if not made or not (held or lost):
                detail = f"Active on {node}, its claim {json.dumps(claim_status, sort_keys=True)}"
                yield Violation(WINDOW_NOT_KEPT, subject, detail if made else "Active, no claim")

    def _dra_followed(self, state: State) -> Iterator[Violation]:
        """Every Bound or Attached claim of a ``dra`` class has one ResourceClaim of its
        own (its uid as controlling owner, in its namespace), allocated, if at all, only
        devices of its node (SPEC §13); no ResourceClaim outlives the claim it was made
        for."""
        dra_classes = {_name(c) for c in state.classes if dra.dra_source(c) is not None}
        node_of = {
            device.id: node
            for node, devices in dra.node_devices(state.resource_slices).items()
            for device in devices
        }
        made_for: dict[str, list[MutableObj]] = {}
        for resource_claim in state.resource_claims:
            uid = dra.controller_claim_uid(resource_claim)
            if uid:
                made_for.setdefault(uid, []).append(resource_claim)
        claim_uids = set()
        for claim in state.claims:
            uid = str(_meta(claim).get("uid"))
            claim_uids.add(uid)
            status = claim.get("status") or {}
            klass = str((claim.get("spec") or {}).get("class"))
            if klass not in dra_classes or not self.scope.has_namespace(_namespace(claim)):
                continue
            if status.get("phase") not in HOLDING or not status.get("nodeName"):
                continue
            self.checks += 1
            subject = f"{_namespace(claim)}/{_name(claim)}"
            own = [rc for rc in made_for.get(uid, ()) if _namespace(rc) == _namespace(claim)]
            if len(own) != 1:
                yield Violation(DRA_NOT_FOLLOWED, subject, f"{len(own)} ResourceClaims of its own")
                continue
            elsewhere = sorted(
                "/".join(d)
                for d in dra.allocated_devices(own[0])
                if node_of.get(d) != status["nodeName"]
            )
            if elsewhere:
                detail = f"bound on {status['nodeName']}, allocated {elsewhere}"
                yield Violation(DRA_NOT_FOLLOWED, subject, detail)
        for uid, resource_claims in made_for.items():
            if uid not in claim_uids:
                for rc in resource_claims:
                    if self.scope.has_namespace(_namespace(rc)):
                        subject = f"{_namespace(rc)}/{_name(rc)}"
                        yield Violation(DRA_NOT_FOLLOWED, subject, "its claim is gone")

    def _records(self, state: State) -> Iterator[Violation]:
        """Every Bound or Attached order, and every reservation from Booked until its
        window's end, has exactly one usage record of its own (owned by its uid, whatever
        the record's name), counting its units; the claim a window makes has none (the
        window is billed once); no other record of the controller's exists."""
        windows: dict[str, MutableObj] = {}
        for reservation in state.reservations:
            window = _window(reservation)
            phase = (reservation.get("status") or {}).get("phase")
            if phase in WINDOW_RECORDED and window and window[1] > state.read_at:
                windows[str(_meta(reservation).get("uid"))] = reservation
        wanted = dict(windows)
        for claim in state.claims:
            phase = (claim.get("status") or {}).get("phase")
            if phase in HOLDING and not _template(claim) and not _billed_window(claim, windows):
                wanted[str(_meta(claim).get("uid"))] = claim
        have: dict[str, list[str]] = {}
        for record in state.workloads:
            key = (_namespace(record), _name(record))
            if not records.is_usage_record(record) or not self.scope.has_namespace(key[0]):
                continue
            self.checks += 1
            subject = f"{key[0]}/{key[1]}"
            uid = records.owner_uid(record)
            wanted_claim = wanted.get(str(uid)) if uid is not None else None
            if wanted_claim is None:
                yield Violation(RECORDS, subject, "a record of no held order or booked window")
                continue
            have.setdefault(str(uid), []).append(subject)
            units = _count(wanted_claim)
            class_key = keys.quota_key(str((wanted_claim.get("spec") or {}).get("class")))
            resources = ((record.get("status") or {}).get("resources")) or {}
            if resources != {class_key: str(units)}:
                yield Violation(RECORDS, subject, f"counts {resources}, its owner {units}")
        for uid, claim in sorted(wanted.items()):
            if not self.scope.has_namespace(_namespace(claim)):
                continue
            self.checks += 1
            subject = f"{_namespace(claim)}/{_name(claim)}"
            held = have.get(uid, [])
            if not held:
                yield Violation(RECORDS, subject, "no usage record of its own")
            elif len(held) > 1:
                yield Violation(RECORDS, subject, f"{len(held)} usage records: {sorted(held)}")


def _migrating(state: State) -> dict[tuple[str, str], set[str]]:
    """Per VMI (namespace, name): the pods a live migration leaves off its claims' node
    for a while (SPEC §12): the target pod its claims record a target for, and the source
    pod of a migration that ended (its launcher exits once the VM has left)."""
    pods: dict[tuple[str, str], set[str]] = {}
    uids: dict[tuple[str, str], set[str]] = {}
    for claim in state.claims:
        status = claim.get("status") or {}
        target = status.get("migration") or {}
        if target.get("migrationUID") and status.get("attachedTo"):
            key = (_namespace(claim), str(status["attachedTo"]))
            uids.setdefault(key, set()).add(str(target["migrationUID"]))
    for vmi in state.vmis:
        key = (_namespace(vmi), _name(vmi))
        state_of = (vmi.get("status") or {}).get("migrationState") or {}
        if state_of.get("completed") and state_of.get("sourcePod"):
            pods.setdefault(key, set()).add(str(state_of["sourcePod"]))
    for pod in state.pods:
        owner = _owning_vmi(pod)
        job = (_meta(pod).get("labels") or {}).get(keys.LABEL_MIGRATION_JOB_UID)
        if owner is not None and job and str(job) in uids.get((_namespace(pod), owner), set()):
            pods.setdefault((_namespace(pod), owner), set()).add(_name(pod))
    return pods


def _in_migration(pod: MutableObj, moving: dict[tuple[str, str], set[str]]) -> bool:
    owner = _owning_vmi(pod)
    return owner is not None and _name(pod) in moving.get((_namespace(pod), owner), set())
