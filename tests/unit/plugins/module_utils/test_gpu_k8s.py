"""ensure_class against an in-memory API, and error messages (the client: kubernetes.core's)."""

from __future__ import annotations

import json

import pytest
from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_k8s
from ansible_collections.cozystack.gpu.tests.unit.plugins.module_utils.fake_k8s import (
    FakeClassApi,
    status_error,
)

SPEC = {
    "vendor": "NVIDIA",
    "model": "L40S",
    "mode": "vgpu",
    "profile": "L40S-24C",
    "source": {"devicePlugin": {"resourceName": "nvidia.com/NVIDIA_L40S-24C"}},
}


def no_conflicts(name, spec, existing):
    return []


class TestEnsureClass:
    def test_create_then_an_identical_run_is_unchanged_despite_server_defaults(self):
        api = FakeClassApi()
        first = gpu_k8s.ensure_class(api, "l40s-24c", "present", spec=SPEC, labels={"tier": "a"})
        assert first["changed"] is True
        assert first["diff"]["before"] == {}
        assert first["diff"]["after"]["spec"]["onCordon"] == "Move"
        second = gpu_k8s.ensure_class(api, "l40s-24c", "present", spec=SPEC, labels={"tier": "a"})
        assert second["changed"] is False
        assert second["diff"]["before"] == second["diff"]["after"]
        assert api.writes == [("create", "l40s-24c")]

    def test_check_mode_creates_nothing_but_returns_the_object(self):
        api = FakeClassApi()
        result = gpu_k8s.ensure_class(api, "l40s-24c", "present", spec=SPEC, check_mode=True)
        assert result["changed"] is True
        assert result["result"]["spec"]["profile"] == "L40S-24C"
        assert api.objects == {} and api.writes == []

    def test_an_update_diffs_the_spec_without_resource_version_churn(self):
        api = FakeClassApi()
        gpu_k8s.ensure_class(api, "c", "present", spec=SPEC)
        changed = dict(SPEC, displayName="A quarter of an L40S")
        result = gpu_k8s.ensure_class(api, "c", "present", spec=changed)
        assert result["changed"] is True
        before, after = result["diff"]["before"], result["diff"]["after"]
        assert (
            "displayName" not in before["spec"]
            and after["spec"]["displayName"] == "A quarter of an L40S"
        )
        assert "resourceVersion" not in json.dumps(result["diff"])
        assert "generation" not in json.dumps(result["diff"])
        assert api.objects["c"]["spec"]["displayName"] == "A quarter of an L40S"

    def test_check_mode_update_stores_nothing(self):
        api = FakeClassApi()
        gpu_k8s.ensure_class(api, "c", "present", spec=SPEC)
        stored = json.dumps(api.objects, sort_keys=True)
        result = gpu_k8s.ensure_class(
            api, "c", "present", spec=dict(SPEC, maxCount=2), check_mode=True
        )
        assert result["changed"] is True and result["diff"]["after"]["spec"]["maxCount"] == 2
        assert json.dumps(api.objects, sort_keys=True) == stored

    def test_labels_given_are_set_and_others_kept(self):
        api = FakeClassApi()
        gpu_k8s.ensure_class(api, "c", "present", spec=SPEC, labels={"a": "1"})
        api.objects["c"]["metadata"]["labels"]["added-by-tool"] = "x"
        result = gpu_k8s.ensure_class(api, "c", "present", spec=SPEC, labels={"a": "2"})
        assert result["changed"] is True
        assert api.objects["c"]["metadata"]["labels"] == {"a": "2", "added-by-tool": "x"}

    def test_the_servers_refusal_propagates_with_its_message(self):
        api = FakeClassApi()
        gpu_k8s.ensure_class(api, "c", "present", spec=SPEC)
        with pytest.raises(gpu_k8s.ApiException) as caught:
            gpu_k8s.ensure_class(api, "c", "present", spec=dict(SPEC, mode="passthrough"))
        assert gpu_k8s.api_error_message(caught.value).endswith(
            "mode is immutable; create a new GPUClass instead"
        )

    def test_a_conflicting_class_is_refused_before_any_write(self):
        api = FakeClassApi()
        gpu_k8s.ensure_class(api, "first", "present", spec=SPEC)

        def conflicts(name, spec, existing):
            return [
                "{} collides with {}".format(name, o["metadata"]["name"])
                for o in existing
                if o["metadata"]["name"] != name
            ]

        with pytest.raises(gpu_k8s.ClassRuleError, match="second collides with first"):
            gpu_k8s.ensure_class(api, "second", "present", spec=SPEC, check_conflicts=conflicts)
        assert api.writes == [("create", "first")]

    def test_absent_deletes_once_and_honours_check_mode(self):
        api = FakeClassApi()
        gpu_k8s.ensure_class(api, "c", "present", spec=SPEC)
        checked = gpu_k8s.ensure_class(api, "c", "absent", check_mode=True)
        assert checked["changed"] is True and "c" in api.objects
        gone = gpu_k8s.ensure_class(api, "c", "absent")
        assert (
            gone["changed"] is True
            and gone["diff"]["after"] == {}
            and gone["diff"]["before"]["name"] == "c"
        )
        assert gpu_k8s.ensure_class(api, "c", "absent")["changed"] is False


class TestMessages:
    def test_the_status_message_is_returned_verbatim(self):
        exc = status_error(
            422,
            'GPUClass.gpu.cozystack.io "x" is invalid: spec: Invalid value: "object": profile is required for mode vgpu and not allowed for mode passthrough',
        )
        assert gpu_k8s.api_error_message(exc) == (
            'GPUClass.gpu.cozystack.io "x" is invalid: spec: Invalid value: "object": profile is'
            " required for mode vgpu and not allowed for mode passthrough"
        )

    def test_a_body_that_is_not_json_and_no_body_at_all(self):
        exc = gpu_k8s.ApiException(status=503, reason="Service Unavailable")
        assert gpu_k8s.api_error_message(exc) == "503 Service Unavailable"
        exc.body = "upstream connect error"
        assert gpu_k8s.api_error_message(exc) == "upstream connect error"
