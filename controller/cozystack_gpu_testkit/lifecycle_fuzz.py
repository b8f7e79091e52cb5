"""The start path's lifecycle fuzz (issue 18, "the proof"): seeded random sequences of what
tenants, KubeVirt, nodes and crashes do to VMs that hold GPUs, on the real API server.

One run is one seed on a control plane of its own (``fault_suite.Run``: etcd,
kube-apiserver, kube-scheduler, kube-controller-manager's garbage collector, two replicas
of ``python -m cozystack_gpu`` under ``rawResourceNames: forbidden``), with the chart's
webhook configurations and its ValidatingAdmissionPolicies installed, and GPU nodes with
GPUNodes. Each step is one random operation, drawn from the seed:

- tenants (impersonated tenant admins): order claims; create VMs with held claims and/or
  claim templates; stop, start, restart and delete them; delete claims; try to strip a
  claim's finalizers (delete, then a JSON patch removing ``metadata.finalizers``);
  pre-create a claim named like a VM's template claim with a bigger count; create VMs
  whose claims annotation is odd (empty, whitespace, ``{}``, no claims, malformed, label
  without annotation, annotation without label) with raw GPU entries; cut a running VM's
  template claim from its VMI (owner references removed, a second owner added, the
  template label or the VMI-uid annotation removed); make a pod of their own that forges a
  running VMI's launcher pod (its label, its owner reference, a GPU request); create VMs
  with a claim template and a multus network whose NetworkAttachmentDefinition names the
  GPU resource (KubeVirt then asks a unit more in the launcher pod);
- nodes: NotReady and back, cordoned and back, short of memory (the scheduler refuses the
  launcher pod for a non-GPU resource) or of one GPU (kubelet reports fewer), and back;
- the controller: the leader SIGKILLed and started again (the webhooks' Service then
  routes to the replica left, as a Service with two endpoints would).

KubeVirt is its own virt-controller and virt-api (``RealKubeVirt``; ``kubevirt.start``:
v1.8.2 built from source; virt-controller as
``system:serviceaccount:kubevirt:kubevirt-controller``, the user the chart's raw-name
policy, rendered here, exempts): virt-controller makes each VM's VMI (named after it, owned
by it, with its template's labels and annotations), renders the VMI's launcher pod, fails
a VMI whose pod went and replaces a VMI that ended while its VM should run, with
KubeVirt's own start backoff; virt-api's webhooks default and judge each VM and VMI. The
kit plays, once per step, only what no real component runs here (``kubevirt``'s helpers):
kubelet (a bound launcher pod running, a deleted one removed) and virt-handler (its node's
labels and devices, a VMI virt-controller handed over reported Running on the pod's node,
with its phase transitions; a deleted VMI's guest shut down; a guest powering itself off).
All of it sits behind ``KubeVirt``, the small interface the driver sees.

``invariants.Invariants`` (its start-path rules included) looks throughout
(``watching``) and once the run has settled; the driver adds what only it can see
(``RAW_ADMITTED``: a VMI virt-controller made from an odd-annotation VM, or its launcher
pod, admitted with raw GPU entries under ``forbidden``; ``STRANDED``: a started VM whose
pinned pod a Ready, schedulable node refused, left as it is; ``FORGED_ADMITTED``: a
tenant's own pod requesting a GPU admitted under ``forbidden``; ``SURPLUS``: a launcher pod
ungated while it asks more GPU units than its VMI's claims hold; ``ORPHANED``, once settled:
a template claim whose VMI, by the uid it was made for, is gone). Every operation, what
KubeVirt did and what the kit played, with its outcome, is logged with the seed, so a
violation comes with the operations that touched its subject.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.objects import MutableObj, launcher, translate
from cozystack_gpu_testkit import cluster, kubevirt, tenants
from cozystack_gpu_testkit.chart import install_policies
from cozystack_gpu_testkit.fault_suite import Run, Service, WebhookSetup
from cozystack_gpu_testkit.invariants import Invariants, Violation, required_pins
from cozystack_gpu_testkit.objects import NODE_BASE_RESOURCES, Kube, wait_for

log = logging.getLogger(__name__)

TIMEOUT = (5.0, 20.0)
FUZZ_LABEL = "fuzz.cozystack.io/run"
TENANT_ADMIN = "tenant-admin"
VIRT_CONTROLLER = kubevirt.USER  # who a cluster's virt-controller is; the kit runs it so
RAW_ADMITTED = "raw GPU entries admitted without claims"
STRANDED = "started VM stranded at a refusing node"
ORPHANED = "template claim outlived the VMI it was made for"
FORGED_ADMITTED = "a tenant's own pod admitted with a GPU under forbidden"
SURPLUS = "launcher pod ungated asking more GPUs than its claims cover"
# The NetworkAttachmentDefinition of each tenant whose k8s.v1.cni.cncf.io/resourceName is the
# world's GPU resource: a VM on it would get a launcher pod asking a unit beyond its claims.
GPU_NAD = "gpu-net"
REPORT_EVERY_S = 60.0
# Odd claims-annotation shapes (None: no annotation) and whether the reference label goes
# with them; each VM made of one also carries a raw GPU entry of its own.
ODD_SHAPES: tuple[tuple[str | None, bool], ...] = (
    ("", False),
    ("", True),
    (" ", True),
    ("{}", True),
    ('{"claims": []}', True),
    ("{not json", True),
    (None, True),
    ('{"claims": ["x"]}', False),
)
SETTLE_S = 150.0
# A refusal the controller has not acted on this long after the scheduler said it.
STRANDED_AFTER_S = 15.0


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message", "")) or f"HTTP {exc.status}"
    except (TypeError, ValueError):
        return f"HTTP {exc.status}"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


# --- the journal -------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One operation (or what KubeVirt did, or the kit did as kubelet or virt-handler) and
    what came of it."""

    index: int
    at: float  # seconds into the run
    op: str
    args: str
    outcome: str
    names: frozenset[str]  # the VMs, claims and nodes it touched

    def __str__(self) -> str:
        return f"#{self.index:04d} +{self.at:6.1f}s {self.op} {self.args} -> {self.outcome}"


@dataclass(frozen=True)
class Finding:
    """A violation, the operation after which it was first seen, and the operations that
    touched its subject up to then."""

    violation: str
    first_seen_after: int
    sequence: tuple[str, ...]


class Journal:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.entries: list[Entry] = []
        self.started = time.monotonic()
        self._lock = threading.Lock()

    @property
    def last(self) -> int:
        return self.entries[-1].index if self.entries else 0

    def record(self, op: str, args: str, outcome: str, names: Iterable[str]) -> Entry:
        with self._lock:
            entry = Entry(
                len(self.entries) + 1,
                time.monotonic() - self.started,
                op,
                args,
                outcome,
                frozenset(n for n in names if n),
            )
            self.entries.append(entry)
        log.info("seed %d %s", self.seed, entry)
        return entry

    def touching(self, names: set[str], until: int) -> list[Entry]:
        return [e for e in self.entries if e.index <= until and e.names & names]


# --- who acts ----------------------------------------------------------------------------


def impersonating(run: Run, user: str) -> Kube:
    return tenants.impersonating(run.plane.api_client(), user)


@dataclass(frozen=True)
class Admission:
    """The chart's admission objects: its webhook configurations (``WebhookSetup``) and
    ``render(template, namespace, values)``, ``helm template`` of one chart template."""

    webhooks: WebhookSetup
    render: Callable[[str, str, Mapping[str, Any]], list[MutableObj]]


def grant(run: Run, admission: Admission, namespaces: Sequence[str]) -> None:
    """Tenant admins as the chart grants them (its roles aggregated into ``admin``) and VMs
    as KubeVirt's roles grant them; virt-controller has KubeVirt's own roles
    (``kubevirt.install``)."""
    chart_roles = admission.render("rbac-tenant.yaml", run.namespace, {})
    tenants.grant_tenant_admin(run.api, chart_roles, TENANT_ADMIN, namespaces)


# --- KubeVirt ----------------------------------------------------------------------------


