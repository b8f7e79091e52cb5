"""gpu_class / gpu_class_info over an in-memory API (the real server: controller/tests/integration)."""

from __future__ import annotations

import os

from ansible_collections.cozystack.gpu.plugins.modules import gpu_class, gpu_class_info
from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.cozystack.gpu.tests.unit.plugins.module_utils.fake_k8s import (
    FakeClassApi,
    status_error,
)

SPEC = {
    "vendor": "NVIDIA",
    "model": "L40S",
    "mode": "vgpu",
    "profile": "L40S-24C",
    "nodeSelector": {"pool": "l40s"},
    "source": {"devicePlugin": {"resourceName": "nvidia.com/NVIDIA_L40S-24C"}},
}


def test_present_is_idempotent_and_diffs_the_spec(run_module):
    api = FakeClassApi()
    first = run_module(gpu_class, {"name": "l40s-24c", "spec": SPEC}, diff=True, api=api)
    assert first["failed"] is False and first["changed"] is True
    assert first["diff"]["after"]["spec"]["profile"] == "L40S-24C"
    second = run_module(gpu_class, {"name": "l40s-24c", "spec": SPEC}, api=api)
    assert second["changed"] is False and "diff" not in second
    assert api.writes == [("create", "l40s-24c")]


def test_check_mode_creates_nothing(run_module):
    api = FakeClassApi()
    result = run_module(gpu_class, {"name": "l40s-24c", "spec": SPEC}, check_mode=True, api=api)
    assert result["changed"] is True and api.objects == {}


def test_the_crds_refusal_is_the_message(run_module):
    api = FakeClassApi()
    run_module(gpu_class, {"name": "c", "spec": SPEC}, api=api)
    result = run_module(gpu_class, {"name": "c", "spec": dict(SPEC, mode="passthrough")}, api=api)
    assert result["failed"] is True and result["status"] == 422
    assert result["msg"].endswith("mode is immutable; create a new GPUClass instead")


def test_a_shared_resource_name_on_overlapping_nodes_is_refused(run_module):
    api = FakeClassApi()
    run_module(gpu_class, {"name": "a", "spec": SPEC}, api=api)
    overlapping = dict(SPEC, nodeSelector={})
    refused = run_module(gpu_class, {"name": "b", "spec": overlapping}, check_mode=True, api=api)
    assert refused["failed"] is True
    assert refused["msg"] == (
        "GPUClass b: resourceName nvidia.com/NVIDIA_L40S-24C is already served by GPUClass a on"
        " overlapping nodes; two classes may share a resourceName only when their nodeSelectors"
        " do not overlap"
    )
    disjoint = dict(SPEC, nodeSelector={"pool": "l40s-west"})
    assert run_module(gpu_class, {"name": "b", "spec": disjoint}, api=api)["changed"] is True
    assert sorted(api.objects) == ["a", "b"]


def test_absent(run_module):
    api = FakeClassApi()
    run_module(gpu_class, {"name": "c", "spec": SPEC}, api=api)
    gone = run_module(gpu_class, {"name": "c", "state": "absent"}, diff=True, api=api)
    assert gone["changed"] is True and gone["diff"]["after"] == {} and api.objects == {}
    assert run_module(gpu_class, {"name": "c", "state": "absent"}, api=api)["changed"] is False


def test_present_needs_a_spec(run_module):
    result = run_module(gpu_class, {"name": "c"}, use_main=True)
    assert result["failed"] is True and "spec" in result["msg"]


def test_info_lists_and_gets(run_module):
    api = FakeClassApi()
    run_module(gpu_class, {"name": "b", "spec": SPEC, "labels": {"tier": "gold"}}, api=api)
    run_module(
        gpu_class, {"name": "a", "spec": dict(SPEC, nodeSelector={"pool": "other"})}, api=api
    )
    listed = run_module(gpu_class_info, {}, api=api)
    assert listed["changed"] is False and [c["metadata"]["name"] for c in listed["classes"]] == [
        "a",
        "b",
    ]
    gold = run_module(gpu_class_info, {"label_selector": "tier=gold"}, api=api)
    assert [c["metadata"]["name"] for c in gold["classes"]] == ["b"]
    one = run_module(gpu_class_info, {"name": "a"}, api=api)
    assert [c["spec"]["nodeSelector"] for c in one["classes"]] == [{"pool": "other"}]
    assert run_module(gpu_class_info, {"name": "missing"}, api=api)["classes"] == []


