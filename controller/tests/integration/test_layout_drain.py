"""Changing a node's GPU layout under claims, against the real API server and a real binder.

The host is a sysfs fixture tree; its GPUNode is what the node agent reports for it
(``build_report`` over kubelet's answer for the tree). ``gpu_node_layout`` runs the way a
play runs it (``ansible`` with the collection on its path: the action plugin on this side,
the module on the "host"), against this test's binder:

* the binder's side: a node marked ``layout-state=pending`` serves nothing; its unattached
  claims leave as sets, to another node or ``Lost``; attached ones stay;
* check mode reports the classes that lose units, the holds the change pushes off, where the
  drain moves the node's sets and which are attached, under an identity that may only read,
  and the fixture tree hashes the same before and after;
* an affected attached claim makes the run refuse, naming its VMI; ``force`` names the VMIs
  it breaks;
* the real run drains the node, applies the layout, marks it applied with the labels the
  host now earns; a second run changes nothing;
* one model in both modes: an L40S passthrough node and an L40S vGPU node, two classes,
  each serving only its own node.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from binder_env import Env, condition
from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.agent import sysfs
from cozystack_gpu.agent.podresources.client import DeviceSet
from cozystack_gpu.agent.report import build_report
from cozystack_gpu_testkit import sysfs_tree
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.fake_kubelet import plugin_devices
from cozystack_gpu_testkit.objects import wait_for

pytestmark = pytest.mark.apiserver

COLLECTION_ROOT = Path(__file__).resolve().parents[3]
PF = "0000:41:00.0"
VF0, VF1 = sysfs_tree.vf_address(PF, 0), sysfs_tree.vf_address(PF, 1)
R12C = "nvidia.com/NVIDIA_L40S-12C"
R24C = "nvidia.com/NVIDIA_L40S-24C"
RL40S = "nvidia.com/AD102GL_L40S"

Layout = Callable[..., dict[str, Any]]


def tree_digest(root: Path) -> str:
    """One hash over every path, file and link target below ``root``."""
    digest = hashlib.sha256()
    for base, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(base, name)
            digest.update(os.path.relpath(path, root).encode())
            if os.path.islink(path):
                digest.update(b"->" + os.readlink(path).encode())
            elif os.path.isfile(path):
                digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def report_gpunode(env: Env, node: str, root: Path) -> None:
    """Write the node's GPUNode as the agent would for this tree (every device healthy)."""
    inventory = sysfs.read_inventory(str(root))
    advertised = [DeviceSet(name, tuple(ids)) for name, ids in plugin_devices(inventory).items()]
    report = build_report(inventory, advertised, [], lambda _ns, _name: None)
    env.kube.gpunode(node, report.devices)


def host_node(env: Env, base: str, root: Path, layout: str, **labels: str) -> str:
    """A Node for the fixture host below ``root``, labelled as the node_labels role would."""
    from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_node_labels

    inventory = sysfs.read_inventory(str(root))
    name = env.name(base)
    allocatable: dict[str, int] = {}
    for resource, ids in plugin_devices(inventory).items():
        allocatable[resource] = len(ids)
    node_labels = {
        **env.selector,
        **gpu_node_labels.gpu_labels(inventory),
        keys.LABEL_NODE_LAYOUT: layout,
        keys.LABEL_NODE_LAYOUT_STATE: "applied",
        **labels,
    }
    env.kube.node(name, labels=node_labels, allocatable=allocatable)
    report_gpunode(env, name, root)
    return name


