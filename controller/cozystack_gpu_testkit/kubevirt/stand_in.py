"""The KubeVirt a driver steps (the lifecycle fuzz's: ``RealKubeVirt``): KubeVirt's own
virt-controller and virt-api on the run's plane, and, once per step, what no real component
runs here, played with ``node``'s helpers: kubelet (a bound launcher pod running, a deleted
one removed) and virt-handler (a VMI virt-controller handed over reported Running on its
pod's node, a deleted VMI's guest shut down, a guest powering itself off). Every doing,
KubeVirt's own as the pass sees it and the kit's, goes to the driver's journal.

Not imported by the package: ``from cozystack_gpu_testkit.kubevirt.stand_in import
RealKubeVirt``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.objects import MutableObj, launcher
from cozystack_gpu.objects.translate import meta
from cozystack_gpu_testkit import kubevirt
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.invariants import RAW_ADMITTED
from cozystack_gpu_testkit.objects import TIMEOUT, Kube, message_of

log = logging.getLogger(__name__)


class JournalEntry(Protocol):
    """What the pass reads back of an entry it wrote."""

    @property
    def index(self) -> int: ...

    @property
    def args(self) -> str: ...

    @property
    def outcome(self) -> str: ...


class Journal(Protocol):
    """Where the pass writes what it saw and did (the fuzz's ``fuzz.journal.Journal``)."""

    @property
    def entries(self) -> Sequence[JournalEntry]: ...

    def record(self, op: str, args: str, outcome: str, names: Iterable[str]) -> JournalEntry: ...


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


def vm_of(pod: str) -> str:
    """The VM (its VMI's name) of launcher pod ``virt-launcher-<VMI>-<random>``."""
    return pod.removeprefix("virt-launcher-").rsplit("-", 1)[0]


class RealKubeVirt:
    """KubeVirt's own virt-controller and virt-api (``kubevirt.start``) on the run's control
    plane, virt-controller as ``system:serviceaccount:kubevirt:kubevirt-controller``
    (``kubevirt.USER``, the user the chart's raw-name policy exempts): its VM controller
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

    def __init__(
        self,
        plane: ControlPlane,
        kube: Kube,
        nodes: Iterable[str],
        journal: Journal,
        selector: str,
    ) -> None:
        self.kube = kube
        self.journal = journal
        self.selector = selector
        self.controller = kubevirt.start(plane)
        for node in nodes:
            kubevirt.as_virt_handler(kube.api, node)
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
            owner = str((meta(pod).get("labels") or {}).get("kubevirt.io/created-by"))
            by_vmi.setdefault(owner, []).append(pod)
            self._seen_pod(pod, owner)
        self.running = {
            (meta(v)["namespace"], meta(v)["name"])
            for v in vmis
            if (v.get("status") or {}).get("phase") == "Running"
        }
        # kubelet runs what was bound; virt-handler then shuts down deleted guests before
        # kubelet removes deleted pods: a pod gone under a guest that still runs is a crash
        # to virt-controller.
        for pod in pods:
            if not meta(pod).get("deletionTimestamp"):
                self._pass(self._kubelet_runs, pod)
        for vmi in vmis:
            self._pass(self._virt_handler, vmi, by_vmi.get(str(meta(vmi).get("uid")), []))
        for namespace in sorted(
            {meta(p)["namespace"] for p in pods if meta(p).get("deletionTimestamp")}
        ):
            for removed in kubevirt.kubelet_removes(self.kube, namespace):
                args = f"pod {namespace}/{removed}"
                self.journal.record("kubelet", args, "removed", {vm_of(removed)})

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
            log.debug("%s %s: %s", obj.get("kind"), meta(obj).get("name"), message_of(exc))
        except AssertionError as exc:  # gone meanwhile (``reports``): next pass
            log.debug("%s %s: %s", obj.get("kind"), meta(obj).get("name"), exc)

    # --- what virt-controller did ----------------------------------------------------

    def _vm_refusal(self, vm: MutableObj) -> None:
        """A VM's Failure condition: virt-controller's VMI create refused (it retries)."""
        conditions = (vm.get("status") or {}).get("conditions") or []
        failure = next(
            (c for c in conditions if c.get("type") == "Failure" and c.get("status") == "True"),
            None,
        )
        if failure is not None:
            subject = f"vm {meta(vm)['namespace']}/{meta(vm)['name']}"
            outcome = f"{failure.get('reason')}: {failure.get('message')}"
            self._outcome_once(subject, outcome, {meta(vm)["name"]})

    def _seen_vmi(self, vmi: MutableObj) -> None:
        namespace, name, uid = meta(vmi)["namespace"], meta(vmi)["name"], meta(vmi)["uid"]
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
        if meta(vmi).get("deletionTimestamp") and uid not in self._deleting:
            self._deleting.add(uid)
            self.journal.record("kubevirt", args, f"uid {uid[:8]} deleting ({phase})", {name})

    def _seen_pod(self, pod: MutableObj, vmi_uid: str) -> None:
        uid = str(meta(pod).get("uid"))
        if uid in self._pods:
            return
        self._pods.add(uid)
        namespace, name = meta(pod)["namespace"], meta(pod)["name"]
        vm = vm_of(name)
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
        self._raw.add(str(meta(vmi)["uid"]))
        note = (meta(vmi).get("annotations") or {}).get(keys.ANNOTATION_CLAIMS)
        label = (meta(vmi).get("labels") or {}).get(keys.LABEL_CLAIMS_REF)
        detail = (
            f"raw entries {[g.get('deviceName') for g in raw]}, annotation {note!r}, "
            f"label {label!r}"
        )
        self._raw_violation(meta(vmi)["namespace"], meta(vmi)["name"], what, detail)

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
        namespace, name = meta(pod)["namespace"], meta(pod)["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        if node and (pod.get("status") or {}).get("phase") != "Running":
            kubevirt.kubelet_runs(self.kube.api, namespace, name)
            names = {vm_of(name), node}
            self.journal.record("kubelet", f"pod {namespace}/{name}", f"running on {node}", names)

    def _virt_handler(self, vmi: MutableObj, pods: list[MutableObj]) -> None:
        namespace, name, uid = meta(vmi)["namespace"], meta(vmi)["name"], meta(vmi)["uid"]
        status = vmi.get("status") or {}
        args = f"vmi {namespace}/{name}"
        if meta(vmi).get("deletionTimestamp"):
            if status.get("phase") in ("Scheduled", "Running"):
                self.journal.record("virt-handler", args, "guest shut down: Succeeded", {name})
            kubevirt.shuts_down(self.kube, namespace, name)
            return
        node = status.get("nodeName")
        if status.get("phase") == "Running" and uid in self._reported and node:
            self._migrations(vmi, pods, str(node))
        if status.get("phase") != "Scheduled" or uid in self._reported or not node:
            return
        if not any(
            (p.get("spec") or {}).get("nodeName") == node
            and (p.get("status") or {}).get("phase") == "Running"
            and not meta(p).get("deletionTimestamp")
            for p in pods
        ):
            return
        kubevirt.reports(self.kube, namespace, name, "Running", node)
        self._reported.add(uid)
        self.running.add((namespace, name))
        self.starts += 1
        self.journal.record("virt-handler", args, f"uid {uid[:8]} Running on {node}", {name, node})

    def _migrations(self, vmi: MutableObj, pods: list[MutableObj], node: str) -> None:
        """virt-handler's part of a live migration (SPEC §12): a running VMI is marked
        LiveMigratable once; a target pod that runs on another node is where the VM lands
        (the migration's end written, the VMI on that node), and the source pod goes."""
        namespace, name, uid = meta(vmi)["namespace"], meta(vmi)["name"], meta(vmi)["uid"]
        if not kubevirt.is_migratable(vmi):
            kubevirt.migratable(self.kube, namespace, name)
            return
        state = (vmi.get("status") or {}).get("migrationState") or {}
        for pod in pods:
            job = launcher.migration_of(pod)
            target = (pod.get("spec") or {}).get("nodeName")
            running = (pod.get("status") or {}).get("phase") == "Running"
            if job is None or not target or target == node or not running:
                continue
            if meta(pod).get("deletionTimestamp") or (
                state.get("migrationUid") == job and state.get("completed")
            ):
                continue
            sources = [
                str(meta(p)["name"]) for p in pods if (p.get("spec") or {}).get("nodeName") == node
            ]
            kubevirt.lands(
                self.kube, namespace, name, job, node, target, meta(pod)["name"],
                sources[0] if sources else None,
            )  # fmt: skip
            args = f"vmi {namespace}/{name}"
            self.journal.record(
                "virt-handler", args, f"uid {uid[:8]} migrated {node} -> {target}", {name, target}
            )
            for source in pods:
                if (source.get("spec") or {}).get("nodeName") == node:
                    self._source_goes(namespace, str(meta(source)["name"]))
            return

    def _source_goes(self, namespace: str, pod: str) -> None:
        """The migrated VM's source pod ends (its launcher exits once the VM left)."""
        try:
            self.kube.core.delete_namespaced_pod(pod, namespace, _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def guest_shuts_down(self, namespace: str, name: str) -> str:
        """The guest powers itself off: virt-handler reports its VMI Succeeded; with
        runStrategy Always the VM controller then makes the next VMI under the same name."""
        vmi = kubevirt.get_vmi(self.kube, namespace, name)
        phase = ((vmi or {}).get("status") or {}).get("phase")
        if vmi is None or phase != "Running" or meta(vmi).get("deletionTimestamp"):
            return f"no guest running (VMI {phase or 'none'})"
        kubevirt.retried_on_conflict(
            lambda: kubevirt.reports(self.kube, namespace, name, "Succeeded")
        )
        return "guest shut down: VMI Succeeded"