def test_the_connection_options_are_kubernetes_cores():
    """Same names, types and aliases as kubernetes.core's modules, from its own spec."""
    for module in (gpu_class, gpu_class_info):
        spec = module.argument_spec()
        assert {name: spec[name] for name in AUTH_ARG_SPEC} == AUTH_ARG_SPEC
        assert "impersonate_user" in spec and "proxy" in spec


def test_a_kubeconfig_that_cannot_be_read_fails_before_any_request(
    run_module, tmp_path, monkeypatch
):
    for name in [n for n in os.environ if n.startswith("K8S_AUTH_")]:
        monkeypatch.delenv(name)
    missing = str(tmp_path / "missing-kubeconfig")
    result = run_module(gpu_class_info, {"kubeconfig": missing}, use_main=True)
    assert result["failed"] is True
    assert result["msg"].startswith("cannot configure the Kubernetes client: ")
    assert "kube-config" in result["msg"]


def test_a_class_no_node_advertises_is_written_with_a_warning(run_module):
    nodes = {"gpu-1": {"cpu": "64", "nvidia.com/AD102GL_L40S": "2"}, "cpu-1": {"cpu": "32"}}
    api = FakeClassApi(nodes=nodes)
    spec = dict(SPEC, source={"devicePlugin": {"resourceName": "nvidia.com/AD102GL_L40"}})
    result = run_module(gpu_class, {"name": "l40", "spec": spec}, check_mode=True, api=api)
    assert result["failed"] is False and result["changed"] is True
    (warning,) = result["warnings"]
    assert warning.startswith(
        "no Node advertises nvidia.com/AD102GL_L40 in status.allocatable (2 Nodes read)"
    )
    assert "pci.ids" in warning and "kubectl get node <node> -o jsonpath=" in warning


def test_an_advertised_name_gives_no_warning_and_zero_is_not_advertised(run_module):
    api = FakeClassApi(nodes={"a": {"nvidia.com/NVIDIA_L40S-24C": "0"}, "b": {}})
    assert "warnings" in run_module(gpu_class, {"name": "c", "spec": SPEC}, api=api)
    api.nodes["b"] = {"nvidia.com/NVIDIA_L40S-24C": "4"}
    result = run_module(gpu_class, {"name": "c", "spec": SPEC}, api=api)
    assert result["failed"] is False and "warnings" not in result
    assert "warnings" not in run_module(gpu_class, {"name": "c", "state": "absent"}, api=api)


def test_a_dra_class_whose_device_class_is_missing_is_written_with_a_warning(run_module):
    spec = dict(
        SPEC, mode="passthrough", source={"dra": {"deviceClassName": "vfio.gpu.nvidia.com"}}
    )
    spec.pop("profile", None)
    api = FakeClassApi()
    result = run_module(gpu_class, {"name": "h100", "spec": spec}, check_mode=True, api=api)
    assert result["failed"] is False and result["changed"] is True
    (warning,) = result["warnings"]
    assert warning.startswith("DeviceClass vfio.gpu.nvidia.com does not exist")
    api.device_classes.add("vfio.gpu.nvidia.com")
    result = run_module(gpu_class, {"name": "h100", "spec": spec}, check_mode=True, api=api)
    assert "warnings" not in result, "no Node's allocatable is asked about a dra class"


def test_nodes_it_may_not_list_make_a_warning_not_a_failure(run_module):
    forbidden = status_error(403, 'nodes is forbidden: User "ci" cannot list resource "nodes"')
    api = FakeClassApi(nodes_error=forbidden)
    result = run_module(gpu_class, {"name": "c", "spec": SPEC}, api=api)
    assert result["failed"] is False and result["changed"] is True
    assert result["warnings"] == [
        "could not check whether a Node advertises nvidia.com/NVIDIA_L40S-24C: nodes is"
        ' forbidden: User "ci" cannot list resource "nodes"'
    ]