@pytest.fixture(scope="module", autouse=True)
def collections_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding ansible_collections/cozystack/gpu -> this checkout, on the path of
    ``ansible`` runs and of this process (the labels rule is the collection's)."""
    base = tmp_path_factory.mktemp("collections")
    namespace = base / "ansible_collections" / "cozystack"
    namespace.mkdir(parents=True)
    (namespace / "gpu").symlink_to(COLLECTION_ROOT, target_is_directory=True)
    sys.path.insert(0, str(base))
    return base


@pytest.fixture
def layout(control_plane: ControlPlane, collections_path: Path, tmp_path: Path) -> Layout:
    """Run gpu_node_layout through ``ansible`` (action plugin and module); its result."""

    def _run(
        check: bool = False, diff: bool = False, identity: str | None = None, **args: Any
    ) -> dict[str, Any]:
        args.setdefault("kubeconfig", str(control_plane.kubeconfig))
        args.setdefault("nvidia_smi", "/nonexistent")
        args.setdefault("drain_poll", 0.5)
        if identity is not None:
            args["impersonate_user"] = identity
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "K8S_AUTH"))}
        env.update(
            ANSIBLE_COLLECTIONS_PATH=str(collections_path),
            ANSIBLE_LOCAL_TEMP=str(tmp_path / ".ansible-tmp"),
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_DEPRECATION_WARNINGS="false",
            # The whole result, diff included, as JSON after what the run displayed.
            ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
            ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        )
        argv = [
            str(Path(sys.executable).parent / "ansible"),
            "localhost",
            "-c",
            "local",
            "-i",
            "localhost,",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "-m",
            "cozystack.gpu.gpu_node_layout",
            "-a",
            json.dumps(args),
        ]
        argv += ["--check"] if check else []
        argv += ["--diff"] if diff else []
        done = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=300, check=False
        )
        shown, brace, document = done.stdout.partition("\n{\n")
        if not brace and done.stdout.startswith("{\n"):
            shown, brace, document = "", "{", done.stdout[1:]
        assert brace, f"no result from ansible:\n{done.stdout}\n{done.stderr}"
        report = json.loads("{" + document)
        result: dict[str, Any] = report["plays"][0]["tasks"][0]["hosts"]["localhost"]
        result["_stdout"] = shown
        return result

    return _run


def read_only_identity(env: Env) -> str:
    """A user that may get, list and watch what the cluster part reads, and nothing else."""
    user = f"layout-reader-{env.id}"
    rbac = client.RbacAuthorizationV1Api(env.kube.api)
    rbac.create_cluster_role(
        {
            "metadata": {"name": user},
            "rules": [
                {
                    "apiGroups": ["", keys.GROUP, keys.KUBEVIRT_GROUP],
                    "resources": [
                        "nodes",
                        "namespaces",
                        "resourcequotas",
                        "pods",
                        keys.PLURAL_CLASSES,
                        keys.PLURAL_CLAIMS,
                        keys.PLURAL_NODES,
                        keys.PLURAL_RESERVATIONS,
                        "virtualmachineinstances",
                        "virtualmachines",
                        "persistentvolumeclaims",
                        "persistentvolumes",
                    ],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": [keys.STORAGE_CLASS.group],
                    "resources": [keys.STORAGE_CLASS.plural],
                    "verbs": ["get", "list", "watch"],
                },
            ],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": user},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": user,
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
    )
    return user


def vm(env: Env, name: str, claims: list[str]) -> None:
    """A stopped VirtualMachine whose template names ``claims``: they form one set."""
    env.kube.custom.create_namespaced_custom_object(
        keys.KUBEVIRT_GROUP,
        keys.KUBEVIRT_VERSION,
        env.tenant,
        "virtualmachines",
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "metadata": {"name": name},
            "spec": {
                "runStrategy": "Halted",
                "template": {
                    "metadata": {
                        "annotations": {keys.ANNOTATION_CLAIMS: json.dumps({"claims": claims})}
                    },
                    "spec": {"domain": {"devices": {}}},
                },
            },
        },
    )


def entitle(env: Env) -> None:
    """vGPU classes need the tenant's entitlement label."""
    env.kube.core.patch_namespace(
        env.tenant,
        {"metadata": {"labels": {keys.LABEL_VGPU_ENTITLEMENT: keys.VGPU_ENTITLEMENT_VALUE}}},
    )


def node_of(env: Env, claim: str) -> str | None:
    return (env.kube.get_claim(env.tenant, claim).get("status") or {}).get("nodeName")


def gpunode_ready(env: Env, node: str) -> dict[str, Any]:
    obj = env.kube.custom.get_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_NODES, node
    )
    return condition(obj, keys.CONDITION_READY)


def labels_of(env: Env, node: str) -> dict[str, str]:
    return dict(env.kube.core.read_node(node).metadata.labels or {})


# --- the binder's side ---------------------------------------------------------------------


