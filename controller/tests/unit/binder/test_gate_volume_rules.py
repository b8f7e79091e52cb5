"""The gate judges a launcher pod's volumes from the binder's watches, never by reading the
API in its loop: an API server that cannot be reached, or answers slowly, cannot stop the
loop (a urllib3 error is no ApiException), and a claim whose volume binds later is judged
again on the next turn."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.binder.loop import Binder
from cozystack_gpu.binder.rules import gate
from cozystack_gpu.cluster.informer import Event, EventType
from cozystack_gpu_testkit.objects import binder_config, wait_for

RES = "nvidia.com/GH100_H100"
NS = "tenant-a"


def _nowhere() -> client.ApiClient:
    """A client for an API server that is not there: every request fails at once with a
    urllib3 connection error."""
    config = client.Configuration()
    config.host = "http://127.0.0.1:9"
    config.retries = False
    return client.ApiClient(config)


def _meta(name: str, rv: int = 1, namespace: str = "", **more: Any) -> dict[str, Any]:
    found = {"name": name, "resourceVersion": str(rv), "uid": f"uid-{name}", **more}
    if namespace:
        found["namespace"] = namespace
    return found


def _node(name: str) -> dict[str, Any]:
    return {
        "metadata": _meta(name, labels={"kubernetes.io/hostname": name}),
        "spec": {},
        "status": {
            "allocatable": {RES: "1"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _gpunode(name: str) -> dict[str, Any]:
    return {
        "metadata": _meta(name),
        "status": {"devices": [{"resourceName": RES, "allocatable": 1}]},
    }


def _listing(volume_name: str | None) -> dict[str, tuple[dict[str, Any], ...]]:
    gpu_class = {
        "metadata": _meta("h100"),
        "spec": {"mode": "passthrough", "source": {"devicePlugin": {"resourceName": RES}}},
    }
    namespace = {"metadata": _meta(NS, labels={f"tenant.cozystack.io/{NS}": ""})}
    vmi = {
        "metadata": _meta(
            "vm",
            namespace=NS,
            annotations={keys.ANNOTATION_CLAIMS: json.dumps({"claims": ["c"]})},
            labels={keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
        ),
        "spec": {},
        "status": {"phase": "Scheduling"},
    }
    pod = {
        "metadata": _meta(
            "virt-launcher-vm",
            namespace=NS,
            labels={keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
            ownerReferences=[
                {
                    "apiVersion": keys.VMI.api_version,
                    "kind": keys.VMI.kind,
                    "name": "vm",
                    "uid": "uid-vm",
                    "controller": True,
                }
            ],
        ),
        "spec": {
            "containers": [{"name": "compute"}],
            "schedulingGates": [{"name": keys.SCHEDULING_GATE_CLAIMS}],
            "volumes": [{"name": "disk", "persistentVolumeClaim": {"claimName": "disk"}}],
        },
        "status": {"phase": "Pending"},
    }
    pvc: dict[str, Any] = {
        "metadata": _meta("disk", namespace=NS),
        "spec": {"storageClassName": ""},
    }
    pvs: tuple[dict[str, Any], ...] = ()
    if volume_name is not None:
        pvc["spec"]["volumeName"] = volume_name
        pvs = (
            {
                "metadata": _meta(volume_name),
                "spec": {
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "kubernetes.io/hostname",
                                            "operator": "In",
                                            "values": ["n2"],
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                },
            },
        )
    held = {
        "metadata": _meta("c", namespace=NS, creationTimestamp="2026-12-01T10:00:00Z"),
        "spec": {"class": "h100", "count": 1},
        "status": {"phase": "Bound", "nodeName": "n1", "boundAt": "2026-12-01T10:00:01Z"},
    }
    return {
        keys.GPU_CLAIM.kind: (held,),
        keys.NODE.kind: (_node("n1"), _node("n2")),
        keys.GPU_NODE.kind: (_gpunode("n1"), _gpunode("n2")),
        keys.GPU_CLASS.kind: (gpu_class,),
        keys.NAMESPACE.kind: (namespace,),
        keys.VMI.kind: (vmi,),
        keys.POD.kind: (pod,),
        "PersistentVolumeClaim": (pvc,),
        "PersistentVolume": pvs,
    }


def test_the_gate_loop_survives_an_api_it_cannot_reach_while_a_pod_has_volumes() -> None:
    binder = Binder(_nowhere(), binder_config("ctl"))
    given = _listing("pv-local")
    for kind in binder.view.kinds:
        binder._threads.queue.put(Event(kind, EventType.LISTED, objects=given.get(kind, ())))
    binder.start()
    try:
        turned = wait_for(
            lambda: binder.failure or binder.stats.loops >= 4, 10, "the binder's loop to turn"
        )
        assert turned is True, f"the loop stopped: {binder.failure}"
        assert binder.failure is None
        assert "binder" not in binder.dead_threads()
    finally:
        binder.stop()


def test_a_pod_volume_bound_to_a_node_limits_where_its_set_may_start() -> None:
    given = _listing("pv-local")
    judged = gate.pod_volumes(
        given[keys.POD.kind][0],
        lambda name: given["PersistentVolumeClaim"][0] if name == "disk" else None,
        lambda name: given["PersistentVolume"][0] if name == "pv-local" else None,
        lambda _name: None,
    )
    assert judged.unbound == ()
    assert gate.volume_nodes(judged.volumes, given[keys.NODE.kind]) == {"n2"}


def test_a_pod_whose_claim_is_not_bound_waits_unless_it_binds_at_first_consumer() -> None:
    given = _listing(None)
    pvc = given["PersistentVolumeClaim"][0]
    judged = gate.pod_volumes(
        given[keys.POD.kind][0], lambda _n: pvc, lambda _n: None, lambda _n: None
    )
    assert judged.unbound == ("disk",)
    wffc = {"metadata": _meta("local"), "volumeBindingMode": "WaitForFirstConsumer"}
    pvc = {**pvc, "spec": {"storageClassName": "local"}}
    judged = gate.pod_volumes(
        given[keys.POD.kind][0],
        lambda _n: pvc,
        lambda _n: None,
        lambda name: wffc if name == "local" else None,
    )
    assert judged.unbound == () and judged.volumes == ()


def test_a_pod_waits_for_a_claim_not_seen_yet_and_for_the_volume_it_is_bound_to() -> None:
    given = _listing("pv-local")
    pod = given[keys.POD.kind][0]
    pvc = given["PersistentVolumeClaim"][0]
    missing = gate.pod_volumes(pod, lambda _n: None, lambda _n: None, lambda _n: None)
    assert missing.unbound == ("disk",)
    unseen = gate.pod_volumes(pod, lambda _n: pvc, lambda _n: None, lambda _n: None)
    assert unseen.unbound == ("disk",)
