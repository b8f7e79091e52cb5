"""Objects the latest release stored survive this tree's CRDs on a real API server.

The CRDs of the latest entry in releases.yaml (read from git history) are installed on a
plane of this module's own, a GPUClass, a GPUClaim and a GPUNode are stored with the fields
and status that release writes, then this tree's CRDs replace the old ones. Each object must
read back byte for byte, take a no-op update without changing, and take a status update.

The plane is this module's: the session's plane serves this tree's CRDs to every other
test, and putting an old schema under them would be a test of its own.
"""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster

pytestmark = pytest.mark.apiserver

REPO = Path(__file__).resolve().parents[3]
CRD_DIR = "controller/cozystack_gpu/crds"
NAMESPACE = "tenant-upgrade"
T0, T1 = "2026-11-30T08:00:00Z", "2026-11-30T08:00:05Z"


def _latest_release() -> tuple[str, str]:
    newest = yaml.safe_load((REPO / "releases.yaml").read_text())["releases"][-1]
    return str(newest["version"]), str(newest["commit"])


def _released_crds(commit: str, into: Path) -> list[Path]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout

    paths = []
    for name in git("ls-tree", "--name-only", f"{commit}:{CRD_DIR}").split():
        if name.endswith(".yaml"):
            path = into / name
            path.write_text(git("show", f"{commit}:{CRD_DIR}/{name}"))
            paths.append(path)
    return paths


@pytest.fixture(scope="module")
def released_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.ControlPlane]:
    _version, commit = _latest_release()
    crds = _released_crds(commit, tmp_path_factory.mktemp("released-crds"))
    plane = cluster.start(crds=crds)
    try:
        yield plane
    finally:
        plane.stop()


def _condition(kind: str, status: str, reason: str, message: str, at: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": at,
        "observedGeneration": 1,
    }


