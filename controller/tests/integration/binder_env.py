"""One binder test's corner of the real cluster: its own namespaces, nodes and classes
named uniquely, with class node selectors on a per-test label, so claims and nodes of
other tests never meet; ``Env`` adds a fresh binder. The fixtures are in this
directory's conftest.py."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.binder.loop import Binder
from cozystack_gpu_testkit import tenants
from cozystack_gpu_testkit.objects import Kube, binder_config, unless, wait_for

GRACE_S = 2.0


@dataclass
class Corner:
    """One test's corner of the cluster, with no binder: tests that run their own (on a
    proxy, as replicas, with a Lease) take this (the ``corner`` fixture)."""

    kube: Kube
    id: str
    tenant: str
    controller_ns: str

    @classmethod
    def make(cls, kube: Kube) -> Corner:
        """A fresh corner: its controller namespace and its tenant namespace."""
        test_id = uuid.uuid4().hex[:8]
        corner = cls(kube, test_id, f"tenant-{test_id}", f"ctl-{test_id}")
        kube.namespace(corner.controller_ns)
        kube.namespace(corner.tenant, {f"tenant.cozystack.io/{corner.tenant}": ""})
        return corner

    @property
    def selector(self) -> dict[str, str]:
        return {"test.cozystack.io/id": self.id}

    def name(self, base: str) -> str:
        return f"{base}-{self.id}"

    def clean_up(self) -> None:
        """Deletes what this test made: its namespaces (with their claims and VMIs), its
        labelled nodes with their GPUNodes, and its classes. Later tests share the cluster,
        and each starts a binder that would otherwise judge every earlier test's leftovers
        again (their inventories going stale after a few minutes, their claims Lost)."""
        label = ",".join(f"{k}={v}" for k, v in self.selector.items())
        custom, core = self.kube.custom, self.kube.core
        # The claims first, while their nodes still stand: with the nodes gone first, each
        # later test's binder judged them Lost until the namespace controller got round to
        # them (1,500 Lose writes after the restart test, the settings write queued behind).
        # No binder runs now to lift a claim's finalizer: the clean-up lifts it.
        for claim in self.kube.claims(self.tenant):
            if claim["metadata"].get("finalizers"):
                name = claim["metadata"]["name"]
                unless(
                    404,
                    lambda name=name: custom.patch_namespaced_custom_object(
                        keys.GROUP, keys.VERSION, self.tenant, keys.PLURAL_CLAIMS, name,
                        {"metadata": {"finalizers": None}},
                    ),
                )  # fmt: skip
        unless(
            404,
            lambda: custom.delete_collection_namespaced_custom_object(
                keys.GROUP, keys.VERSION, self.tenant, keys.PLURAL_CLAIMS
            ),
        )
        wait_for(lambda: not self.kube.claims(self.tenant), 30, f"{self.tenant}'s claims deleted")
        for node in core.list_node(label_selector=label).items:
            name = node.metadata.name
            unless(404, lambda name=name: core.delete_node(name))
            unless(
                404,
                lambda name=name: custom.delete_cluster_custom_object(
                    keys.GROUP, keys.VERSION, keys.PLURAL_NODES, name
                ),
            )
        for gpu_class in custom.list_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES
        )["items"]:
            name = gpu_class["metadata"]["name"]
            if name.endswith(f"-{self.id}"):
                unless(
                    404,
                    lambda name=name: custom.delete_cluster_custom_object(
                        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name
                    ),
                )
        for namespace in (self.tenant, self.controller_ns):
            unless(404, lambda namespace=namespace: core.delete_namespace(namespace))

    def tenant_admin(self) -> Kube:
        """The API as the tenant admin of this corner's tenant namespace (the built-in
        ``admin`` role there, the chart's claim roles and KubeVirt's VM rights aggregated
        into it): for the step of a test that is a tenant's attack."""
        return tenants.as_tenant_admin(self.kube.api, f"admin-{self.tenant}", [self.tenant])

    def node(self, base: str, gpus: int, resource: str | None = None, **kwargs: Any) -> str:
        name = self.name(base)
        labels = {**self.selector, **kwargs.pop("labels", {})}
        self.kube.gpu_node(name, resource or self.resource, gpus, labels=labels, **kwargs)
        return name

    @property
    def resource(self) -> str:
        return f"nvidia.com/GPU_{self.id}"

    def gpu_class(self, base: str = "h100", **spec: Any) -> str:
        name = self.name(base)
        resource = spec.pop("resource", self.resource)
        self.kube.gpu_class(name, resource, selector=self.selector, **spec)
        return name

    def nodes(self, count: int, gpus: int) -> list[str]:
        """``count`` nodes n0, n1… of ``gpus`` units of this test's resource each."""
        return [self.node(f"n{i}", gpus) for i in range(count)]

    def phase(self, claim: str, namespace: str | None = None) -> str | None:
        obj = self.kube.get_claim(namespace or self.tenant, claim)
        return (obj.get("status") or {}).get("phase")

    def wait_phase(
        self, claim: str, phase: str, namespace: str | None = None, timeout: float = 15.0
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            # Absent counts as not yet: a window's claim is made after its reservation
            # says Active, so a test that saw Active may look before the create lands.
            obj = unless(404, lambda: self.kube.get_claim(namespace or self.tenant, claim))
            return obj if obj and (obj.get("status") or {}).get("phase") == phase else None

        result: dict[str, Any] = wait_for(check, timeout, f"claim {claim} {phase}")
        return result


@dataclass
class Env(Corner):
    """One test's corner of the cluster with a fresh binder of its own (the ``env``
    fixture)."""

    binder: Binder

    def restart_binder(self, **settings: Any) -> None:
        """Run this test's binder again with other settings (a fresh listing)."""
        self.binder.stop()
        config = binder_config(self.controller_ns, attachment_grace=GRACE_S, **settings)
        self.binder = Binder(self.kube.api, config)
        self.binder.start()
        assert self.binder.synced.wait(30), "the binder did not finish its first listing"

    def attached(self, node: str, gpu_class: str, *, phase: str = "Running") -> dict[str, Any]:
        """Claim "c" ordered, bound, and attached to VMI "vm" running on ``node``, as the
        VMI webhook and KubeVirt would leave it."""
        self.kube.claim(self.tenant, "c", gpu_class, 1)
        self.wait_phase("c", "Bound")
        self.kube.attach(self.tenant, "c", "vm")
        vmi_node = node if phase == "Running" else None
        self.kube.vmi(self.tenant, "vm", claims=["c"], phase=phase, node=vmi_node)
        return self.wait_phase("c", "Attached")

    def gated_vmi(
        self, name: str, annotation: str, *, labelled: bool = True, units: int = 0
    ) -> dict[str, Any]:
        """A VMI stored as written, with no VMI webhook (``annotation`` as it is, the
        reference label when ``labelled``), and its launcher pod held at the gate, asking
        for ``units`` of this test's resource."""
        labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE} if labelled else {}
        notes = {keys.ANNOTATION_CLAIMS: annotation}
        vmi: dict[str, Any] = self.kube.custom.create_namespaced_custom_object(
            keys.VMI.group,
            keys.VMI.version,
            self.tenant,
            keys.VMI.plural,
            {
                "apiVersion": keys.VMI.api_version,
                "kind": keys.VMI.kind,
                "metadata": {"name": name, "labels": labels, "annotations": notes},
                "spec": {"domain": {"devices": {}}},
            },
        )
        owner = {"apiVersion": keys.VMI.api_version, "kind": keys.VMI.kind, "name": name}
        requests = {self.resource: str(units)} if units else {}
        compute = {"name": "compute", "image": "virt-launcher"}
        self.kube.core.create_namespaced_pod(
            self.tenant,
            {
                "metadata": {
                    "name": f"virt-launcher-{name}",
                    "labels": {"kubevirt.io": "virt-launcher", **labels},
                    "ownerReferences": [
                        {**owner, "uid": vmi["metadata"]["uid"], "controller": True}
                    ],
                },
                "spec": {
                    "containers": [
                        {**compute, "resources": {"requests": requests, "limits": requests}}
                    ],
                    "schedulingGates": [{"name": keys.SCHEDULING_GATE_CLAIMS}],
                },
            },
        )
        return vmi


def condition(obj: dict[str, Any], type_: str = keys.CONDITION_BOUND) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return dict(cond)
    return {}
