"""The gpu_class and gpu_class_info modules against the real kube-apiserver and the real CRD.

Each module runs the way Ansible runs it on a host: as a Python process reading
``{"ANSIBLE_MODULE_ARGS": ...}`` on stdin and printing its JSON result, imported from the
collection (``ansible_collections.cozystack.gpu``, a link to this checkout).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, unless

pytestmark = pytest.mark.apiserver

COLLECTION_ROOT = Path(__file__).resolve().parents[3]

RunModule = Callable[..., dict[str, Any]]


@pytest.fixture(scope="session")
def collections_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding ansible_collections/cozystack/gpu -> this checkout."""
    base = tmp_path_factory.mktemp("collections")
    namespace = base / "ansible_collections" / "cozystack"
    namespace.mkdir(parents=True)
    (namespace / "gpu").symlink_to(COLLECTION_ROOT, target_is_directory=True)
    return base


@pytest.fixture
def run_module(control_plane: ControlPlane, collections_path: Path) -> RunModule:
    def _run(
        module: str,
        check_mode: bool = False,
        diff: bool = False,
        environment: dict[str, str] | None = None,
        **args: Any,
    ) -> dict[str, Any]:
        """Run ``module``; the admin kubeconfig is passed unless ``environment`` is given."""
        module_args = dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff)
        if environment is None:
            module_args.setdefault("kubeconfig", str(control_plane.kubeconfig))
        env = {k: v for k, v in os.environ.items() if not k.startswith("K8S_AUTH_")}
        env.update(environment or {})
        env["PYTHONPATH"] = os.pathsep.join([str(collections_path), *sys.path])
        done = subprocess.run(
            [sys.executable, "-m", f"ansible_collections.cozystack.gpu.plugins.modules.{module}"],
            input=json.dumps({"ANSIBLE_MODULE_ARGS": module_args}),
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        try:
            result: dict[str, Any] = json.loads(done.stdout)
        except ValueError:
            output = f"{done.stdout}\n{done.stderr}"
            raise AssertionError(f"{module} printed no JSON: {output}") from None
        return result

    return _run


@pytest.fixture
def classes(api_client: Any) -> Any:
    return client.CustomObjectsApi(api_client)


def _get(classes: Any, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = unless(
        404,
        lambda: classes.get_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name
        ),
    )
    return found


def _spec(unique: str, **fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "vendor": "NVIDIA",
        "model": "L40S",
        "mode": "vgpu",
        "profile": "L40S-24C",
        "nodeSelector": {"pool": f"l40s-{unique}"},
        "source": {"devicePlugin": {"resourceName": f"nvidia.com/NVIDIA_L40S-24C-{unique}"}},
    }
    spec.update(fields)
    return {k: v for k, v in spec.items() if v is not None}


def test_create_then_an_identical_run_changes_nothing(
    run_module: RunModule, classes: Any, unique: str
) -> None:
    name = f"l40s-{unique}"
    first = run_module("gpu_class", name=name, spec=_spec(unique), diff=True)
    assert first.get("failed") is not True, first
    assert first["changed"] is True
    assert first["diff"]["before"] == {}
    stored = _get(classes, name)
    assert stored is not None and stored["spec"]["profile"] == "L40S-24C"
    assert stored["spec"]["onCordon"] == "Move"  # the CRD's default, not ours

    second = run_module("gpu_class", name=name, spec=_spec(unique), diff=True)
    assert second["changed"] is False, second
    assert second["diff"]["before"] == second["diff"]["after"]
    after = _get(classes, name)
    assert after is not None
    assert after["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]


def test_check_mode_creates_nothing(run_module: RunModule, classes: Any, unique: str) -> None:
    name = f"dry-{unique}"
    result = run_module("gpu_class", name=name, spec=_spec(unique), check_mode=True)
    assert result["changed"] is True
    assert result["result"]["spec"]["onCordon"] == "Move"  # judged and defaulted by the server
    assert _get(classes, name) is None


def test_an_update_diffs_the_spec_without_version_churn(
    run_module: RunModule, classes: Any, unique: str
) -> None:
    name = f"upd-{unique}"
    run_module("gpu_class", name=name, spec=_spec(unique))
    checked = run_module(
        "gpu_class", name=name, spec=_spec(unique, maxCount=2), check_mode=True, diff=True
    )
    assert checked["changed"] is True
    stored = _get(classes, name)
    assert stored is not None and "maxCount" not in stored["spec"]

    result = run_module("gpu_class", name=name, spec=_spec(unique, maxCount=2), diff=True)
    assert result["changed"] is True
    assert "maxCount" not in result["diff"]["before"]["spec"]
    assert result["diff"]["after"]["spec"]["maxCount"] == 2
    assert "resourceVersion" not in json.dumps(result["diff"])
    assert "generation" not in json.dumps(result["diff"])
    stored = _get(classes, name)
    assert stored is not None and stored["spec"]["maxCount"] == 2


def test_an_update_keeps_the_controllers_class_finalizer(
    run_module: RunModule, classes: Any, unique: str
) -> None:
    """Only the controller may remove gpu.cozystack.io/class-protection (the chart's
    protection policy refuses everyone else): the module's update must send it back."""
    name = f"fin-{unique}"
    run_module("gpu_class", name=name, spec=_spec(unique))
    classes.patch_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name,
        {"metadata": {"finalizers": [keys.FINALIZER_CLASS]}},
    )  # fmt: skip
    result = run_module("gpu_class", name=name, spec=_spec(unique, maxCount=2))
    assert result.get("failed") is not True and result["changed"] is True, result
    stored = _get(classes, name)
    assert stored is not None and stored["spec"]["maxCount"] == 2
    assert stored["metadata"]["finalizers"] == [keys.FINALIZER_CLASS]
    classes.patch_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name, {"metadata": {"finalizers": None}}
    )