# What the release writes: the hoster's class (with the binder's finalizer and status), a
# tenant's claim attached to a running VM (the binder's finalizer and full attachment
# status), and the agent's inventory of a vGPU host.
CLASS = {
    "metadata": {"name": "l40s-24c", "finalizers": [keys.FINALIZER_CLASS]},
    "spec": {
        "vendor": "nvidia",
        "model": "L40S",
        "mode": "vgpu",
        "profile": "L40S-24C",
        "displayName": "NVIDIA L40S, 24 GB vGPU",
        "memory": "24Gi",
        "maxCount": 2,
        "nodeSelector": {"gpu.cozystack.io/layout": "l40s-mixed"},
        "onCordon": "Stay",
        "source": {"devicePlugin": {"resourceName": "nvidia.com/NVIDIA_L40S-24C"}},
        "license": {"secretRef": {"name": "nvidia-licence", "key": "token"}, "featureType": 4},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "status": {
        "free": 3,
        "maxFreePerNode": 2,
        "conditions": [_condition("Ready", "True", "Serving", "3 units free on 2 nodes", T0)],
    },
}
CLAIM = {
    "metadata": {
        "name": "vm-a-gpu",
        "namespace": NAMESPACE,
        "finalizers": [keys.FINALIZER_CLAIM],
        "labels": {"app": "vm-a"},
    },
    "spec": {"class": "l40s-24c", "count": 1},
    "status": {
        "phase": "Attached",
        "nodeName": "gpu-node-1",
        "boundAt": T0,
        "attachedTo": "vm-a",
        "attachedToUID": "6f1c2a9e-7d3b-4c1e-9a55-0b8f3d2e1c4a",
        "attachmentID": "a1b2c3d4",
        "attachedAt": T0,
        "rejectedNodes": [{"node": "gpu-node-2", "until": T1, "nodeState": "Cordoned"}],
        "conditions": [
            _condition("Bound", "True", "Bound", "bound to gpu-node-1", T0),
            _condition("Attached", "True", "Attached", "attached to VMI vm-a", T0),
        ],
    },
}
NODE = {
    "metadata": {"name": "gpu-node-1"},
    "spec": {},
    "status": {
        "updatedAt": T0,
        "agentVersion": "0.1.0",
        "resourceNames": ["nvidia.com/NVIDIA_L40S-24C"],
        "otherResourceNames": ["nvidia.com/GH100_H100_SXM5_80GB"],
        "devices": [
            {
                "pciAddress": "0000:65:00.4",
                "vendorID": "10de",
                "deviceID": "26b9",
                "model": "NVIDIA L40S",
                "driver": "nvidia",
                "iommuGroup": 88,
                "numaNode": 1,
                "physfn": "0000:65:00.0",
                "vgpuType": {"id": 1157, "name": "NVIDIA L40S-24C"},
                "resourceName": "nvidia.com/NVIDIA_L40S-24C",
                "allocatable": 1,
                "pods": [{"namespace": NAMESPACE, "name": "virt-launcher-vm-a-x7k2p"}],
            },
            {
                "pciAddress": "0000:17:00.0",
                "vendorID": "10de",
                "deviceID": "2330",
                "driver": "vfio-pci",
                "sriovTotalVFs": 0,
                "sriovNumVFs": 0,
                "mdev": {"types": [], "devices": []},
                "error": "no device plugin advertises this GPU",
            },
        ],
        "conditions": [_condition("Ready", "True", "Reported", "2 devices", T0)],
    },
}


class Objects:
    """Create, read, update and update status of the three kinds, as raw bodies."""

    def __init__(self, api_client: Any) -> None:
        self.custom = client.CustomObjectsApi(api_client)

    def _args(self, plural: str, namespace: str | None) -> tuple[Any, ...]:
        return (keys.GROUP, keys.VERSION, *((namespace,) if namespace else ()), plural)

    def create(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        namespace = body["metadata"].get("namespace")
        kind = {keys.PLURAL_CLAIMS: keys.KIND_CLAIM, keys.PLURAL_CLASSES: keys.KIND_CLASS}
        full = {
            "apiVersion": keys.API_VERSION,
            "kind": kind.get(plural, keys.KIND_NODE),
            **copy.deepcopy(body),
        }
        status = full.pop("status")
        if namespace:
            made = self.custom.create_namespaced_custom_object(*self._args(plural, namespace), full)
        else:
            made = self.custom.create_cluster_custom_object(*self._args(plural, None), full)
        made["status"] = status
        return self.replace_status(plural, made)

    def get(self, plural: str, name: str, namespace: str | None) -> dict[str, Any]:
        if namespace:
            got: dict[str, Any] = self.custom.get_namespaced_custom_object(
                *self._args(plural, namespace), name
            )
        else:
            got = self.custom.get_cluster_custom_object(*self._args(plural, None), name)
        return got

    def replace(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        namespace, name = body["metadata"].get("namespace"), body["metadata"]["name"]
        if namespace:
            done: dict[str, Any] = self.custom.replace_namespaced_custom_object(
                *self._args(plural, namespace), name, body
            )
        else:
            done = self.custom.replace_cluster_custom_object(*self._args(plural, None), name, body)
        return done

    def replace_status(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        namespace, name = body["metadata"].get("namespace"), body["metadata"]["name"]
        if namespace:
            done: dict[str, Any] = self.custom.replace_namespaced_custom_object_status(
                *self._args(plural, namespace), name, body
            )
        else:
            done = self.custom.replace_cluster_custom_object_status(
                *self._args(plural, None), name, body
            )
        return done


def _apply_this_trees_crds(api_client: Any) -> None:
    """Replaces each CRD with this tree's, even when the specs are equal (cluster.install_crds
    would skip those), as `helm upgrade` does; a CRD the release did not have is created."""
    ext = client.ApiextensionsV1Api(api_client)
    paths = sorted((REPO / CRD_DIR).glob("*.yaml"))
    for crd in cluster.load_manifests(*paths):
        try:
            current = ext.read_custom_resource_definition(crd["metadata"]["name"])
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            ext.create_custom_resource_definition(crd)
            continue
        body = copy.deepcopy(crd)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(crd["metadata"]["name"], body)
    cluster.install_crds(api_client, paths)  # waits until each is Established


def test_objects_the_latest_release_stored_read_and_update_under_this_trees_crds(
    released_plane: cluster.ControlPlane,
) -> None:
    version, commit = _latest_release()
    api_client = released_plane.api_client()
    client.CoreV1Api(api_client).create_namespace({"metadata": {"name": NAMESPACE}})
    objects = Objects(api_client)
    kinds = (
        (keys.PLURAL_CLASSES, CLASS),
        (keys.PLURAL_CLAIMS, CLAIM),
        (keys.PLURAL_NODES, NODE),
    )
    stored = {plural: objects.create(plural, body) for plural, body in kinds}
    for plural, body in kinds:
        assert stored[plural]["spec"] == body["spec"], f"release {version} pruned {plural} spec"
        assert stored[plural]["status"] == body["status"], f"release {version} pruned {plural}"

    _apply_this_trees_crds(api_client)

    for plural, body in kinds:
        meta = body["metadata"]
        read = objects.get(plural, meta["name"], meta.get("namespace"))
        assert read == stored[plural], (
            f"a {plural} object stored by release {version} ({commit[:12]}) reads back changed"
            " under this tree's CRDs"
        )
        same = objects.replace(plural, copy.deepcopy(read))
        assert same["metadata"]["resourceVersion"] == read["metadata"]["resourceVersion"], (
            f"a no-op update of a {plural} object stored by release {version} changed it: "
            f"{same} != {read}"
        )
        moved = copy.deepcopy(read)
        moved["status"]["conditions"][0].update(message="written by this tree", reason="Upgraded")
        moved["status"]["conditions"][0]["lastTransitionTime"] = T1
        after = objects.replace_status(plural, moved)
        assert after["status"] == moved["status"], (
            f"a status update of a {plural} object stored by release {version} was pruned"
        )
        kept = ("labels", "finalizers", "uid", "generation")
        assert after["spec"] == read["spec"]
        assert {k: after["metadata"].get(k) for k in kept} == {
            k: read["metadata"].get(k) for k in kept
        }