class KubeVirt(Protocol):
    """What KubeVirt does for the fuzz: make each VM's VMI and launcher pod, run them once
    scheduled, replace a VMI that ended while its VM should run. ``reconcile`` is one pass
    of the parts the kit plays; ``guest_shuts_down`` is a guest powering itself off (the
    restart operation). What only the driver sees comes back in ``starts`` (VMIs brought
    to Running), ``running`` (VMIs Running at the last pass) and ``raw_admitted``
    (``RAW_ADMITTED`` violations, with the journal entry that saw each)."""

    starts: int
    running: set[tuple[str, str]]
    raw_admitted: list[tuple[str, int]]

    def reconcile(self) -> None: ...

    def guest_shuts_down(self, namespace: str, name: str) -> str: ...


def raw_entries(vmi: Mapping[str, Any]) -> list[MutableObj]:
    """The VMI's ``gpus`` entries that are not the VMI webhook's (``gpu-cozystack-N``)."""
    devices = ((vmi.get("spec") or {}).get("domain") or {}).get("devices") or {}
    return [
        g for g in devices.get("gpus") or []
        if not str(g.get("name", "")).startswith(keys.VMI_GPU_NAME_PREFIX)
    ]  # fmt: skip


def _why(vmi: Mapping[str, Any]) -> str:
    """What virt-controller wrote in a failed VMI's conditions (reason: message)."""
    told = [
        f"{c.get('type')} {c.get('reason')}: {c.get('message')}"
        for c in (vmi.get("status") or {}).get("conditions") or []
        if c.get("reason") or c.get("message")
    ]
    return f" [{'; '.join(told)}]" if told else ""


def _vm_of(pod: str) -> str:
    """The VM (its VMI's name) of launcher pod ``virt-launcher-<VMI>-<random>``."""
    return pod.removeprefix("virt-launcher-").rsplit("-", 1)[0]


