"""The consequences of a layout change for claims, from API objects, with the binder's model.

The objects are the JSON the API server returns; ``consequences`` builds the binder's own
view and snapshot from them (``cozystack_gpu.cluster.view``, ``cozystack_gpu.model``), so
these tests pin what the module reports, not how the binder decides (its tests do that).
The drain itself runs against the real API server and binder in
controller/tests/integration/test_layout_drain.py; the Node and GPUNode after a change are
pinned beside ``cozystack_gpu.layout_preview`` (controller/tests/unit/test_layout_preview.py).
"""

from __future__ import annotations

import json
import time

import pytest
from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_layout_cluster as cluster

R12C = "nvidia.com/NVIDIA_L40S-12C"
VFS = [f"0000:41:00.{i}" for i in range(4, 8)]
NOW = time.time()


def stamp(seconds_ago):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - seconds_ago))


def node(name, units, **labels):
    return {
        "metadata": {
            "name": name,
            "labels": {"gpu.cozystack.io/layout-state": "applied", **labels},
        },
        "spec": {},
        "status": {
            "allocatable": {R12C: str(units)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gpunode(name, addresses):
    return {
        "metadata": {"name": name},
        "status": {
            "updatedAt": stamp(1),
            "devices": [
                {"pciAddress": a, "resourceName": R12C, "allocatable": 1, "driver": "nvidia"}
                for a in addresses
            ],
        },
    }


def claim(name, node_name, phase="Bound", bound_ago=600, attached_to=None):
    status = {"phase": phase, "nodeName": node_name, "boundAt": stamp(bound_ago)}
    if attached_to:
        status["attachedTo"] = attached_to
    return {
        "metadata": {"namespace": "t", "name": name, "creationTimestamp": stamp(3600)},
        "spec": {"class": "l40s-12c", "count": 1},
        "status": status,
    }


def world():
    """host: 4 units of l40s-12c held by a VM's pair (a, b), solo (bound last) and att
    (attached to running VMI vm-1); spare: room for two."""
    return {
        "Node": [node("host", 4), node("spare", 2)],
        "GPUNode": [gpunode("host", VFS), gpunode("spare", ["0000:81:00.4", "0000:81:00.5"])],
        "GPUClass": [
            {
                "metadata": {"name": "l40s-12c"},
                "spec": {
                    "mode": "vgpu",
                    "profile": "L40S-12C",
                    "source": {"devicePlugin": {"resourceName": R12C}},
                },
            }
        ],
        "GPUClaim": [
            claim("a", "host"),
            claim("b", "host"),
            claim("solo", "host", bound_ago=60),
            claim("att", "host", phase="Attached", attached_to="vm-1"),
        ],
        "Namespace": [{"metadata": {"name": "t", "labels": {"gpu.cozystack.io/vgpu": "true"}}}],
        "VirtualMachine": [
            {
                "metadata": {"namespace": "t", "name": "pair"},
                "spec": {
                    "template": {
                        "metadata": {
                            "annotations": {
                                "gpu.cozystack.io/claims": json.dumps({"claims": ["a", "b"]})
                            }
                        }
                    }
                },
            }
        ],
        "VirtualMachineInstance": [
            {
                "metadata": {
                    "namespace": "t",
                    "name": "vm-1",
                    "annotations": {"gpu.cozystack.io/claims": json.dumps({"claims": ["att"]})},
                },
                "status": {"phase": "Running", "nodeName": "host"},
            }
        ],
    }


def vf(address, before, after, changed=True):
    return {
        "address": address,
        "gpu": "0000:41:00.0",
        "before": {"driver": "nvidia", "devices": before},
        "after": {"driver": "nvidia", "devices": after},
        "changed": changed,
        "users": [],
    }


LOSE_ONE = [vf(VFS[3], {R12C: 1}, {})]
LABELS = {"profile.gpu.cozystack.io/NVIDIA_L40S-12C": "3"}


def test_a_class_losing_a_unit_pushes_the_last_bound_set_off_and_flags_the_attached_claim():
    holds = cluster.consequences(world(), "host", LOSE_ONE, LABELS, "l40s-12c", NOW)
    assert holds["known"] and holds["drain"]
    assert holds["classes"] == [{"class": "l40s-12c", "resource": R12C, "before": 4, "after": 3}]
    assert holds["functions"][0]["classes_before"] == ["l40s-12c"]
    assert holds["functions"][0]["classes_after"] == []
    assert [a["claims"] for a in holds["affected"]] == [["t/solo"]]
    assert holds["attached"] == [
        {
            "claim": "t/att",
            "class": "l40s-12c",
            "vmi": "t/vm-1",
            "phase": "Attached",
            "affected": True,
        }
    ]


def test_the_drain_moves_each_vms_claims_together_and_loses_what_finds_no_room():
    holds = cluster.consequences(world(), "host", LOSE_ONE, LABELS, "l40s-12c", NOW)
    assert [(m["claims"], m["to"], m["units"]) for m in holds["moves"]] == [
        (["t/a", "t/b"], "spare", 2)
    ]
    (lost,) = holds["lost"]
    # Once applied, the node keeps 3 units and only the attached claim: solo comes back.
    assert lost["claims"] == ["t/solo"] and lost["fits_after"] is True
    assert "l40s-12c" in lost["why"]


def test_a_lost_set_the_changed_node_cannot_take_back_says_so():
    three_go = [vf(a, {R12C: 1}, {}) for a in VFS[1:]]
    holds = cluster.consequences(world(), "host", three_go, {}, "l40s-12c", NOW)
    assert holds["classes"][0]["after"] == 1
    (lost,) = holds["lost"]
    assert lost["claims"] == ["t/solo"] and lost["fits_after"] is False


def test_a_change_no_hold_feels_drains_nothing():
    objects = world()
    objects["GPUClaim"] = [claim("solo", "host")]
    holds = cluster.consequences(objects, "host", LOSE_ONE, LABELS, "l40s-12c", NOW)
    assert holds["drain"] is False and holds["moves"] == [] and holds["affected"] == []
    assert "applied without draining" in cluster.render(holds)


def test_a_class_whose_selector_no_longer_matches_loses_the_node():
    objects = world()
    objects["GPUClass"][0]["spec"]["nodeSelector"] = {
        "profile.gpu.cozystack.io/NVIDIA_L40S-12C": "4"
    }
    objects["Node"][0]["metadata"]["labels"]["profile.gpu.cozystack.io/NVIDIA_L40S-12C"] = "4"
    objects["GPUClaim"] = [claim("solo", "host")]
    holds = cluster.consequences(objects, "host", LOSE_ONE, LABELS, None, NOW)
    # The node keeps 3 units, but earns profile...=3: the class selects it no more.
    assert holds["classes"] == [{"class": "l40s-12c", "resource": R12C, "before": 4, "after": 0}]
    assert [a["claims"] for a in holds["affected"]] == [["t/solo"]]


def test_labels_after_drop_what_the_host_no_longer_earns():
    labels = cluster.after_labels(
        {
            "kubernetes.io/hostname": "host",
            "profile.gpu.cozystack.io/GRID_T4-8Q": "2",
            "gpu.cozystack.io/layout-state": "pending",
        },
        {"mode.gpu.cozystack.io/vgpu": "1"},
        "L40S 12C",
    )
    assert labels == {
        "kubernetes.io/hostname": "host",
        "mode.gpu.cozystack.io/vgpu": "1",
        "gpu.cozystack.io/layout-state": "applied",
        "gpu.cozystack.io/layout": "L40S_12C",
    }


def test_an_unknown_node_is_named_with_the_fix():
    with pytest.raises(cluster.Unavailable, match=r"no Node named gpu-9.*node_name"):
        cluster.consequences(world(), "gpu-9", LOSE_ONE, LABELS, None, NOW)


def test_the_readable_diff_says_what_moves_where():
    holds = cluster.consequences(world(), "host", LOSE_ONE, LABELS, "l40s-12c", NOW)
    text = cluster.render(holds)
    assert f"{VFS[3]}: {R12C} -> nothing" in text
    assert "class l40s-12c: 4 -> 3 units (-1)" in text
    assert "move t/a, t/b -> spare" in text
    assert "Lost t/solo:" in text
    assert "attached t/att -> VMI t/vm-1 (its units go: refused without force)" in text
    assert cluster.render({"known": False, "why": "no kubeconfig"}) == (
        "claims: consequences unknown (no kubeconfig)\n"
    )


class _Drain:
    """What unattached_on answers on each look, on a clock that only the waits move."""

    def __init__(self, looks):
        self.looks = list(looks)
        self.now = 0.0
        self.told = []

    def unattached_on(self, _api, _node):
        return self.looks.pop(0) if len(self.looks) > 1 else self.looks[0]

    def sleep(self, seconds):
        self.now += seconds

    def wait(self, timeout=60.0):
        return cluster.wait_for_drain(
            None, "n1", timeout, 2.0, self.told.append, sleep=self.sleep, clock=lambda: self.now
        )


def test_the_drain_waits_for_the_binder_and_says_what_is_left(monkeypatch):
    drain = _Drain([["t/c1", "t/c2"], ["t/c1", "t/c2"], ["t/c2"], []])
    monkeypatch.setattr(cluster, "unattached_on", drain.unattached_on)
    assert drain.wait() == ["t/c1", "t/c2"]
    waits = [line for line in drain.told if "waiting for the binder to move" in line]
    assert waits[0].startswith("node n1: waiting for the binder to move 2 unattached")
    assert "(t/c2)" in waits[-1]
    assert len(waits) == 2  # told again when what is left changes, not on every look
    assert drain.told[-1] == "node n1: drained (2 claim(s) moved away or Lost)"


def test_a_drain_the_binder_finished_before_the_first_look_counts_what_it_moved(monkeypatch):
    drain = _Drain([[]])
    monkeypatch.setattr(cluster, "unattached_on", drain.unattached_on)
    left = cluster.wait_for_drain(
        None, "n1", 60.0, 2.0, drain.told.append, sleep=drain.sleep, clock=lambda: drain.now,
        before=["t/c1", "t/c2"],
    )
    assert left == []
    assert drain.told == ["node n1: drained (2 claim(s) moved away or Lost)"]


def test_a_drain_the_binder_never_finishes_names_the_claims_and_the_fix(monkeypatch):
    drain = _Drain([["t/c1"]])
    monkeypatch.setattr(cluster, "unattached_on", drain.unattached_on)
    with pytest.raises(cluster.DrainTimeout) as stuck:
        drain.wait(timeout=10.0)
    assert "did not move t/c1 off node n1 within 10 s" in str(stuck.value)
    assert "Check that the cozystack-gpu controller runs" in str(stuck.value)