@pytest.mark.parametrize("check_mode", [False, True])
def test_the_crds_refusal_is_surfaced_verbatim(
    run_module: RunModule, classes: Any, unique: str, check_mode: bool
) -> None:
    name = f"mode-{unique}"
    run_module("gpu_class", name=name, spec=_spec(unique))
    passthrough = _spec(unique, mode="passthrough", profile=None)
    result = run_module("gpu_class", name=name, spec=passthrough, check_mode=check_mode)
    assert result["failed"] is True
    assert result["status"] == 422

    # The message the server itself gives for the same change, sent straight to it.
    stored = _get(classes, name)
    assert stored is not None
    body = dict(stored, spec=passthrough)
    with pytest.raises(ApiException) as direct:
        classes.replace_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name, body, dry_run="All"
        )
    assert result["msg"] == json.loads(direct.value.body)["message"]
    assert "mode is immutable; create a new GPUClass instead" in result["msg"]
    after = _get(classes, name)
    assert after is not None and after["spec"]["mode"] == "vgpu"


def test_a_cel_refusal_on_create_is_surfaced_verbatim(
    run_module: RunModule, classes: Any, unique: str
) -> None:
    name = f"noprof-{unique}"
    result = run_module("gpu_class", name=name, spec=_spec(unique, profile=None))
    assert result["failed"] is True
    assert "profile is required for mode vgpu and not allowed for mode passthrough" in result["msg"]
    assert result["msg"].startswith(f'GPUClass.gpu.cozystack.io "{name}" is invalid')
    assert _get(classes, name) is None