def test_a_pending_node_serves_nothing_and_its_unattached_sets_leave_as_sets(env: Env) -> None:
    gpu_class = env.gpu_class()
    changing = env.node("changing", 4)
    vm(env, "pair", ["a", "b"])
    for claim in ("a", "b", "solo", "c"):
        env.kube.claim(env.tenant, claim, gpu_class, 1)
        assert env.wait_phase(claim, "Bound")["status"]["nodeName"] == changing
    env.kube.attach(env.tenant, "c", "running")
    env.kube.vmi(env.tenant, "running", claims=["c"], node=changing)
    env.wait_phase("c", "Attached")
    # Room elsewhere for the pair only: the lone claim goes Lost.
    other = env.node("other", 2)
    env.kube.core.patch_node(
        changing, {"metadata": {"labels": {keys.LABEL_NODE_LAYOUT_STATE: "pending"}}}
    )
    wait_for(lambda: node_of(env, "a") == other, what="claim a moved")
    assert node_of(env, "b") == other, "the VM's claims move together"
    env.wait_phase("solo", "Lost")
    assert env.phase("c") == "Attached" and node_of(env, "c") == changing
    ready = wait_for(
        lambda: (r := gpunode_ready(env, changing)).get("reason") == "LayoutPending" and r,
        what="GPUNode Ready=False LayoutPending",
    )
    assert ready["status"] == "False"
    # A pending node takes no order either.
    env.kube.claim(env.tenant, "late", gpu_class, 1)
    late = env.wait_phase("late", "Pending")
    assert (late.get("status") or {}).get("nodeName") is None


# --- the layout change, end to end ---------------------------------------------------------


@pytest.fixture
def l40s_host(env: Env, tmp_path: Path) -> tuple[Path, str, str]:
    """A host with one L40S whose first two VFs carry NVIDIA L40S-12C (layout count 2), its
    Node and GPUNode, a class of that profile on this test's nodes, and a second node with
    room for two such vGPUs. Returns (tree root, host node, other node)."""
    root = tmp_path / "host"
    sysfs_tree.build(
        root,
        [
            sysfs_tree.Gpu(
                PF,
                sysfs_tree.L40S,
                driver="nvidia",
                vfs=4,
                profiles={0: "NVIDIA L40S-12C", 1: "NVIDIA L40S-12C"},
            )
        ],
    )
    host = host_node(env, "l40s", root, "l40s-12c")
    env.gpu_class("l40s-12c", resource=R12C, mode="vgpu", profile="L40S-12C")
    entitle(env)
    return root, host, env.name("spare")


def l40s_layout(count: int) -> dict[str, Any]:
    return {
        "name": "l40s-12c",
        "gpus": [{"address": PF, "mode": "vgpu", "profile": "NVIDIA L40S-12C", "count": count}],
    }


def test_check_mode_lists_the_holds_and_writes_nothing(
    env: Env, l40s_host: tuple[Path, str, str], layout: Layout
) -> None:
    root, host, spare = l40s_host
    gpu_class = env.name("l40s-12c")
    for claim in ("c1", "c2"):
        env.kube.claim(env.tenant, claim, gpu_class, 1)
        assert env.wait_phase(claim, "Bound")["status"]["nodeName"] == host
    env.node("spare", 2, resource=R12C)
    env.kube.attach(env.tenant, "c1", "vm-1")
    env.kube.vmi(env.tenant, "vm-1", claims=["c1"], node=host)
    env.wait_phase("c1", "Attached")
    reader = read_only_identity(env)
    before_tree = tree_digest(root)
    before_node = env.kube.core.read_node(host).metadata.resource_version
    before_claims = [c["metadata"]["resourceVersion"] for c in env.kube.claims(env.tenant)]

    result = layout(
        check=True,
        diff=True,
        identity=reader,
        layout=l40s_layout(1),
        root=str(root),
        node_name=host,
    )

    assert result.get("failed") is not True, result.get("msg")
    assert result["changed"] is True
    assert [s["action"] for s in result["plan"]["steps"]] == ["clear_vgpu_type"]
    holds = result["holds"]
    assert holds["known"] is True and holds["drain"] is True
    assert {"class": gpu_class, "resource": R12C, "before": 2, "after": 1} in holds["classes"]
    (vf,) = holds["functions"]
    assert (vf["address"], vf["before"], vf["after"]) == (VF1, {R12C: 1}, {})
    assert vf["classes_before"] == [gpu_class] and vf["classes_after"] == []
    assert [a["claims"] for a in holds["affected"]] == [[f"{env.tenant}/c2"]]
    assert holds["moves"] == [
        {"claims": [f"{env.tenant}/c2"], "classes": [gpu_class], "units": 1, "to": spare}
        | ({"why": holds["moves"][0]["why"]} if "why" in holds["moves"][0] else {})
    ]
    assert holds["attached"] == [
        {
            "claim": f"{env.tenant}/c1",
            "class": gpu_class,
            "vmi": f"{env.tenant}/vm-1",
            "phase": "Attached",
            "affected": True,
        }
    ]
    host_diff, claims_diff = result["diff"]
    assert host_diff["after"][PF]["vfs"][VF1] == 0
    text = claims_diff["prepared"]
    assert f"class {gpu_class}: 2 -> 1 units (-1)" in text
    assert f"move {env.tenant}/c2 -> {spare}" in text
    assert f"attached {env.tenant}/c1 -> VMI {env.tenant}/vm-1 (its units go" in text
    # Nothing written: not the host, not the Node, not a claim.
    assert tree_digest(root) == before_tree
    assert env.kube.core.read_node(host).metadata.resource_version == before_node
    assert [c["metadata"]["resourceVersion"] for c in env.kube.claims(env.tenant)] == before_claims


