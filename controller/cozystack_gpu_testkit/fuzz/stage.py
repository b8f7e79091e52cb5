"""What the operations act on (``Stage``): the seed's random source and journal, who acts,
what was made, what is broken, and the helpers the operations share (names, calls, the
VM bodies a tenant writes); the VMs the fuzz made (``FuzzVM``) and KubeVirt as the driver
sees it (``KubeVirt``)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.objects import MutableObj
from cozystack_gpu.objects.translate import meta
from cozystack_gpu_testkit.fault_suite import Run, Service
from cozystack_gpu_testkit.fuzz.journal import Journal
from cozystack_gpu_testkit.invariants import Invariants
from cozystack_gpu_testkit.objects import Kube, message_of

FUZZ_LABEL = "fuzz.cozystack.io/run"


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


@dataclass
class FuzzVM:
    namespace: str
    name: str
    held: tuple[str, ...]
    templates: tuple[Mapping[str, Any], ...]
    odd: bool = False
    gone: bool = False  # deleted: its names still explain the journal


class Stage:
    """What the operations act on and remember, one per seed: the seed's random source
    (``rng``: every choice of the run is drawn from it, in order) and ``journal``; who acts
    (``tenant``, the impersonated tenant admin; ``kubevirt``; ``service``, the webhooks'
    Service), set once the run's cluster is up (``setup.prepare``); what was made (``vms``;
    ``claims``, the driver's last listing; ``nads``, the tenants' definitions that name the
    GPU resource); what is broken (``faulted`` nodes, ``killed`` replicas due back); what
    the result counts (``faults``, ``kills``, ``forged``)."""

    run: Run
    tenant: Kube
    kubevirt: KubeVirt
    service: Service

    def __init__(self, seed: int, journal: Journal) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.journal = journal
        self.vms: dict[tuple[str, str], FuzzVM] = {}
        self.claims: dict[tuple[str, str], MutableObj] = {}  # last listing
        self.checker: Invariants | None = None
        self.faulted: dict[str, set[str]] = {}  # node -> faults in place
        self.faults = 0
        self.kills = 0
        self.killed: list[tuple[str, float]] = []  # replica, restart due (monotonic)
        self.forged: list[tuple[str, int]] = []  # (violation, journal index)
        self.nads: set[tuple[str, str]] = set()
        self.reservations: set[tuple[str, str]] = set()  # booked by the run, not cancelled
        self.migrations: set[tuple[str, str]] = set()  # VMI migrations made, not deleted
        self._seq = 0

    @staticmethod
    def template_name(vm: FuzzVM, entry: Mapping[str, Any]) -> str:
        return keys.template_claim_name(vm.name, str(entry["name"]))

    def next_name(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}{self._seq:03d}"

    def tenant_claims(self, namespace: str) -> list[str]:
        return sorted(n for ns, n in self.claims if ns == namespace)

    def claim_call(self, call: Callable[..., Any], namespace: str, *args: Any, **kw: Any) -> Any:
        return call(keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, *args, **kw)

    def vm_call(self, call: Callable[..., Any], namespace: str, *args: Any, **kw: Any) -> Any:
        return call(keys.VM.group, keys.VM.version, namespace, keys.VM.plural, *args, **kw)

    def vmi_call(self, call: Callable[..., Any], namespace: str, *args: Any, **kw: Any) -> Any:
        return call(keys.VMI.group, keys.VMI.version, namespace, keys.VMI.plural, *args, **kw)

    def vm_body(
        self, vm: FuzzVM, labels: MutableObj, notes: MutableObj, gpus: list[MutableObj]
    ) -> MutableObj:
        memory_mi = self.rng.choice((512, 1024, 2048))
        return {
            "apiVersion": keys.VM.api_version,
            "kind": keys.VM.kind,
            "metadata": {
                "name": vm.name,
                "labels": {FUZZ_LABEL: self.run.world.id},
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

    def submit_vm(
        self, vm: FuzzVM, body: MutableObj, args: str, names: set[str]
    ) -> tuple[str, str, set[str]]:
        """The tenant creates the VM; one it is refused is not the fuzz's to drive."""
        try:
            self.vm_call(self.tenant.custom.create_namespaced_custom_object, vm.namespace, body)
        except ApiException as exc:
            return args, f"refused: {message_of(exc)}", names
        self.vms[(vm.namespace, vm.name)] = vm
        return args, "created", names

    def pick_vm(self, odd: bool = True) -> FuzzVM | None:
        vms = [vm for vm in self.vms.values() if not vm.gone and (odd or not vm.odd)]
        return self.rng.choice(sorted(vms, key=lambda v: (v.namespace, v.name))) if vms else None

    def run_strategy(self, vm: FuzzVM, strategy: str) -> None:
        self.vm_call(
            self.tenant.custom.patch_namespaced_custom_object, vm.namespace, vm.name,
            {"spec": {"runStrategy": strategy}},
        )  # fmt: skip

    def names(self, vm: FuzzVM) -> set[str]:
        return {vm.name, *vm.held, *(self.template_name(vm, t) for t in vm.templates)}

    def attached_pick(self) -> tuple[str, str] | None:
        """Most of the time a claim of a running VM (attached to it, or one of its template
        claims): the interesting one; else any."""
        running = self.kubevirt.running
        in_use = sorted(
            (ns, n)
            for (ns, n), c in self.claims.items()
            if (ns, str((c.get("status") or {}).get("attachedTo"))) in running
            or any(
                (ns, vm.name) in running and n == self.template_name(vm, t)
                for vm in self.vms.values()
                if vm.namespace == ns
                for t in vm.templates
            )
        )
        anything = sorted(self.claims)
        pool = in_use if in_use and self.rng.random() < 0.75 else anything
        return self.rng.choice(pool) if pool else None


def labelled_template(claim: Mapping[str, Any]) -> bool:
    labels = meta(claim).get("labels") or {}
    return bool(labels.get(keys.LABEL_TEMPLATE_CLAIM) == keys.LABEL_TEMPLATE_CLAIM_VALUE)


def describe(claim: Mapping[str, Any]) -> str:
    status = claim.get("status") or {}
    what = "template " if labelled_template(claim) else ""
    attached = f" attached to {status['attachedTo']}" if status.get("attachedTo") else ""
    return f"{what}{status.get('phase') or 'Pending'}{attached} on {status.get('nodeName')}"