def test_a_shared_resource_name_needs_disjoint_node_selectors(
    run_module: RunModule, classes: Any, unique: str
) -> None:
    run_module("gpu_class", name=f"first-{unique}", spec=_spec(unique))
    overlapping = _spec(unique, nodeSelector={"zone": "a"})
    refused = run_module("gpu_class", name=f"second-{unique}", spec=overlapping)
    assert refused["failed"] is True
    assert refused["msg"] == (
        f"GPUClass second-{unique}: resourceName nvidia.com/NVIDIA_L40S-24C-{unique} is already"
        f" served by GPUClass first-{unique} on overlapping nodes; two classes may share a"
        " resourceName only when their nodeSelectors do not overlap"
    )
    assert _get(classes, f"second-{unique}") is None
    disjoint = _spec(unique, nodeSelector={"pool": f"other-{unique}"})
    assert run_module("gpu_class", name=f"second-{unique}", spec=disjoint)["changed"] is True


def test_absent_deletes_and_then_changes_nothing(
    run_module: RunModule, classes: Any, unique: str
) -> None:
    name = f"gone-{unique}"
    run_module("gpu_class", name=name, spec=_spec(unique))
    checked = run_module("gpu_class", name=name, state="absent", check_mode=True)
    assert checked["changed"] is True and _get(classes, name) is not None
    deleted = run_module("gpu_class", name=name, state="absent", diff=True)
    assert deleted["changed"] is True and deleted["diff"]["before"]["name"] == name
    assert _get(classes, name) is None
    assert run_module("gpu_class", name=name, state="absent")["changed"] is False


def test_info_reads_what_the_module_wrote(run_module: RunModule, unique: str) -> None:
    name = f"info-{unique}"
    run_module("gpu_class", name=name, spec=_spec(unique), labels={"offer": unique})
    one = run_module("gpu_class_info", name=name)
    assert one["changed"] is False
    assert [c["metadata"]["name"] for c in one["classes"]] == [name]
    labelled = run_module("gpu_class_info", label_selector=f"offer={unique}")
    assert [c["spec"]["profile"] for c in labelled["classes"]] == ["L40S-24C"]
    assert run_module("gpu_class_info", name=f"missing-{unique}")["classes"] == []


# --- kubernetes.core's connection options, and names no Node advertises ---------------------


def test_kubernetes_cores_connection_options_reach_the_server(
    run_module: RunModule, control_plane: ControlPlane, unique: str
) -> None:
    """impersonate_user (kubernetes.core's option) is sent: the server judges that user."""
    name = f"imp-{unique}"
    run_module("gpu_class", name=name, spec=_spec(unique))
    refused = run_module("gpu_class_info", name=name, impersonate_user=f"jane-{unique}")
    assert refused["failed"] is True and refused["status"] == 403
    assert f'User "jane-{unique}" cannot get resource "gpuclasses"' in refused["msg"]
    # K8S_AUTH_KUBECONFIG stands in for the kubeconfig option, as in kubernetes.core.
    by_env = run_module(
        "gpu_class_info",
        name=name,
        environment={"K8S_AUTH_KUBECONFIG": str(control_plane.kubeconfig)},
    )
    assert [c["metadata"]["name"] for c in by_env["classes"]] == [name]


def test_a_resource_name_no_node_advertises_is_written_with_a_warning(
    run_module: RunModule, api_client: Any, classes: Any, unique: str
) -> None:
    name = f"pred-{unique}"
    resource = f"nvidia.com/AD102GL_L40S-{unique}"
    spec = _spec(unique, mode="passthrough", profile=None)
    spec["source"] = {"devicePlugin": {"resourceName": resource}}
    predicted = run_module("gpu_class", name=name, spec=spec)
    assert predicted.get("failed") is not True, predicted
    assert _get(classes, name) is not None
    # ansible-core 2.19 reports each warning as a summary of an event holding the message.
    (warning,) = [w["event"]["msg"] for w in predicted["warnings"]]
    assert warning.startswith(f"no Node advertises {resource} in status.allocatable")
    assert "kubectl get node <node> -o jsonpath='{.status.allocatable}'" in warning

    Kube(api_client).node(f"gpu-{unique}", allocatable={resource: 2})
    advertised = run_module("gpu_class", name=name, spec=spec, check_mode=True)
    assert advertised["changed"] is False and not advertised.get("warnings"), advertised