class RealKubeVirt:
    """KubeVirt's own virt-controller and virt-api (``kubevirt.start``) on the run's control
    plane, virt-controller as ``system:serviceaccount:kubevirt:kubevirt-controller``
    (``VIRT_CONTROLLER``, the user the chart's raw-name policy exempts): its VM controller
    makes each VM's VMI, its VMI controller the launcher pod, fails a VMI whose pod went,
    and its VM controller replaces a VMI that ended while the VM should run (with
    KubeVirt's start backoff after a VMI that never ran); virt-api's webhooks default and
    judge every VM and VMI written (its finalizer on each new VMI among what it adds).
    Each ``reconcile`` pass plays only what no real component runs here, with
    ``kubevirt``'s helpers:

    - kubelet: a bound launcher pod reported running (``kubelet_runs``; virt-controller
      then hands the VMI over, Scheduled on the pod's node), a deleted one removed
      (``kubelet_removes``);
    - virt-handler: its node's labels and devices (``as_virt_handler``, once, at start), a
      Scheduled VMI whose pod runs reported Running there (``reports``, as virt-handler's
      ServiceAccount), a deleted VMI's guest shut down (``shuts_down``).

    virt-controller's own doings are journaled as the pass sees them: a new VMI or pod, a
    VMI's phase changes it wrote, a VM's Failure condition (its VMI refused). Raw GPU
    entries are judged on each VMI virt-controller got admitted and on each launcher pod
    of such a VMI."""

    def __init__(self, run: Run, journal: Journal, world_id: str) -> None:
        self.kube = run.kube
        self.journal = journal
        self.selector = f"{FUZZ_LABEL}={world_id}"
        self.controller = kubevirt.start(run.plane)
        for node in run.world.nodes:
            kubevirt.as_virt_handler(run.api, node)
        self.starts = 0
        self.running: set[tuple[str, str]] = set()
        self.raw_admitted: list[tuple[str, int]] = []
        self._phases: dict[str, str] = {}  # VMI uid -> the last phase journaled
        self._deleting: set[str] = set()  # VMI uids seen with a deletionTimestamp
        self._raw: set[str] = set()  # VMI uids with raw GPU entries
        self._reported: set[str] = set()  # VMI uids the kit reported Running
        self._pods: set[str] = set()  # launcher pod uids seen

    # --- one pass --------------------------------------------------------------------

    def reconcile(self) -> None:
        vms = self._list(keys.VM, self.selector)
        vmis = self._list(keys.VMI, "")
        listed = self.kube.core.list_pod_for_all_namespaces(
            label_selector=kubevirt.LAUNCHER_SELECTOR, _request_timeout=TIMEOUT
        )
        pods: list[MutableObj] = self.kube.api.sanitize_for_serialization(listed).get("items") or []
        for vm in vms:
            self._vm_refusal(vm)
        for vmi in vmis:
            self._seen_vmi(vmi)
        by_vmi: dict[str, list[MutableObj]] = {}
        for pod in pods:
            owner = str((_meta(pod).get("labels") or {}).get("kubevirt.io/created-by"))
            by_vmi.setdefault(owner, []).append(pod)
            self._seen_pod(pod, owner)
        self.running = {
            (_meta(v)["namespace"], _meta(v)["name"])
            for v in vmis
            if (v.get("status") or {}).get("phase") == "Running"
        }
        # kubelet runs what was bound; virt-handler then shuts down deleted guests before
        # kubelet removes deleted pods: a pod gone under a guest that still runs is a crash
        # to virt-controller.
        for pod in pods:
            if not _meta(pod).get("deletionTimestamp"):
                self._pass(self._kubelet_runs, pod)
        for vmi in vmis:
            self._pass(self._virt_handler, vmi, by_vmi.get(str(_meta(vmi).get("uid")), []))
        for namespace in sorted(
            {_meta(p)["namespace"] for p in pods if _meta(p).get("deletionTimestamp")}
        ):
            for removed in kubevirt.kubelet_removes(self.kube, namespace):
                args = f"pod {namespace}/{removed}"
                self.journal.record("kubelet", args, "removed", {_vm_of(removed)})

    def _list(self, kind: keys.ApiKind, selector: str) -> list[MutableObj]:
        listing = self.kube.custom.list_cluster_custom_object(
            kind.group, kind.version, kind.plural, label_selector=selector,
            _request_timeout=TIMEOUT,
        )  # fmt: skip
        return list(listing.get("items") or [])

    def _pass(self, part: Callable[..., None], obj: MutableObj, *args: Any) -> None:
        try:
            part(obj, *args)
        except ApiException as exc:  # raced with virt-controller or a deletion: next pass
            log.debug("%s %s: %s", obj.get("kind"), _meta(obj).get("name"), _message(exc))
        except AssertionError as exc:  # gone meanwhile (``reports``): next pass
            log.debug("%s %s: %s", obj.get("kind"), _meta(obj).get("name"), exc)

    # --- what virt-controller did ----------------------------------------------------

    def _vm_refusal(self, vm: MutableObj) -> None:
        """A VM's Failure condition: virt-controller's VMI create refused (it retries)."""
        conditions = (vm.get("status") or {}).get("conditions") or []
        failure = next(
            (c for c in conditions if c.get("type") == "Failure" and c.get("status") == "True"),
            None,
        )
        if failure is not None:
            subject = f"vm {_meta(vm)['namespace']}/{_meta(vm)['name']}"
            outcome = f"{failure.get('reason')}: {failure.get('message')}"
            self._outcome_once(subject, outcome, {_meta(vm)["name"]})

    def _seen_vmi(self, vmi: MutableObj) -> None:
        namespace, name, uid = _meta(vmi)["namespace"], _meta(vmi)["name"], _meta(vmi)["uid"]
        phase = str((vmi.get("status") or {}).get("phase") or "")
        args = f"vmi {namespace}/{name}"
        why = _why(vmi) if phase == "Failed" else ""
        if uid not in self._phases:
            self._phases[uid] = phase
            self.journal.record("kubevirt", args, f"created uid {uid} ({phase}){why}", {name})
            self._judge_raw(vmi, "VMI")
        elif phase != self._phases[uid] and phase not in ("Running", "Succeeded"):
            self._phases[uid] = phase  # Running and Succeeded are the kit's own writes
            node = (vmi.get("status") or {}).get("nodeName")
            where = f" on {node}" if node and phase == "Scheduled" else ""
            self.journal.record("kubevirt", args, f"uid {uid[:8]} {phase}{where}{why}", {name})
        if _meta(vmi).get("deletionTimestamp") and uid not in self._deleting:
            self._deleting.add(uid)
            self.journal.record("kubevirt", args, f"uid {uid[:8]} deleting ({phase})", {name})

    def _seen_pod(self, pod: MutableObj, vmi_uid: str) -> None:
        uid = str(_meta(pod).get("uid"))
        if uid in self._pods:
            return
        self._pods.add(uid)
        namespace, name = _meta(pod)["namespace"], _meta(pod)["name"]
        vm = _vm_of(name)
        args = f"pod {namespace}/{name}"
        self.journal.record("kubevirt", args, f"created for VMI uid {vmi_uid[:8]}", {vm})
        if vmi_uid in self._raw:
            self._raw_violation(namespace, vm, "launcher pod", f"pod {name}")

    def _judge_raw(self, vmi: MutableObj, what: str) -> None:
        """Under ``forbidden`` a VMI with GPU entries of its own and no readable claims may
        not get its GPU: the VMI (or at least its pod) must be refused."""
        raw = raw_entries(vmi)
        if not raw:
            return
        self._raw.add(str(_meta(vmi)["uid"]))
        note = (_meta(vmi).get("annotations") or {}).get(keys.ANNOTATION_CLAIMS)
        label = (_meta(vmi).get("labels") or {}).get(keys.LABEL_CLAIMS_REF)
        detail = (
            f"raw entries {[g.get('deviceName') for g in raw]}, annotation {note!r}, "
            f"label {label!r}"
        )
        self._raw_violation(_meta(vmi)["namespace"], _meta(vmi)["name"], what, detail)

    def _raw_violation(self, namespace: str, vm: str, what: str, detail: str) -> None:
        subject = f"{namespace}/{vm}"
        text = f"{RAW_ADMITTED}: {subject}: {what} admitted with {detail}"
        entry = self.journal.record(
            "kubevirt", f"{what} {subject}", "ADMITTED with raw GPU entries", {vm}
        )
        self.raw_admitted.append((text, entry.index))

    def _outcome_once(self, args: str, outcome: str, names: set[str]) -> None:
        """Refusals repeat every retry: the journal keeps each distinct one once in a row."""
        last = next((e for e in reversed(self.journal.entries) if e.args == args), None)
        if last is None or last.outcome != outcome:
            self.journal.record("kubevirt", args, outcome, names)

    # --- what the kit plays: kubelet, virt-handler ------------------------------------

    def _kubelet_runs(self, pod: MutableObj) -> None:
        namespace, name = _meta(pod)["namespace"], _meta(pod)["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        if node and (pod.get("status") or {}).get("phase") != "Running":
            kubevirt.kubelet_runs(self.kube.api, namespace, name)
            names = {_vm_of(name), node}
            self.journal.record("kubelet", f"pod {namespace}/{name}", f"running on {node}", names)

    def _virt_handler(self, vmi: MutableObj, pods: list[MutableObj]) -> None:
        namespace, name, uid = _meta(vmi)["namespace"], _meta(vmi)["name"], _meta(vmi)["uid"]
        status = vmi.get("status") or {}
        args = f"vmi {namespace}/{name}"
        if _meta(vmi).get("deletionTimestamp"):
            if status.get("phase") in ("Scheduled", "Running"):
                self.journal.record("virt-handler", args, "guest shut down: Succeeded", {name})
            kubevirt.shuts_down(self.kube, namespace, name)
            return
        node = status.get("nodeName")
        if status.get("phase") != "Scheduled" or uid in self._reported or not node:
            return
        if not any(
            (p.get("spec") or {}).get("nodeName") == node
            and (p.get("status") or {}).get("phase") == "Running"
            and not _meta(p).get("deletionTimestamp")
            for p in pods
        ):
            return
        kubevirt.reports(self.kube, namespace, name, "Running", node)
        self._reported.add(uid)
        self.running.add((namespace, name))
        self.starts += 1
        self.journal.record("virt-handler", args, f"uid {uid[:8]} Running on {node}", {name, node})

    def guest_shuts_down(self, namespace: str, name: str) -> str:
        """The guest powers itself off: virt-handler reports its VMI Succeeded; with
        runStrategy Always the VM controller then makes the next VMI under the same name."""
        vmi = kubevirt.get_vmi(self.kube, namespace, name)
        phase = ((vmi or {}).get("status") or {}).get("phase")
        if vmi is None or phase != "Running" or _meta(vmi).get("deletionTimestamp"):
            return f"no guest running (VMI {phase or 'none'})"
        kubevirt.retried_on_conflict(
            lambda: kubevirt.reports(self.kube, namespace, name, "Succeeded")
        )
        return "guest shut down: VMI Succeeded"


# --- the fuzz ----------------------------------------------------------------------------


@dataclass
class FuzzSettings:
    seed: int = 1
    operations: int = 80
    nodes: int = 4
    gpus: int = 2
    pause_s: tuple[float, float] = (0.1, 0.5)  # load between operations, not a wait
    settle_s: float = SETTLE_S
    # Relative weights of each operation.
    weights: Mapping[str, float] = field(
        default_factory=lambda: {
            "order": 3.0,
            "create_vm": 4.0,
            "stop_vm": 1.5,
            "start_vm": 1.5,
            "restart_vm": 2.0,
            "delete_vmi": 1.5,
            "delete_vm": 1.0,
            "delete_claim": 1.5,
            "strip_finalizers": 1.5,
            "squat_template": 1.5,
            "odd_vm": 1.0,
            "cut_owner": 1.2,
            "forged_pod": 0.8,
            "nad_vm": 0.8,
            "node_not_ready": 0.7,
            "node_cordon": 0.7,
            "node_memory_short": 0.7,
            "node_gpu_short": 0.5,
            "node_restore": 1.2,
            "kill_leader": 0.6,
        }
    )


@dataclass
class FuzzResult:
    seed: int
    operations: int
    faults: int
    kills: int
    checks: int
    looks: int
    starts: int
    violations: list[str]
    findings: list[Finding]
    outcomes: dict[str, int]
    wall_s: float

    def summary(self) -> str:
        return (
            f"seed {self.seed}: {self.operations} operations, {self.faults} faults "
            f"({self.kills} leader kills), {self.starts} VM starts, {self.checks} checks in "
            f"{self.looks} looks, {len(self.violations)} violations, {self.wall_s:.0f} s"
        )

    def report(self) -> str:
        lines = [self.summary()]
        for finding in self.findings:
            lines.append(f"  {finding.violation} (first seen after #{finding.first_seen_after})")
            lines += [f"      {step}" for step in finding.sequence]
        return "\n".join(lines)


@dataclass
class FuzzVM:
    namespace: str
    name: str
    held: tuple[str, ...]
    templates: tuple[Mapping[str, Any], ...]
    odd: bool = False
    gone: bool = False  # deleted: its names still explain the journal


class LifecycleFuzz:
    """One seed's run; ``run()`` returns its result."""

    def __init__(self, workdir: Path, admission: Admission, settings: FuzzSettings) -> None:
        self.workdir = workdir
        self.admission = admission
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.journal = Journal(settings.seed)
        self.vms: dict[tuple[str, str], FuzzVM] = {}
        self.claims: dict[tuple[str, str], MutableObj] = {}  # last listing
        self.checker: Invariants | None = None
        self.faulted: dict[str, set[str]] = {}  # node -> faults in place
        self.faults = 0
        self.kills = 0
        self.killed: list[tuple[str, float]] = []  # replica, restart due (monotonic)
        self.outcomes: dict[str, int] = {}
        self.stranded: dict[str, str] = {}  # pod -> violation
        self.forged: list[tuple[str, int]] = []  # (violation, journal index)
        self.surplus: dict[str, str] = {}  # pod -> violation
        self._nads: set[tuple[str, str]] = set()
        self._seq = 0
        self._reported = time.monotonic()

    # --- set-up --------------------------------------------------------------------------

    def _prepare(self, run: Run) -> Service:
        world = run.world
        for identity in run.replicas:

            def serving(identity: str = identity) -> bool:
                return run.webhook_serving(identity)

            wait_for(serving, 60, f"{identity}'s webhook server")
        service = self.service = Service(run, "r1")
        self._hooks = self.admission.webhooks.configurations(service)
        self.admission.webhooks.install(run.api, self._hooks)
        policies: list[MutableObj] = []
        for template, values in (
            ("raw-names-policy.yaml", {"rawNamePolicy": {"virtControllerUser": VIRT_CONTROLLER}}),
            ("claims-label-policy.yaml", {}),
            ("protection-policy.yaml", {}),
            ("launcher-gate-policy.yaml", {}),
        ):
            policies += self.admission.render(template, run.namespace, values)
        install_policies(run.api, [_as_replicas(p) for p in policies])
        grant(run, self.admission, world.tenants)
        self.tenant = impersonating(run, TENANT_ADMIN)
        self.kubevirt: KubeVirt = RealKubeVirt(run, self.journal, world.id)
        self._wait_enforced(run)
        return service

    def _wait_enforced(self, run: Run) -> None:
        """Until the webhooks are called and the raw-name policy refuses under
        ``forbidden`` (the controller writes its settings; the policy reads them)."""
        controller = impersonating(run, VIRT_CONTROLLER)
        tenant = run.world.tenants[-1]

        def refused(body: MutableObj, needle: str) -> bool:
            try:
                controller.custom.create_namespaced_custom_object(
                    keys.VMI.group, keys.VMI.version, tenant, keys.VMI.plural, body,
                    dry_run="All",
                )  # fmt: skip
            except ApiException as exc:
                return needle in _message(exc)
            return False

        def vmi(
            name: str, labels: MutableObj, notes: MutableObj, gpus: list[MutableObj]
        ) -> MutableObj:
            return {
                "apiVersion": keys.VMI.api_version,
                "kind": keys.VMI.kind,
                "metadata": {"name": name, "labels": labels, "annotations": notes},
                "spec": {"domain": {"devices": {"gpus": gpus}, "memory": {"guest": "1Gi"}}},
            }

        label = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
        malformed = vmi("probe-webhook", label, {keys.ANNOTATION_CLAIMS: "probe"}, [])
        raw = vmi("probe-raw", {}, {}, [{"name": "g", "deviceName": run.world.resource}])
        wait_for(lambda: refused(malformed, "malformed"), 60, "the webhooks called", 0.2)
        wait_for(lambda: refused(raw, "forbidden"), 90, "rawResourceNames: forbidden enforced", 0.5)

    # --- the run -------------------------------------------------------------------------

    def run(self) -> FuzzResult:
        settings = self.settings
        started = time.monotonic()
        name = f"fz{settings.seed % 1000}"
        with Run(
            name,
            self.workdir,
            nodes=settings.nodes,
            gpus=settings.gpus,
            webhooks=True,
            replica_args=("--raw-resource-names", "forbidden"),
        ) as run:
            self.run_obj = run
            run.load = None  # the fuzz is the load: the suite's own never starts
            service = self._prepare(run)
            checker = Invariants(run.api)
            self.checker = checker
            first_seen: dict[str, int] = {}
            try:
                with checker.watching():
                    for _op in range(settings.operations):
                        self._tick(run)
                        self._operate(run)
                        self._note(checker, first_seen)
                        if _op % 5 == 4:
                            self._look_stranded(run, first_seen)
                            self._look_surplus(run, first_seen)
                        time.sleep(self.rng.uniform(*settings.pause_s))
                    final = self._settle(run, checker, first_seen)
            finally:
                self.admission.webhooks.remove(run.api, self._hooks)
                service.down()
            violations = [str(v) for v in checker.seen]
            violations += [str(v) for v in final if str(v) not in violations]
            for v in final:
                first_seen.setdefault(str(v), self.journal.last)
            for text, index in self.kubevirt.raw_admitted:
                violations.append(text)
                first_seen.setdefault(text, index)
            violations += list(self.stranded.values())
            violations += list(self.surplus.values())
            for text, index in self.forged:
                violations.append(text)
                first_seen.setdefault(text, index)
            findings = [self._finding(v, first_seen.get(v, self.journal.last)) for v in violations]
            return FuzzResult(
                seed=settings.seed,
                operations=settings.operations,
                faults=self.faults,
                kills=self.kills,
                checks=checker.checks,
                looks=checker.looks,
                starts=self.kubevirt.starts,
                violations=violations,
                findings=findings,
                outcomes=dict(sorted(self.outcomes.items())),
                wall_s=time.monotonic() - started,
            )

    def _note(self, checker: Invariants, first_seen: dict[str, int]) -> None:
        for violation in list(checker.seen):
            first_seen.setdefault(str(violation), self.journal.last)

    def _tick(self, run: Run) -> None:
        """KubeVirt's pass, replicas due back, node agents' reports, the claim listing."""
        now = time.monotonic()
        for identity, due in list(self.killed):
            if now >= due:
                run.replicas[identity].restart()
                self.killed.remove((identity, due))
                self.journal.record("controller", identity, "started again", {identity})
        if now - self._reported >= REPORT_EVERY_S:
            for node in run.world.gpu_nodes:
                run.kube.custom.patch_cluster_custom_object_status(
                    keys.GROUP, keys.VERSION, keys.PLURAL_NODES, node,
                    {"status": {"updatedAt": _now()}}, _request_timeout=TIMEOUT,
                )  # fmt: skip
            self._reported = now
        try:
            self.kubevirt.reconcile()
            listing = run.kube.custom.list_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_CLAIMS, _request_timeout=TIMEOUT
            )
        except Exception as exc:  # a webhook or the server away for a moment: next tick
            log.debug("tick: %s", exc)
            return
        world = run.world
        self.claims = {
            (_meta(c)["namespace"], _meta(c)["name"]): c
            for c in listing.get("items") or []
            if _meta(c)["namespace"] in world.tenants
        }

    def _settle(self, run: Run, checker: Invariants, first_seen: dict[str, int]) -> list[Violation]:
        """Every fault undone, then KubeVirt keeps playing until every rule holds (or the
        settle time passes): the last look's violations."""
        for node in list(self.faulted):
            self._restore(run, node, op="end_restore")
        for identity, _due in list(self.killed):
            run.replicas[identity].restart()
        self.killed.clear()
        deadline = time.monotonic() + self.settings.settle_s
        calm_until = time.monotonic() + 20.0  # VMs started by the last operations run
        final: list[Violation] = []
        while True:
            self._tick(run)
            self._note(checker, first_seen)
            self._look_stranded(run, first_seen)
            self._look_surplus(run, first_seen)
            try:
                final = checker.settled() + self._orphans(run)
            except Exception as exc:
                final = [Violation("look", "cluster", f"{type(exc).__name__}: {exc}")]
            now = time.monotonic()
            if (not final and now >= calm_until) or now >= deadline:
                return final
            time.sleep(1.0)

    def _found(self, rule: dict[str, str], key: str, text: str, first_seen: dict[str, int]) -> None:
        """A violation of one of the driver's own look rules, once per subject."""
        rule[key] = text
        first_seen.setdefault(text, self.journal.last)
        log.error("seed %d: %s", self.settings.seed, text)

    def _look_surplus(self, run: Run, first_seen: dict[str, int]) -> None:
        """An ungated launcher pod of a live VMI with claims asks, over all its containers,
        no more units of the GPU resource than the claims attached to that VMI hold: KubeVirt
        adds a request per network whose definition names a resource, and the gate must
        keep such a pod gated (SPEC §6)."""
        resource = run.world.resource
        try:
            pods = run.kube.core.list_pod_for_all_namespaces(
                label_selector=f"kubevirt.io=virt-launcher,{keys.LABEL_CLAIMS_REF}"
            )
            # Read after the pods: a pod's claims exist before the gate lets it go.
            claims = _items(
                run.kube.custom.list_cluster_custom_object(
                    keys.GROUP, keys.VERSION, keys.PLURAL_CLAIMS, _request_timeout=TIMEOUT
                )
            )
            vmis = _items(
                run.kube.custom.list_cluster_custom_object(
                    keys.VMI.group, keys.VMI.version, keys.VMI.plural, _request_timeout=TIMEOUT
                )
            )
        except Exception as exc:  # the server away: the next look
            log.debug("surplus look: %s", exc)
            return
        live = {
            _meta(v).get("uid")
            for v in vmis
            if (v.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and not _meta(v).get("deletionTimestamp")
        }
        for pod in pods.items:
            key = f"{pod.metadata.namespace}/{pod.metadata.name}"
            gates = [g.name for g in pod.spec.scheduling_gates or []]
            if key in self.surplus or keys.SCHEDULING_GATE_CLAIMS in gates:
                continue
            owner = next((o for o in pod.metadata.owner_references or [] if o.uid), None)
            if owner is None or pod.metadata.deletion_timestamp:
                continue
            if pod.status.phase in ("Succeeded", "Failed") or owner.uid not in live:
                continue  # a finishing pod: its claims let go when its VMI ended
            asked = launcher.extended_requests(run.api.sanitize_for_serialization(pod)).get(
                resource, 0
            )
            # Its claims: held ones attached to it, and the template claims made for it
            # (attached by the leader a moment after the start).
            held = sum(
                int((c.get("spec") or {}).get("count") or 1)
                for c in claims
                if _meta(c)["namespace"] == pod.metadata.namespace
                and (
                    (c.get("status") or {}).get("attachedToUID") == owner.uid
                    or (
                        translate.made_by_template(c)
                        and translate.template_made_for(c) == owner.uid
                    )
                )
            )
            if asked > held:
                text = (
                    f"{SURPLUS}: {key} (VMI {owner.name}) asks {asked} x {resource}, its "
                    f"claims hold {held}"
                )
                self._found(self.surplus, key, text, first_seen)

    def _orphans(self, run: Run) -> list[Violation]:
        """Template claims whose VMI, by the uid they were made for, is gone: SPEC §7 says
        the controller deletes them, whatever their metadata says (a cut owner must not
        leave an unbilled hold). Judged once settled: the binder sweeps them every few
        seconds, after a grace for a VMI watch that lags."""
        world = run.world
        vmis = run.kube.custom.list_cluster_custom_object(
            keys.VMI.group, keys.VMI.version, keys.VMI.plural, _request_timeout=TIMEOUT
        )
        live = {(_meta(v)["namespace"], _meta(v).get("uid")) for v in vmis.get("items") or []}
        found = []
        for (namespace, name), claim in sorted(self.claims.items()):
            if namespace not in world.tenants or not translate.made_by_template(claim):
                continue
            uid = translate.template_made_for(claim)
            if (namespace, uid) not in live:
                found.append(
                    Violation(
                        ORPHANED,
                        f"{namespace}/{name}",
                        f"made for VMI uid {uid}, which is gone; phase "
                        f"{(claim.get('status') or {}).get('phase')}, node "
                        f"{(claim.get('status') or {}).get('nodeName')}",
                    )
                )
        return found

    def _look_stranded(self, run: Run, first_seen: dict[str, int]) -> None:
        """A pinned launcher pod that a Ready, schedulable node has refused for
        ``STRANDED_AFTER_S`` and that is still there, unscheduled: SPEC §6 says the
        controller deletes it and moves the set (for any resource the pod lacks there)."""
        try:
            nodes = {n.metadata.name: n for n in run.kube.core.list_node().items}
            pods = run.kube.core.list_pod_for_all_namespaces(
                label_selector="kubevirt.io=virt-launcher"
            )
        except Exception as exc:  # the server away: the next look
            log.debug("stranded look: %s", exc)
            return
        now = datetime.datetime.now(datetime.UTC)
        for pod in pods.items:
            key = f"{pod.metadata.namespace}/{pod.metadata.name}"
            if key in self.stranded or pod.spec.node_name or pod.metadata.deletion_timestamp:
                continue
            pins = required_pins(run.api.sanitize_for_serialization(pod).get("spec") or {})
            node = nodes.get(pins[0]) if pins and pins[0] is not None else None
            refused = next(
                (
                    c
                    for c in pod.status.conditions or []
                    if (c.type, c.status, c.reason) == ("PodScheduled", "False", "Unschedulable")
                ),
                None,
            )
            if node is None or refused is None or node.spec.unschedulable:
                continue
            since = refused.last_transition_time
            if since is None or (now - since).total_seconds() < STRANDED_AFTER_S:
                continue
            conditions = node.status.conditions or []
            if any(c.type == "Ready" and c.status == "True" for c in conditions):
                owner = next(iter(pod.metadata.owner_references or []), None)
                text = (
                    f"{STRANDED}: {key}: VMI {owner.name if owner else '?'} pinned to "
                    f"{pins[0]} (Ready, schedulable), refused since {since}: {refused.message}"
                )
                self._found(self.stranded, key, text, first_seen)

    def _finding(self, violation: str, first: int) -> Finding:
        names = set()
        for part in violation.replace(",", " ").replace(":", " ").split():
            name = part.split("/")[-1]
            names.add(name)
            if name.startswith("virt-launcher-"):
                names.add(_vm_of(name))
        vm_names = {
            vm.name
            for vm in self.vms.values()
            if names & ({vm.name, *vm.held} | {self._template_name(vm, t) for t in vm.templates})
        }
        names |= vm_names
        for vm in self.vms.values():
            if vm.name in vm_names:
                names |= set(vm.held) | {self._template_name(vm, t) for t in vm.templates}
        steps = tuple(str(e) for e in self.journal.touching(names, first))
        return Finding(violation, first, steps)

    @staticmethod
    def _template_name(vm: FuzzVM, entry: Mapping[str, Any]) -> str:
        return keys.template_claim_name(vm.name, str(entry["name"]))

    # --- operations ----------------------------------------------------------------------

    def _operate(self, run: Run) -> None:
        weights = self.settings.weights
        ops = sorted(weights)
        op = self.rng.choices(ops, weights=[weights[o] for o in ops])[0]
        action: Callable[[Run], tuple[str, str, set[str]]] = getattr(self, f"_op_{op}")
        try:
            args, outcome, names = action(run)
        except ApiException as exc:
            args, outcome, names = "", f"error {exc.status}: {_message(exc)}", set()
        except Exception as exc:  # the server away (a kill, a fault): the run goes on
            args, outcome, names = "", f"error {type(exc).__name__}: {exc}", set()
        key = f"{op}: {outcome.split(':', 1)[0].split(' (', 1)[0]}"
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        self.journal.record(op, args, outcome, names)

    def _next(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}{self._seq:03d}"

    def _tenant_claims(self, namespace: str) -> list[str]:
        return sorted(n for ns, n in self.claims if ns == namespace)

    def _claim_call(self, call: Callable[..., Any], namespace: str, *args: Any, **kw: Any) -> Any:
        return call(keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, *args, **kw)

    def _vm_call(self, call: Callable[..., Any], namespace: str, *args: Any, **kw: Any) -> Any:
        return call(keys.VM.group, keys.VM.version, namespace, keys.VM.plural, *args, **kw)

    def _op_order(self, run: Run) -> tuple[str, str, set[str]]:
        world = run.world
        namespace = self.rng.choice(world.tenants)
        name = self._next("c")
        gpu_class = self.rng.choice(world.classes)
        count = 2 if self.rng.random() < 0.25 else 1
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND_CLAIM,
            "metadata": {"name": name},
            "spec": {"class": gpu_class, "count": count},
        }
        args = f"{namespace}/{name} {gpu_class} x{count}"
        try:
            self._claim_call(self.tenant.custom.create_namespaced_custom_object, namespace, body)
        except ApiException as exc:
            return args, f"refused: {_message(exc)}", {name}
        return args, "accepted", {name}

    def _vm_body(
        self, vm: FuzzVM, labels: MutableObj, notes: MutableObj, gpus: list[MutableObj]
    ) -> MutableObj:
        memory_mi = self.rng.choice((512, 1024, 2048))
        return {
            "apiVersion": keys.VM.api_version,
            "kind": keys.VM.kind,
            "metadata": {
                "name": vm.name,
                "labels": {FUZZ_LABEL: self.run_obj.world.id},
                "annotations": {"fuzz.cozystack.io/memory-mi": str(memory_mi)},
            },
            "spec": {
                "runStrategy": "Always",
                "template": {
                    "metadata": {"labels": labels, "annotations": notes},
                    "spec": {
                        "domain": {
                            "devices": {"gpus": gpus} if gpus else {},
                            "memory": {"guest": f"{memory_mi}Mi"},
                        }
                    },
                },
            },
        }

    def _submit_vm(
        self, vm: FuzzVM, body: MutableObj, args: str, names: set[str]
    ) -> tuple[str, str, set[str]]:
        """The tenant creates the VM; one it is refused is not the fuzz's to drive."""
        try:
            self._vm_call(self.tenant.custom.create_namespaced_custom_object, vm.namespace, body)
        except ApiException as exc:
            return args, f"refused: {_message(exc)}", names
        self.vms[(vm.namespace, vm.name)] = vm
        return args, "created", names

    def _op_create_vm(self, run: Run) -> tuple[str, str, set[str]]:
        """A VM that holds some of its tenant's claims and/or orders from templates."""
        world = run.world
        namespace = self.rng.choice(world.tenants)
        used = {
            c for vm in self.vms.values() if vm.namespace == namespace and not vm.gone
            for c in vm.held
        }  # fmt: skip
        free = [
            n for n in self._tenant_claims(namespace)
            if n not in used and not _labelled_template(self.claims[(namespace, n)])
        ]  # fmt: skip
        held = tuple(self.rng.sample(free, k=min(len(free), self.rng.choice((0, 1, 1, 2)))))
        templates: tuple[Mapping[str, Any], ...] = ()
        if not held or self.rng.random() < 0.4:
            templates = (
                {
                    "name": self.rng.choice(("gpu", "extra")),
                    # One class with held claims most of the time: a set across the two
                    # pools never places, and stays gated (with its reason).
                    "class": (
                        str((self.claims[(namespace, held[0])].get("spec") or {}).get("class"))
                        if held and self.rng.random() < 0.8
                        else self.rng.choice(world.classes)
                    ),
                    "count": 1 if self.rng.random() < 0.8 else 2,
                },
            )
        vm = FuzzVM(namespace, self._next("vm"), held, templates)
        request: MutableObj = {}
        if held:
            request[keys.ANNOTATION_MEMBER_CLAIMS] = list(held)
        if templates:
            request[keys.ANNOTATION_MEMBER_TEMPLATES] = [dict(t) for t in templates]
        labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
        notes = {keys.ANNOTATION_CLAIMS: json.dumps(request)}
        body = self._vm_body(vm, labels, notes, [])
        names = {vm.name, *held, *(self._template_name(vm, t) for t in templates)}
        args = f"{namespace}/{vm.name} {json.dumps(request, sort_keys=True)}"
        return self._submit_vm(vm, body, args, names)

    def _op_odd_vm(self, run: Run) -> tuple[str, str, set[str]]:
        world = run.world
        namespace = self.rng.choice(world.tenants)
        note, labelled = self.rng.choice(ODD_SHAPES)
        vm = FuzzVM(namespace, self._next("odd"), (), (), odd=True)
        labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE} if labelled else {}
        notes = {keys.ANNOTATION_CLAIMS: note} if note is not None else {}
        gpus = [{"name": "raw0", "deviceName": world.resource}]
        body = self._vm_body(vm, labels, notes, gpus)
        args = f"{namespace}/{vm.name} annotation {note!r} label {labelled} raw gpus 1"
        return self._submit_vm(vm, body, args, {vm.name})

    def _pick_vm(self, odd: bool = True) -> FuzzVM | None:
        vms = [vm for vm in self.vms.values() if not vm.gone and (odd or not vm.odd)]
        return self.rng.choice(sorted(vms, key=lambda v: (v.namespace, v.name))) if vms else None

    def _run_strategy(self, vm: FuzzVM, strategy: str) -> None:
        self._vm_call(
            self.tenant.custom.patch_namespaced_custom_object, vm.namespace, vm.name,
            {"spec": {"runStrategy": strategy}},
        )  # fmt: skip

    def _names(self, vm: FuzzVM) -> set[str]:
        return {vm.name, *vm.held, *(self._template_name(vm, t) for t in vm.templates)}

    def _op_stop_vm(self, run: Run) -> tuple[str, str, set[str]]:
        vm = self._pick_vm()
        if vm is None:
            return "", "no VM", set()
        self._run_strategy(vm, "Halted")
        return f"{vm.namespace}/{vm.name}", "runStrategy Halted", self._names(vm)

    def _op_start_vm(self, run: Run) -> tuple[str, str, set[str]]:
        vm = self._pick_vm()
        if vm is None:
            return "", "no VM", set()
        self._run_strategy(vm, "Always")
        return f"{vm.namespace}/{vm.name}", "runStrategy Always", self._names(vm)

    def _vmi_call(self, call: Callable[..., Any], namespace: str, *args: Any, **kw: Any) -> Any:
        return call(keys.VMI.group, keys.VMI.version, namespace, keys.VMI.plural, *args, **kw)

    def _op_restart_vm(self, run: Run) -> tuple[str, str, set[str]]:
        """The guest shuts itself down: virt-handler reports the VMI Succeeded, and
        runStrategy Always starts the next VMI under the same name."""
        vm = self._pick_vm(odd=False)
        if vm is None:
            return "", "no VM", set()
        outcome = self.kubevirt.guest_shuts_down(vm.namespace, vm.name)
        return f"{vm.namespace}/{vm.name}", outcome, self._names(vm)

    def _op_delete_vmi(self, run: Run) -> tuple[str, str, set[str]]:
        """``kubectl delete vmi``: once its guest is shut down and its pod gone, the VM
        (runStrategy Always) starts a new one at once."""
        vm = self._pick_vm(odd=False)
        if vm is None:
            return "", "no VM", set()
        # As the admin: KubeVirt's tenant roles, which would let the tenant, are not here.
        delete = run.kube.custom.delete_namespaced_custom_object
        self._vmi_call(delete, vm.namespace, vm.name)
        return f"{vm.namespace}/{vm.name}", "VMI deleted", self._names(vm)

    def _op_delete_vm(self, run: Run) -> tuple[str, str, set[str]]:
        vm = self._pick_vm()
        if vm is None:
            return "", "no VM", set()
        self._vm_call(self.tenant.custom.delete_namespaced_custom_object, vm.namespace, vm.name)
        vm.gone = True
        return f"{vm.namespace}/{vm.name}", "VM deleted", self._names(vm)

    def _attached_pick(self) -> tuple[str, str] | None:
        """Most of the time a claim of a running VM (attached to it, or one of its template
        claims): the interesting one; else any."""
        running = self.kubevirt.running
        in_use = sorted(
            (ns, n)
            for (ns, n), c in self.claims.items()
            if (ns, str((c.get("status") or {}).get("attachedTo"))) in running
            or any(
                (ns, vm.name) in running and n == self._template_name(vm, t)
                for vm in self.vms.values()
                if vm.namespace == ns
                for t in vm.templates
            )
        )
        anything = sorted(self.claims)
        pool = in_use if in_use and self.rng.random() < 0.75 else anything
        return self.rng.choice(pool) if pool else None

    def _op_delete_claim(self, run: Run) -> tuple[str, str, set[str]]:
        picked = self._attached_pick()
        if picked is None:
            return "", "no claim", set()
        namespace, name = picked
        args = f"{namespace}/{name} ({_describe(self.claims[picked])})"
        try:
            self._claim_call(self.tenant.custom.delete_namespaced_custom_object, namespace, name)
        except ApiException as exc:
            return args, f"refused: {_message(exc)}", {name}
        return args, "deleted", {name}

    def _op_strip_finalizers(self, run: Run) -> tuple[str, str, set[str]]:
        picked = self._attached_pick()
        if picked is None:
            return "", "no claim", set()
        namespace, name = picked
        args = f"{namespace}/{name} ({_describe(self.claims[picked])})"
        custom = self.tenant.custom
        try:
            self._claim_call(custom.delete_namespaced_custom_object, namespace, name)
        except ApiException as exc:
            if exc.status != 404:
                return args, f"delete refused: {_message(exc)}", {name}
        try:
            current = self._claim_call(custom.get_namespaced_custom_object, namespace, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return args, "deleted at once: no finalizer held it", {name}
        if not _meta(current).get("finalizers"):
            return args, "gone or no finalizers to strip", {name}
        patch = [{"op": "remove", "path": "/metadata/finalizers"}]
        try:
            self._claim_call(
                custom.patch_namespaced_custom_object, namespace, name, patch,
                _content_type="application/json-patch+json", _request_timeout=TIMEOUT,
            )  # fmt: skip
        except ApiException as exc:
            return args, f"strip refused: {_message(exc)}", {name}
        return args, f"STRIPPED {_meta(current).get('finalizers')}", {name}

    def _op_cut_owner(self, run: Run) -> tuple[str, str, set[str]]:
        """The tenant cuts a VM's template claim from its VMI, so that the garbage collector
        would never delete it: its owner references removed, a second owner of its own
        added, the template label or the VMI-uid annotation taken off. The protection
        policy refuses each; a cut that passes must still not outlive the VMI
        (``ORPHANED``)."""
        running = self.kubevirt.running
        templates = sorted(
            (key for key, c in self.claims.items() if translate.made_by_template(c)),
            key=lambda k: ((k[0], str((self.claims[k].get("status") or {}).get("attachedTo")))
                           not in running, k),
        )  # fmt: skip
        if not templates:
            return "", "no template claim", set()
        namespace, name = templates[0] if self.rng.random() < 0.7 else self.rng.choice(templates)
        mode = self.rng.choice(("owners removed", "second owner", "label removed", "uid removed"))
        args = f"{namespace}/{name} ({_describe(self.claims[(namespace, name)])}): {mode}"
        patch: Any
        content_type = "application/merge-patch+json"
        if mode == "owners removed":
            patch = {"metadata": {"ownerReferences": None}}
        elif mode == "label removed":
            patch = {"metadata": {"labels": {keys.LABEL_TEMPLATE_CLAIM: None}}}
        elif mode == "uid removed":
            patch = {"metadata": {"annotations": {keys.ANNOTATION_TEMPLATE_VMI_UID: None}}}
        else:
            holder = self.tenant.core.create_namespaced_config_map(
                namespace, {"metadata": {"generateName": "holder-"}}, _request_timeout=TIMEOUT
            )
            owner = {
                "apiVersion": "v1", "kind": "ConfigMap",
                "name": holder.metadata.name, "uid": holder.metadata.uid,
            }  # fmt: skip
            patch = [{"op": "add", "path": "/metadata/ownerReferences/-", "value": owner}]
            content_type = "application/json-patch+json"
        try:
            self._claim_call(
                self.tenant.custom.patch_namespaced_custom_object, namespace, name, patch,
                _content_type=content_type, _request_timeout=TIMEOUT,
            )  # fmt: skip
        except ApiException as exc:
            return args, f"refused: {_message(exc)}", {name}
        return args, f"CUT ({mode})", {name}

    def _op_forged_pod(self, run: Run) -> tuple[str, str, set[str]]:
        """The tenant makes a pod of its own that forges a running VMI's launcher pod: the
        launcher and claims labels, an owner reference to the VMI, a GPU request. Under
        forbidden the raw-name policy refuses it (only virt-controller's launcher pods may
        request a GPU name); admitted, it would be a second pod covered by the same claims."""
        running = sorted(self.kubevirt.running)
        if not running:
            return "", "no running VMI", set()
        namespace, vm_name = self.rng.choice(running)
        vmi = kubevirt.get_vmi(run.kube, namespace, vm_name)
        if vmi is None:
            return f"{namespace}/{vm_name}", "its VMI is gone", {vm_name}
        name = self._next("forged")
        body = {
            "metadata": {
                "name": name,
                "labels": {
                    "kubevirt.io": "virt-launcher",
                    keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE,
                },
                "ownerReferences": [
                    {
                        "apiVersion": keys.VMI.api_version, "kind": keys.VMI.kind,
                        "name": vm_name, "uid": _meta(vmi)["uid"], "controller": True,
                    }
                ],
            },
            "spec": {
                "containers": [
                    {
                        "name": "compute", "image": kubevirt.LAUNCHER_IMAGE,
                        "resources": {"limits": {run.world.resource: "1"}},
                    }
                ]
            },
        }  # fmt: skip
        args = f"{namespace}/{name} forging VMI {vm_name}'s launcher pod, 1 x {run.world.resource}"
        try:
            self.tenant.core.create_namespaced_pod(namespace, body, _request_timeout=TIMEOUT)
        except ApiException as exc:
            return args, f"refused: {_message(exc)}", {vm_name, name}
        text = f"{FORGED_ADMITTED}: {namespace}/{name} (forging VMI {vm_name}'s launcher pod)"
        self.forged.append((text, self.journal.last + 1))
        log.error("seed %d: %s", self.settings.seed, text)
        run.kube.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        return args, "ADMITTED", {vm_name, name}

    def _op_nad_vm(self, run: Run) -> tuple[str, str, set[str]]:
        """A VM with a claim template and a multus network on the tenant's definition that
        names the GPU resource: KubeVirt renders a launcher pod asking a unit more than the
        template. The VMI webhook refuses it (or, the definition unread, the gate keeps the
        pod gated); a pod that starts so is ``SURPLUS``."""
        world = run.world
        namespace = self.rng.choice(world.tenants)
        if (namespace, GPU_NAD) not in self._nads:
            run.kube.nad(namespace, GPU_NAD, world.resource)
            self._nads.add((namespace, GPU_NAD))
        template = {"name": "gpu", "class": self.rng.choice(world.classes), "count": 1}
        vm = FuzzVM(namespace, self._next("net"), (), (template,))
        request = {keys.ANNOTATION_MEMBER_TEMPLATES: [template]}
        labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
        body = self._vm_body(vm, labels, {keys.ANNOTATION_CLAIMS: json.dumps(request)}, [])
        spec = body["spec"]["template"]["spec"]
        spec["domain"]["devices"]["interfaces"] = [
            {"name": "default", "masquerade": {}},
            {"name": "gpu-net", "bridge": {}},
        ]
        spec["networks"] = [
            {"name": "default", "pod": {}},
            {"name": "gpu-net", "multus": {"networkName": GPU_NAD}},
        ]
        names = {vm.name, self._template_name(vm, template)}
        args = f"{namespace}/{vm.name} template {template['class']} x1, network on {GPU_NAD}"
        return self._submit_vm(vm, body, args, names)

    def _op_squat_template(self, run: Run) -> tuple[str, str, set[str]]:
        """The tenant pre-creates a claim named like a VM's template claim, with a bigger
        count: after the VM's VMI is deleted (its own template claim goes with it), before
        the next VMI's gate runs. virt-controller makes that next VMI as soon as the old one
        is gone: the squat gets in only when the gate has not yet made its claim."""
        vms = [vm for vm in self.vms.values() if vm.templates and not vm.gone]
        if not vms:
            return "", "no VM with templates", set()
        vm = self.rng.choice(sorted(vms, key=lambda v: v.name))
        entry = vm.templates[0]
        name = self._template_name(vm, entry)
        custom = run.kube.custom
        old = kubevirt.get_vmi(run.kube, vm.namespace, vm.name)
        try:
            self._vmi_call(custom.delete_namespaced_custom_object, vm.namespace, vm.name)
        except ApiException as exc:
            if exc.status != 404:
                raise

        def claim_gone() -> bool:
            """The old VMI's template claim gone (or already the next VMI's): meanwhile the
            nodes go on (the VMI waits for its guest to shut down and its pod to go)."""
            try:
                self.kubevirt.reconcile()
            except Exception as exc:  # the server away for a moment: the next poll
                log.debug("squat: %s", exc)
            try:
                claim = self._claim_call(custom.get_namespaced_custom_object, vm.namespace, name)
            except ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            owners = {str(r.get("uid")) for r in _meta(claim).get("ownerReferences") or []}
            return old is not None and kubevirt.uid_of(old) not in owners

        # The garbage collector takes the old VMI's template claim; one still there
        # (protected, or slow) makes the create below say so.
        with contextlib.suppress(AssertionError):
            wait_for(claim_gone, 20, f"claim {name} collected", 0.5)
        owner: list[MutableObj] = []
        others = [
            v for v in self._vmi_call(custom.list_namespaced_custom_object, vm.namespace)["items"]
            if _meta(v)["name"] != vm.name
        ]  # fmt: skip
        if others and self.rng.random() < 0.6:
            # The claim webhook takes a labelled claim owned by any VMI: another of hers.
            other = self.rng.choice(others)
            owner = [
                {
                    "apiVersion": keys.VMI.api_version,
                    "kind": keys.VMI.kind,
                    "name": _meta(other)["name"],
                    "uid": _meta(other)["uid"],
                    "controller": True,
                }
            ]
        labelled = bool(owner) or self.rng.random() < 0.3
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND_CLAIM,
            "metadata": {
                "name": name,
                "labels": (
                    {keys.LABEL_TEMPLATE_CLAIM: keys.LABEL_TEMPLATE_CLAIM_VALUE} if labelled else {}
                ),
                "ownerReferences": owner,
            },
            "spec": {"class": entry["class"], "count": int(entry["count"]) + 1},
        }
        args = (
            f"{vm.namespace}/{name} x{int(entry['count']) + 1} for entry x{entry['count']}, "
            f"label {labelled}, owner {'VMI ' + owner[0]['name'] if owner else 'none'}, "
            "after its VMI was deleted"
        )
        try:
            self._claim_call(self.tenant.custom.create_namespaced_custom_object, vm.namespace, body)
        except ApiException as exc:
            return args, f"refused: {_message(exc)}", self._names(vm)
        return args, "accepted", self._names(vm)

    def _gpu_nodes(self, run: Run) -> list[str]:
        return list(run.world.nodes)

    def _node_fault(self, run: Run, fault: str) -> tuple[str, str, set[str]]:
        nodes = self._gpu_nodes(run)
        if fault == "gpu":
            # A unit no claim holds: the scheduler then refuses the next pod pinned there
            # for the GPU name. Taking a held one is a node over capacity whatever the
            # controller does next.
            held: dict[str, int] = {}
            for c in self.claims.values():
                status = c.get("status") or {}
                if status.get("nodeName") and status.get("phase") in ("Bound", "Attached", "Lost"):
                    node = str(status["nodeName"])
                    held[node] = held.get(node, 0) + int((c.get("spec") or {}).get("count") or 1)
            nodes = [n for n in nodes if held.get(n, 0) < run.world.gpus]
            if not nodes:
                return "", "no node with a unit no claim holds", set()
        node = self.rng.choice(nodes)
        kube = run.kube
        if fault == "not-ready":
            kube.node_status(node, ready=False)
        elif fault == "cordon":
            kube.cordon(node)
        elif fault == "memory":
            self._allocatable(run, node, {"memory": "512Mi"})
        elif fault == "gpu":
            # The listing above may be a tick old: a claim bound there since holds the unit
            # taken, by the hardware's doing, not the binder's (the checker is told).
            if self.checker is not None:
                self.checker.capacity_lost(node)
            self._allocatable(run, node, {run.world.resource: str(max(0, run.world.gpus - 1))})
        self.faulted.setdefault(node, set()).add(fault)
        self.faults += 1
        return node, fault, {node}

    @staticmethod
    def _allocatable(run: Run, node: str, values: Mapping[str, str]) -> None:
        """What kubelet reports when the node has less: allocatable and capacity."""
        body = {"status": {"allocatable": dict(values), "capacity": dict(values)}}
        run.kube.core.patch_node_status(node, body)

    def _op_node_not_ready(self, run: Run) -> tuple[str, str, set[str]]:
        return self._node_fault(run, "not-ready")

    def _op_node_cordon(self, run: Run) -> tuple[str, str, set[str]]:
        return self._node_fault(run, "cordon")

    def _op_node_memory_short(self, run: Run) -> tuple[str, str, set[str]]:
        return self._node_fault(run, "memory")

    def _op_node_gpu_short(self, run: Run) -> tuple[str, str, set[str]]:
        return self._node_fault(run, "gpu")

    def _op_node_restore(self, run: Run) -> tuple[str, str, set[str]]:
        if not self.faulted:
            return "", "nothing to restore", set()
        node = self.rng.choice(sorted(self.faulted))
        return self._restore(run, node, op=None)

    def _restore(self, run: Run, node: str, op: str | None) -> tuple[str, str, set[str]]:
        faults = self.faulted.pop(node, set())
        if "not-ready" in faults:
            run.kube.node_status(node, ready=True)
        if "cordon" in faults:
            run.kube.cordon(node, False)
        if "memory" in faults:
            self._allocatable(run, node, {"memory": NODE_BASE_RESOURCES["memory"]})
        if "gpu" in faults:
            self._allocatable(run, node, {run.world.resource: str(run.world.gpus)})
            if self.checker is not None:
                self.checker.capacity_restored(node)
        outcome = f"back from {', '.join(sorted(faults))}"
        if op is not None:
            self.journal.record(op, node, outcome, {node})
        return node, outcome, {node}

    def _op_kill_leader(self, run: Run) -> tuple[str, str, set[str]]:
        holder = run.holder()
        if holder is None or any(killed[0] == holder for killed in self.killed):
            return "", "no leader to kill", set()
        run.replicas[holder].kill()
        if self.service.serving == holder:  # the Service routes to the replica left
            self.service.move_to(run, next(r for r in run.replicas if r != holder))
        self.killed.append((holder, time.monotonic() + self.rng.uniform(0.5, 3.0)))
        self.kills += 1
        self.faults += 1
        return holder, "SIGKILL", {holder}


