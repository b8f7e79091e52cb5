"""The gpu.cozystack.io CRDs against the real API server.

For each schema constraint and CEL rule: one object the server accepts and one it refuses,
with the exact message it returns. The messages are API contract (SPEC.md §3).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, unless

pytestmark = pytest.mark.apiserver


def _class_body(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLASS,
        "metadata": {"name": name},
        "spec": {
            "vendor": "nvidia",
            "model": "H100",
            "mode": "passthrough",
            "source": {"devicePlugin": {"resourceName": "nvidia.com/GH100_H100_SXM5_80GB"}},
        },
    }
    for key, value in spec.items():
        if value is None:
            body["spec"].pop(key, None)
        else:
            body["spec"][key] = value
    return body


def _vgpu_body(name: str, **spec: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "model": "L40S",
        "mode": "vgpu",
        "profile": "L40S-24C",
        "source": {"devicePlugin": {"resourceName": "nvidia.com/NVIDIA_L40S-24C"}},
    }
    fields.update(spec)
    return _class_body(name, **fields)


class Api:
    def __init__(self, api_client: Any) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.classes: list[str] = []

    def create_class(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.create_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, body
        )
        self.classes.append(result["metadata"]["name"])
        return result

    def delete_classes(self) -> None:
        """Classes are cluster-wide and many here select every node: left behind, they would
        share resource names with later tests' classes on those tests' nodes."""
        for name in self.classes:
            unless(
                404,
                lambda name=name: self.custom.delete_cluster_custom_object(
                    keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name
                ),
            )

    def create_claim(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.create_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, body
        )
        return result


@pytest.fixture
def api(api_client: Any) -> Iterator[Api]:
    api = Api(api_client)
    yield api
    api.delete_classes()


def refusal(call: Any) -> str:
    """Runs a call the server must refuse with 422 Invalid and returns its message."""
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 422, info.value.body
    return str(json.loads(info.value.body)["message"])


# --- GPUClass ----------------------------------------------------------------------------


def test_class_name_must_be_a_dns_label(api: Api, unique: str) -> None:
    api.create_class(_class_body(f"h100-{unique}"))
    message = refusal(lambda: api.create_class(_class_body(f"h100.{unique}")))
    assert "GPUClass name must be a DNS label, since it becomes part of a quota key" in message
    long_name = "a" * 64
    message = refusal(lambda: api.create_class(_class_body(long_name)))
    assert "GPUClass name must be a DNS label, since it becomes part of a quota key" in message


def test_class_name_total_is_reserved_for_the_total_quota_key(api: Api) -> None:
    message = refusal(lambda: api.create_class(_class_body("total")))
    assert "GPUClass name total is reserved for the gpu.cozystack.io/total quota key" in message


def test_class_mode_is_an_enum(api: Api, unique: str) -> None:
    message = refusal(lambda: api.create_class(_class_body(f"m-{unique}", mode="mig")))
    assert 'spec.mode: Unsupported value: "mig"' in message


def test_class_mode_is_immutable(api: Api, unique: str) -> None:
    name = f"immutable-{unique}"
    created = api.create_class(_class_body(name))
    changed = copy.deepcopy(created)
    changed["spec"]["mode"] = "vgpu"
    changed["spec"]["profile"] = "H100-80C"
    message = refusal(
        lambda: api.custom.replace_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name, changed
        )
    )
    assert "mode is immutable; create a new GPUClass instead" in message
    # Other fields may change.
    created["spec"]["displayName"] = "NVIDIA H100 80GB"
    api.custom.replace_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name, created
    )


def test_class_profile_is_required_for_vgpu_and_refused_for_passthrough(
    api: Api, unique: str
) -> None:
    api.create_class(_vgpu_body(f"l40s-{unique}"))
    rule = "profile is required for mode vgpu and not allowed for mode passthrough"
    assert rule in refusal(lambda: api.create_class(_vgpu_body(f"nop-{unique}", profile=None)))
    assert rule in refusal(
        lambda: api.create_class(_class_body(f"pt-{unique}", profile="H100-80C"))
    )


@pytest.mark.parametrize(
    ("field", "bad", "expected"),
    [
        ("model", "", 'spec.model: Invalid value: "": spec.model in body should be at least 1'),
        ("model", "x" * 64, "spec.model: Too long: may not be more than 63"),
        ("vendor", "", 'spec.vendor: Invalid value: "": spec.vendor in body should be at least 1'),
        ("vendor", None, "spec.vendor: Required value"),
        ("displayName", "d" * 257, "spec.displayName: Too long: may not be more than 256"),
        ("memory", "lots", "spec.memory in body should match"),
        ("maxCount", 0, "spec.maxCount in body should be greater than or equal to 1"),
        ("onCordon", "Leave", 'spec.onCordon: Unsupported value: "Leave"'),
        ("source", None, "spec.source: Required value"),
    ],
)
def test_class_field_constraints(
    api: Api, unique: str, field: str, bad: Any, expected: str
) -> None:
    message = refusal(lambda: api.create_class(_class_body(f"f-{unique}", **{field: bad})))
    assert expected in message


def test_class_accepts_every_field_within_limits(api: Api, unique: str) -> None:
    created = api.create_class(
        _class_body(
            f"full-{unique}",
            model="m" * 63,
            displayName="d" * 256,
            memory="80Gi",
            maxCount=8,
            nodeSelector={"model.gpu.cozystack.io/H100": "8"},
            onCordon="Stay",
            tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        )
    )
    assert created["spec"]["memory"] == "80Gi"
    assert created["spec"]["onCordon"] == "Stay"


def test_class_on_cordon_defaults_to_move_and_max_count_has_no_default(
    api: Api, unique: str
) -> None:
    created = api.create_class(_class_body(f"d-{unique}"))
    assert created["spec"]["onCordon"] == "Move"
    assert "maxCount" not in created["spec"]


DRA = {"dra": {"deviceClassName": "vfio.gpu.nvidia.com"}}
PLUGIN = {"devicePlugin": {"resourceName": "nvidia.com/GH100_H100_SXM5_80GB"}}


def test_class_source_needs_exactly_one_member(api: Api, unique: str) -> None:
    rule = "exactly one source must be set, devicePlugin or dra"
    assert rule in refusal(lambda: api.create_class(_class_body(f"s-{unique}", source={})))
    both = {**PLUGIN, **DRA}
    assert rule in refusal(lambda: api.create_class(_class_body(f"s-{unique}", source=both)))
    # A member the schema does not know is pruned, which leaves none.
    unknown = {"cdi": {"name": "x"}}
    assert rule in refusal(lambda: api.create_class(_class_body(f"s-{unique}", source=unknown)))


def test_a_dra_class_names_a_device_class_and_keeps_its_source(api: Api, unique: str) -> None:
    name = f"dra-{unique}"
    selectors = [
        {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].productName == "H100"'}}
    ]
    created = api.create_class(
        _class_body(name, source={"dra": {**DRA["dra"], "selectors": selectors}})
    )
    assert created["spec"]["source"]["dra"]["selectors"] == selectors

    def replaced(source: dict[str, Any]) -> str:
        changed = copy.deepcopy(created)
        changed["spec"]["source"] = source
        return refusal(
            lambda: api.custom.replace_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name, changed
            )
        )

    assert "dra is immutable; create a new GPUClass instead" in replaced(DRA)
    assert "a class cannot change between devicePlugin and dra" in replaced(PLUGIN)


def test_a_device_plugin_class_cannot_become_a_dra_class(api: Api, unique: str) -> None:
    name = f"dp-{unique}"
    created = api.create_class(_class_body(name))
    changed = copy.deepcopy(created)
    changed["spec"]["source"] = DRA
    message = refusal(
        lambda: api.custom.replace_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name, changed
        )
    )
    assert "a class cannot change between devicePlugin and dra" in message


@pytest.mark.parametrize(
    ("dra", "expected"),
    [
        ({}, "spec.source.dra.deviceClassName: Required value"),
        ({"deviceClassName": "Not_A_Name"}, "spec.source.dra.deviceClassName in body should match"),
        (
            {"deviceClassName": "vfio.gpu.nvidia.com", "selectors": [{"cel": {}}]},
            "spec.source.dra.selectors[0].cel.expression: Required value",
        ),
    ],
)
def test_a_dra_source_is_refused_without_a_valid_device_class_or_selector(
    api: Api, unique: str, dra: dict[str, Any], expected: str
) -> None:
    message = refusal(lambda: api.create_class(_class_body(f"bad-{unique}", source={"dra": dra})))
    assert expected in message


def test_class_resource_name_has_the_shape_of_an_extended_resource(api: Api, unique: str) -> None:
    good = {"devicePlugin": {"resourceName": "nvidia.com/AD102GL_L40S"}}
    api.create_class(_class_body(f"rn-{unique}", source=good))
    bad = {"devicePlugin": {"resourceName": "L40S"}}
    message = refusal(lambda: api.create_class(_class_body(f"rn2-{unique}", source=bad)))
    assert "spec.source.devicePlugin.resourceName in body should match" in message


def test_class_resource_name_must_not_be_a_budget_key(api: Api, unique: str) -> None:
    bad = {"devicePlugin": {"resourceName": "gpu.cozystack.io/h100"}}
    message = refusal(lambda: api.create_class(_class_body(f"bk-{unique}", source=bad)))
    assert "resourceName must not be in gpu.cozystack.io, whose keys are GPU budgets" in message


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        (
            {"operator": "Equal", "value": "x"},
            "a toleration with an empty key needs operator Exists",
        ),
        ({"key": "", "value": "x"}, "a toleration with an empty key needs operator Exists"),
        (
            {"key": "gpu", "operator": "Exists", "value": "x"},
            "a toleration with operator Exists takes no value",
        ),
        (
            {"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 30},
            "tolerationSeconds needs effect NoExecute",
        ),
        (
            {"key": "gpu", "tolerationSeconds": 30},
            "tolerationSeconds needs effect NoExecute",
        ),
        (
            {"key": "a" * 254 + "/k", "operator": "Exists"},
            "toleration key prefix must be at most 253 characters",
        ),
        ({"key": "gpu", "operator": "Lt", "value": "3"}, 'Unsupported value: "Lt"'),
        ({"key": "gpu", "effect": "Sometimes"}, 'Unsupported value: "Sometimes"'),
        ({"key": "-gpu-"}, "spec.tolerations[0].key in body should match"),
        ({"key": "gpu", "value": "v" * 64}, "Too long: may not be more than 63"),
    ],
)
def test_class_toleration_rules(
    api: Api, unique: str, toleration: dict[str, Any], expected: str
) -> None:
    message = refusal(
        lambda: api.create_class(_class_body(f"t-{unique}", tolerations=[toleration]))
    )
    assert expected in message


def test_class_tolerations_accept_what_pod_validation_accepts(api: Api, unique: str) -> None:
    tolerations = [
        {"operator": "Exists"},
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
        {"key": "example.com/gpu", "value": "h100"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "tolerationSeconds": 60},
        {"key": "a" * 253 + "/k", "operator": "Exists"},
    ]
    created = api.create_class(_class_body(f"tol-{unique}", tolerations=tolerations))
    assert created["spec"]["tolerations"] == tolerations


def test_class_tolerations_are_at_most_32(api: Api, unique: str) -> None:
    many = [{"key": f"k{i}", "operator": "Exists"} for i in range(33)]
    message = refusal(lambda: api.create_class(_class_body(f"many-{unique}", tolerations=many)))
    assert "Too many: 33: must have at most 32 items" in message
    api.create_class(_class_body(f"enough-{unique}", tolerations=many[:32]))


def test_class_status_is_a_subresource(api: Api, unique: str) -> None:
    name = f"st-{unique}"
    body = _class_body(name)
    body["status"] = {"free": 99}
    created = api.create_class(body)
    assert "status" not in created or "free" not in created.get("status", {})
    created["status"] = {"free": 3, "maxFreePerNode": 2}
    updated = api.custom.replace_cluster_custom_object_status(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name, created
    )
    assert updated["status"] == {"free": 3, "maxFreePerNode": 2}


def test_class_status_takes_no_fields_but_free_max_free_and_conditions(
    api: Api, unique: str
) -> None:
    name = f"st2-{unique}"
    created = api.create_class(_class_body(name))
    created["status"] = {"free": 1, "nodes": ["node-a"], "bound": 4}
    updated = api.custom.replace_cluster_custom_object_status(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name, created
    )
    # Unknown status fields are pruned: no node names or other counts can be stored.
    assert updated["status"] == {"free": 1}


def test_kubectl_shows_class_printer_columns(
    control_plane: ControlPlane, api: Api, unique: str
) -> None:
    name = f"pc-{unique}"
    api.create_class(_vgpu_body(name))
    api.custom.patch_cluster_custom_object_status(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name, {"status": {"free": 7}}
    )
    out = control_plane.kubectl("get", "gpuclasses", name).stdout.splitlines()
    assert out[0].split() == ["NAME", "MODE", "MODEL", "PROFILE", "FREE", "AGE"]
    assert out[1].split()[:5] == [name, "vgpu", "L40S", "L40S-24C", "7"]


def _license(**fields: Any) -> dict[str, Any]:
    return {"secretRef": {"name": "nls-token", "key": "token.tok"}, **fields}


def test_class_license_is_for_vgpu_classes_only(api: Api, unique: str) -> None:
    created = api.create_class(_vgpu_body(f"lic-{unique}", license=_license(featureType=2)))
    assert created["spec"]["license"]["featureType"] == 2
    message = refusal(lambda: api.create_class(_class_body(f"lpt-{unique}", license=_license())))
    assert "license is only for mode vgpu: a passthrough guest gets no licence" in message


def test_class_license_feature_type_defaults_to_nvidia_vgpu(api: Api, unique: str) -> None:
    created = api.create_class(_vgpu_body(f"ld-{unique}", license=_license()))
    assert created["spec"]["license"]["featureType"] == keys.LICENSE_DEFAULT_FEATURE_TYPE


@pytest.mark.parametrize("feature_type", [0, 3, 5])
def test_class_license_feature_type_is_one_gridd_knows(
    api: Api, unique: str, feature_type: int
) -> None:
    message = refusal(
        lambda: api.create_class(
            _vgpu_body(f"lf-{unique}", license=_license(featureType=feature_type))
        )
    )
    assert "featureType must be 1 (NVIDIA vGPU), 2 (NVIDIA RTX Virtual Workstation)" in message


@pytest.mark.parametrize(
    ("secret_ref", "expected"),
    [
        ({"key": "token.tok"}, "spec.license.secretRef.name: Required value"),
        ({"name": "nls-token"}, "spec.license.secretRef.key: Required value"),
        ({"name": "NLS_token", "key": "t"}, "spec.license.secretRef.name in body should match"),
        ({"name": "nls", "key": "a/b"}, "spec.license.secretRef.key in body should match"),
    ],
)
def test_class_license_secret_ref_names_a_secret_and_key(
    api: Api, unique: str, secret_ref: dict[str, str], expected: str
) -> None:
    message = refusal(
        lambda: api.create_class(_vgpu_body(f"lr-{unique}", license={"secretRef": secret_ref}))
    )
    assert expected in message


# --- GPUClaim ----------------------------------------------------------------------------


def _claim(name: str, cls: str = "h100", count: int | None = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {"class": cls}
    if count is not None:
        spec["count"] = count
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": {"name": name},
        "spec": spec,
    }


def test_claim_spec_is_immutable_as_a_whole(api: Api, namespace: str) -> None:
    created = api.create_claim(namespace, _claim("vm-gpu", count=1))
    created["spec"]["count"] = 2
    message = refusal(
        lambda: api.custom.replace_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, "vm-gpu", created
        )
    )
    assert "spec is immutable; delete the claim and order a new one" in message


def test_claim_orders_at_least_one_unit(api: Api, namespace: str) -> None:
    api.create_claim(namespace, _claim("one", count=1))
    message = refusal(lambda: api.create_claim(namespace, _claim("zero", count=0)))
    assert "spec.count in body should be greater than or equal to 1" in message
    message = refusal(lambda: api.create_claim(namespace, _claim("none", count=None)))
    assert "spec.count: Required value" in message


def test_claim_class_is_a_dns_label(api: Api, namespace: str) -> None:
    message = refusal(lambda: api.create_claim(namespace, _claim("c", cls="H100_SXM")))
    assert "spec.class in body should match" in message


def test_claim_status_phase_is_an_enum_and_rejected_nodes_need_node_and_until(
    api: Api, namespace: str
) -> None:
    created = api.create_claim(namespace, _claim("st"))

    def write(status: dict[str, Any]) -> Any:
        body = copy.deepcopy(created)
        body["status"] = status
        return api.custom.replace_namespaced_custom_object_status(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, "st", body
        )

    assert 'status.phase: Unsupported value: "Running"' in refusal(
        lambda: write({"phase": "Running"})
    )
    assert "status.rejectedNodes[0].until: Required value" in refusal(
        lambda: write({"phase": "Bound", "rejectedNodes": [{"node": "n1"}]})
    )
    assert "Duplicate value" in refusal(
        lambda: write(
            {
                "phase": "Bound",
                "rejectedNodes": [
                    {"node": "n1", "until": "2026-01-01T00:00:00Z"},
                    {"node": "n1", "until": "2026-01-02T00:00:00Z"},
                ],
            }
        )
    )
    written = write(
        {
            "phase": "Attached",
            "nodeName": "n2",
            "boundAt": "2026-01-01T00:00:00Z",
            "attachedTo": "vm-1",
            "attachedAt": "2026-01-01T00:01:00Z",
            "rejectedNodes": [{"node": "n1", "until": "2026-01-01T00:05:00Z"}],
        }
    )
    assert written["status"]["phase"] == "Attached"


def test_claim_status_is_a_subresource(api: Api, namespace: str) -> None:
    body = _claim("sub")
    body["status"] = {"phase": "Bound", "nodeName": "forged"}
    created = api.create_claim(namespace, body)
    assert "nodeName" not in created.get("status", {})


def test_field_selector_lists_only_claims_bound_to_a_node(api: Api, namespace: str) -> None:
    for name, node in (("a", "node-1"), ("b", "node-2"), ("c", "node-1"), ("d", None)):
        created = api.create_claim(namespace, _claim(name))
        if node:
            created["status"] = {"phase": "Bound", "nodeName": node}
            api.custom.replace_namespaced_custom_object_status(
                keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, name, created
            )
    listed = api.custom.list_namespaced_custom_object(
        keys.GROUP,
        keys.VERSION,
        namespace,
        keys.PLURAL_CLAIMS,
        field_selector="status.nodeName=node-1",
    )
    assert sorted(item["metadata"]["name"] for item in listed["items"]) == ["a", "c"]
    # Across namespaces too, as the binder and the node agent list them.
    everywhere = api.custom.list_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLAIMS, field_selector="status.nodeName=node-2"
    )
    assert [i["metadata"]["name"] for i in everywhere["items"]] == ["b"]


def test_kubectl_shows_claim_printer_columns(
    control_plane: ControlPlane, api: Api, namespace: str
) -> None:
    created = api.create_claim(namespace, _claim("pc", cls="l40s-24c", count=2))
    created["status"] = {"phase": "Bound", "nodeName": "gpu-node-7"}
    api.custom.replace_namespaced_custom_object_status(
        keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, "pc", created
    )
    out = control_plane.kubectl("get", "gpuclaims", "-n", namespace).stdout.splitlines()
    assert out[0].split() == ["NAME", "CLASS", "COUNT", "PHASE", "NODE", "AGE"]
    assert out[1].split()[:5] == ["pc", "l40s-24c", "2", "Bound", "gpu-node-7"]


# --- GPUReservation ----------------------------------------------------------------------

MONDAY_9, MONDAY_18 = "2026-12-14T09:00:00Z", "2026-12-14T18:00:00Z"


def _reservation(
    name: str, start: str = MONDAY_9, end: str = MONDAY_18, count: int = 8
) -> dict[str, Any]:
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_RESERVATION,
        "metadata": {"name": name},
        "spec": {"class": "h100", "count": count, "start": start, "end": end},
    }


def _book(api: Api, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = api.custom.create_namespaced_custom_object(
        keys.GROUP, keys.VERSION, namespace, keys.PLURAL_RESERVATIONS, body
    )
    return result


def test_reservation_window_starts_before_it_ends_on_whole_minutes(
    api: Api, namespace: str
) -> None:
    _book(api, namespace, _reservation("monday"))
    # Any offset is a time: 10:00+01:00 is 09:00Z.
    _book(api, namespace, _reservation("offset", start="2026-12-14T10:00:00+01:00"))
    message = refusal(lambda: _book(api, namespace, _reservation("backwards", MONDAY_18, MONDAY_9)))
    assert "start must be before end" in message
    assert "start must be before end" in refusal(
        lambda: _book(api, namespace, _reservation("empty", MONDAY_9, MONDAY_9))
    )
    for start in ("2026-12-14T09:00:30Z", "2026-12-14T09:00:00.5Z"):
        message = refusal(lambda start=start: _book(api, namespace, _reservation("s", start)))
        assert "start must be on a whole minute (seconds 00)" in message
    message = refusal(lambda: _book(api, namespace, _reservation("e", end="2026-12-14T18:00:01Z")))
    assert "end must be on a whole minute (seconds 00)" in message
    assert "spec.count in body should be greater than or equal to 1" in refusal(
        lambda: _book(api, namespace, _reservation("zero", count=0))
    )


def test_reservation_spec_is_immutable_as_a_whole(api: Api, namespace: str) -> None:
    booked = _book(api, namespace, _reservation("fixed"))
    booked["spec"]["end"] = "2026-12-14T19:00:00Z"
    message = refusal(
        lambda: api.custom.replace_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_RESERVATIONS, "fixed", booked
        )
    )
    assert "spec is immutable; delete the reservation and book a new one" in message


def test_reservation_status_is_a_subresource_with_the_phases_of_spec_11(
    api: Api, namespace: str
) -> None:
    body = _reservation("forged")
    body["status"] = {"phase": "Booked", "nodeName": "gpu-node-1"}
    created = _book(api, namespace, body)
    assert "nodeName" not in created.get("status", {})

    def write(status: dict[str, Any]) -> Any:
        written = copy.deepcopy(created)
        written["status"] = status
        return api.custom.replace_namespaced_custom_object_status(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_RESERVATIONS, "forged", written
        )

    assert 'status.phase: Unsupported value: "Running"' in refusal(
        lambda: write({"phase": "Running"})
    )
    for phase in ("Pending", "Booked", "Active", "Ended", "Lost"):
        written = api.custom.patch_namespaced_custom_object_status(
            keys.GROUP,
            keys.VERSION,
            namespace,
            keys.PLURAL_RESERVATIONS,
            "forged",
            {"status": {"phase": phase}},
        )
        assert written["status"]["phase"] == phase


def test_kubectl_shows_reservation_printer_columns(
    control_plane: ControlPlane, api: Api, namespace: str
) -> None:
    created = _book(api, namespace, _reservation("next-monday"))
    created["status"] = {"phase": "Booked", "nodeName": "gpu-node-7"}
    api.custom.replace_namespaced_custom_object_status(
        keys.GROUP, keys.VERSION, namespace, keys.PLURAL_RESERVATIONS, "next-monday", created
    )
    out = control_plane.kubectl("get", "gpureservations", "-n", namespace).stdout.splitlines()
    assert out[0].split() == ["NAME", "CLASS", "COUNT", "START", "END", "PHASE", "NODE", "AGE"]
    assert out[1].split()[:7] == [
        "next-monday", "h100", "8", MONDAY_9, MONDAY_18, "Booked", "gpu-node-7",
    ]  # fmt: skip


def test_a_tenant_admin_books_and_cancels_but_cannot_write_a_reservations_status(
    tenant_admin: Kube, namespace: str
) -> None:
    """The chart's tenant roles give reservations the rights claims have (aggregated into
    admin and view), and no status: a tenant cannot say its own booking is Booked."""
    custom = tenant_admin.custom
    custom.create_namespaced_custom_object(
        keys.GROUP, keys.VERSION, namespace, keys.PLURAL_RESERVATIONS, _reservation("mine")
    )
    listed = custom.list_namespaced_custom_object(
        keys.GROUP, keys.VERSION, namespace, keys.PLURAL_RESERVATIONS
    )
    assert [r["metadata"]["name"] for r in listed["items"]] == ["mine"]
    with pytest.raises(ApiException) as forged:
        custom.patch_namespaced_custom_object_status(
            keys.GROUP,
            keys.VERSION,
            namespace,
            keys.PLURAL_RESERVATIONS,
            "mine",
            {"status": {"phase": "Booked", "nodeName": "gpu-node-1"}},
        )
    assert forged.value.status == 403
    custom.delete_namespaced_custom_object(
        keys.GROUP, keys.VERSION, namespace, keys.PLURAL_RESERVATIONS, "mine"
    )


# --- GPUNode -----------------------------------------------------------------------------


def _gpunode(name: str) -> dict[str, Any]:
    return {"apiVersion": keys.API_VERSION, "kind": keys.KIND_NODE, "metadata": {"name": name}}


def test_kubectl_shows_a_gpunodes_readiness_and_why_and_wide_its_advertising(
    control_plane: ControlPlane, api: Api, unique: str
) -> None:
    """docs/troubleshooting.md sends hosters to `kubectl get gpunodes -o wide` for the Ready
    and ResourceNamesAdvertised conditions: the columns show them."""
    name = f"pc-node-{unique}"
    api.custom.create_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_NODES, _gpunode(name)
    )
    now = "2026-12-02T00:00:00Z"
    conditions = [
        {"type": "Ready", "status": "False", "reason": "Cordoned", "message": "m",
         "lastTransitionTime": now},
        {"type": "ResourceNamesAdvertised", "status": "True", "reason": "Advertised",
         "message": "m", "lastTransitionTime": now},
    ]  # fmt: skip
    api.custom.patch_cluster_custom_object_status(
        keys.GROUP,
        keys.VERSION,
        keys.PLURAL_NODES,
        name,
        {"status": {"conditions": conditions, "resourceNames": ["nvidia.com/X"]}},
    )
    plain = control_plane.kubectl("get", "gpunodes", name).stdout.splitlines()
    assert plain[0].split()[:4] == ["NAME", "READY", "REASON", "RESOURCES"], plain
    assert plain[1].split()[:3] == [name, "False", "Cordoned"], plain
    wide = control_plane.kubectl("get", "gpunodes", name, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[:5] == ["NAME", "READY", "REASON", "ADVERTISED", "RESOURCES"], wide
    assert wide[1].split()[:4] == [name, "False", "Cordoned", "True"], wide


def test_gpunode_devices_are_keyed_by_a_full_pci_address(api: Api, unique: str) -> None:
    name = f"node-{unique}"
    created = api.custom.create_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_NODES, _gpunode(name)
    )

    def write(devices: list[dict[str, Any]]) -> Any:
        body = copy.deepcopy(created)
        body["status"] = {"devices": devices}
        return api.custom.replace_cluster_custom_object_status(
            keys.GROUP, keys.VERSION, keys.PLURAL_NODES, name, body
        )

    assert "devices[0].pciAddress in body should match" in refusal(
        lambda: write([{"pciAddress": "17:00.0"}])
    )
    assert "Duplicate value" in refusal(
        lambda: write([{"pciAddress": "0000:17:00.0"}, {"pciAddress": "0000:17:00.0"}])
    )
    device = {
        "pciAddress": "0000:17:00.0",
        "vendorID": "10de",
        "deviceID": "26b9",
        "model": "AD102GL [L40S]",
        "driver": "nvidia",
        "iommuGroup": 21,
        "numaNode": 0,
        "sriovTotalVFs": 32,
        "sriovNumVFs": 32,
        "resourceName": "nvidia.com/NVIDIA_L40S-24C",
        "allocatable": 0,
    }
    written = write([device])
    assert written["status"]["devices"] == [device]


def test_kubectl_explain_reads_field_descriptions(control_plane: ControlPlane) -> None:
    out = control_plane.kubectl("explain", "gpuclaim.status.rejectedNodes").stdout
    assert "refused the claim set's pinned launcher" in out
    out = control_plane.kubectl("explain", "gpuclass.spec.onCordon").stdout
    assert "whether an unattached claim leaves a cordoned node" in out