def test_without_a_kubeconfig_the_consequences_are_unknown(
    l40s_host: tuple[Path, str, str], layout: Layout
) -> None:
    root, host, _spare = l40s_host
    result = layout(
        check=True, kubeconfig=None, layout=l40s_layout(1), root=str(root), node_name=host
    )
    assert result["holds"]["known"] is False
    assert "no kubeconfig" in result["holds"]["why"]
    # Without the cluster, removing a vGPU is the operator's call: it needs force.
    assert "set force" in result["msg"]


def test_the_drain_moves_the_holds_applies_the_layout_and_marks_the_node(
    env: Env, l40s_host: tuple[Path, str, str], layout: Layout
) -> None:
    root, host, spare = l40s_host
    gpu_class = env.name("l40s-12c")
    for claim in ("c1", "c2"):
        env.kube.claim(env.tenant, claim, gpu_class, 1)
        env.wait_phase(claim, "Bound")
    env.node("spare", 2, resource=R12C)
    env.kube.attach(env.tenant, "c1", "vm-1")
    env.kube.vmi(env.tenant, "vm-1", claims=["c1"], node=host)
    env.wait_phase("c1", "Attached")

    refused = layout(layout=l40s_layout(1), root=str(root), node_name=host)
    assert refused["failed"] is True
    assert f"{env.tenant}/c1 (VMI {env.tenant}/vm-1)" in refused["msg"]
    assert "set force: true" in refused["msg"]
    assert labels_of(env, host)[keys.LABEL_NODE_LAYOUT_STATE] == "applied"
    assert sysfs_tree.SysfsTree.open(root).current_vgpu_type(VF1) != 0

    env.kube.delete_vmi(env.tenant, "vm-1")  # the VM stops: its claim is held, unattached
    env.wait_phase("c1", "Bound")
    done = layout(layout=l40s_layout(1), root=str(root), node_name=host)
    assert done.get("failed") is not True, done.get("msg")
    assert done["changed"] is True
    assert sorted(done["holds"]["drained"]) == [f"{env.tenant}/c1", f"{env.tenant}/c2"]
    # Whether the binder moved them before the drain's first look is timing; that the drain
    # waits and what it says meanwhile is tested in tests/unit (wait_for_drain).
    assert f"node {host}: drained" in done["_stdout"]
    assert node_of(env, "c1") == spare and node_of(env, "c2") == spare
    tree = sysfs_tree.SysfsTree.open(root)
    assert (tree.current_vgpu_type(VF0), tree.current_vgpu_type(VF1)) == (1153, 0)
    labels = labels_of(env, host)
    assert labels[keys.LABEL_NODE_LAYOUT_STATE] == "applied"
    assert labels[keys.NODE_PROFILE_LABEL_PREFIX + "NVIDIA_L40S-12C"] == "1"

    again = layout(layout=l40s_layout(1), root=str(root), node_name=host)
    assert again.get("failed") is not True, again.get("msg")
    assert again["changed"] is False and again["plan"]["steps"] == []