def _labelled_template(claim: Mapping[str, Any]) -> bool:
    labels = _meta(claim).get("labels") or {}
    return bool(labels.get(keys.LABEL_TEMPLATE_CLAIM) == keys.LABEL_TEMPLATE_CLAIM_VALUE)


def _items(listing: Mapping[str, Any]) -> list[MutableObj]:
    return list(listing.get("items") or [])


def _describe(claim: Mapping[str, Any]) -> str:
    status = claim.get("status") or {}
    what = "template " if _labelled_template(claim) else ""
    attached = f" attached to {status['attachedTo']}" if status.get("attachedTo") else ""
    return f"{what}{status.get('phase') or 'Pending'}{attached} on {status.get('nodeName')}"


def run_seed(workdir: Path, admission: Admission, settings: FuzzSettings) -> FuzzResult:
    """One seed on a control plane of its own."""
    return LifecycleFuzz(workdir, admission, settings).run()


_CONTROLLER_USER = re.compile(r"system:serviceaccount:[a-z0-9-]+:[a-z0-9-]*controller")


def _as_replicas(policy: MutableObj) -> MutableObj:
    """The chart's protection and launcher-gate policies exempt the controller's
    ServiceAccount; the replicas here run with the kit's admin identity, so that is the one
    they exempt."""
    name = policy.get("metadata", {}).get("name", "")
    if "protection" not in name and "launcher-gate" not in name:
        return policy
    text = _CONTROLLER_USER.sub(cluster.ADMIN_USER, json.dumps(policy))
    exempting: MutableObj = json.loads(text)
    return exempting