def test_force_goes_on_under_attached_claims_and_names_what_it_breaks(
    env: Env, l40s_host: tuple[Path, str, str], layout: Layout
) -> None:
    root, host, _spare = l40s_host
    gpu_class = env.name("l40s-12c")
    env.kube.claim(env.tenant, "c1", gpu_class, 1)
    env.wait_phase("c1", "Bound")
    env.kube.attach(env.tenant, "c1", "vm-1")
    env.kube.vmi(env.tenant, "vm-1", claims=["c1"], node=host)
    env.wait_phase("c1", "Attached")
    forced = layout(force=True, layout=l40s_layout(1), root=str(root), node_name=host)
    assert forced.get("failed") is not True, forced.get("msg")
    assert forced["holds"]["breaks"] == [f"{env.tenant}/vm-1"]
    assert any("breaks the VMIs" in w for w in forced["warnings"])
    assert sysfs_tree.SysfsTree.open(root).current_vgpu_type(VF1) == 0
    assert env.phase("c1") == "Attached" and node_of(env, "c1") == host
    assert labels_of(env, host)[keys.LABEL_NODE_LAYOUT_STATE] == "applied"


# --- one model in both modes ---------------------------------------------------------------


def test_l40s_passthrough_and_l40s_vgpu_nodes_each_serve_only_their_own_class(
    env: Env, tmp_path: Path
) -> None:
    whole, split = tmp_path / "whole", tmp_path / "split"
    sysfs_tree.build(whole, [sysfs_tree.Gpu(PF, sysfs_tree.L40S, driver="vfio-pci")])
    sysfs_tree.build(
        split,
        [
            sysfs_tree.Gpu(
                PF,
                sysfs_tree.L40S,
                driver="nvidia",
                vfs=4,
                profiles={0: "NVIDIA L40S-24C", 1: "NVIDIA L40S-24C"},
            )
        ],
    )
    passthrough = host_node(env, "l40s-pt", whole, "l40s-passthrough")
    vgpu = host_node(env, "l40s-vgpu", split, "l40s-24c")
    entitle(env)
    # The same card model in both modes: the layout label tells the nodes apart.
    whole_class, split_class = env.name("l40s"), env.name("l40s-24c")
    env.kube.gpu_class(
        whole_class,
        RL40S,
        model="L40S",
        selector={**env.selector, keys.LABEL_NODE_LAYOUT: "l40s-passthrough"},
    )
    env.kube.gpu_class(
        split_class,
        R24C,
        mode="vgpu",
        model="L40S",
        profile="L40S-24C",
        selector={**env.selector, keys.LABEL_NODE_LAYOUT: "l40s-24c"},
    )
    labels = labels_of(env, passthrough)
    assert labels[keys.NODE_MODEL_LABEL_PREFIX + "AD102GL_L40S"] == "1"
    assert labels[keys.NODE_MODE_LABEL_PREFIX + "passthrough"] == "1"
    assert labels_of(env, vgpu)[keys.NODE_PROFILE_LABEL_PREFIX + "NVIDIA_L40S-24C"] == "2"

    def status(name: str) -> dict[str, Any]:
        obj = env.kube.custom.get_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name
        )
        return dict(obj.get("status") or {})

    wait_for(lambda: status(whole_class).get("free") == 1, what="l40s free 1")
    wait_for(lambda: status(split_class).get("free") == 2, what="l40s-24c free 2")
    assert status(whole_class)["maxFreePerNode"] == 1
    assert status(split_class)["maxFreePerNode"] == 2

    env.kube.claim(env.tenant, "whole", whole_class, 1)
    assert env.wait_phase("whole", "Bound")["status"]["nodeName"] == passthrough
    for claim in ("split-1", "split-2"):
        env.kube.claim(env.tenant, claim, split_class, 1)
        assert env.wait_phase(claim, "Bound")["status"]["nodeName"] == vgpu
    # Both nodes carry an L40S, yet neither serves the other's class.
    env.kube.claim(env.tenant, "split-3", split_class, 1)
    waiting = env.wait_phase("split-3", "Pending")
    assert "nodeName" not in (waiting.get("status") or {})
    env.kube.claim(env.tenant, "whole-2", whole_class, 1)
    assert "nodeName" not in (env.wait_phase("whole-2", "Pending").get("status") or {})
