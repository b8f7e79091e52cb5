"""The settings ConfigMap is the controller's: a hand edit or a deletion does not last.

Found by the fault suite's fuzzing of the settings ConfigMap: the binder wrote gpu-settings
only when its own data changed, so an edit by hand (or ``kubectl delete``) stayed until
the controller restarted. The raw-name policy takes the ConfigMap as its parameter, and
finds ``rawResourceNames: forbidden`` there: deleting it, or writing ``allowed``, turned the
policy off for good. The binder now writes it again every ``SETTINGS_REFRESH_S`` seconds
(shortened here).
"""

from __future__ import annotations

import pytest
from binder_env import Env
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.binder.parts import publisher
from cozystack_gpu_testkit.objects import wait_for

pytestmark = pytest.mark.apiserver


@pytest.fixture
def quick_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher, "SETTINGS_REFRESH_S", 1.0)


def settings_data(env: Env) -> dict[str, str] | None:
    try:
        found = env.kube.core.read_namespaced_config_map(keys.SETTINGS_CONFIGMAP, env.controller_ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(found.data or {})


def test_a_settings_configmap_edited_or_deleted_by_hand_is_written_back(
    quick_refresh: None, env: Env
) -> None:
    env.node("n1", 2)
    seen: list[dict[str, str] | None] = []

    def written() -> dict[str, str] | None:
        """The ConfigMap as the binder writes it: naming this test's GPUs, with the raw-name
        policy (other names come and go with other tests' nodes)."""
        data = settings_data(env)
        seen.append(data)
        names = (data or {}).get(keys.SETTINGS_KEY_RESOURCE_NAMES, "")
        policy = (data or {}).get(keys.SETTINGS_KEY_RAW_RESOURCE_NAMES)
        ours = env.resource in keys.parse_resource_names(names)
        return data if ours and policy == keys.RawNamesPolicy.ALLOWED.value else None

    def wait_written(what: str) -> None:
        seen.clear()
        try:
            wait_for(written, 30, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last read: {seen[-1] if seen else None}") from None

    wait_written("the settings ConfigMap naming the node's GPUs")

    env.kube.core.replace_namespaced_config_map(
        keys.SETTINGS_CONFIGMAP,
        env.controller_ns,
        {"metadata": {"name": keys.SETTINGS_CONFIGMAP}, "data": {"resourceNames": "x,,"}},
    )
    wait_written("the edited ConfigMap written back")

    # The chart renders the ConfigMap: the binder's writes keep Helm's ownership, or the
    # next `helm upgrade` could not adopt it.
    helm = {
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {
            "meta.helm.sh/release-name": "cozystack-gpu",
            "meta.helm.sh/release-namespace": env.controller_ns,
            "helm.sh/resource-policy": "keep",
        },
    }
    env.kube.core.patch_namespaced_config_map(
        keys.SETTINGS_CONFIGMAP,
        env.controller_ns,
        {"metadata": helm, "data": {keys.SETTINGS_KEY_RAW_RESOURCE_NAMES: "forbidden-by-hand"}},
    )
    wait_written("the hand-edited policy written back")
    kept = env.kube.core.read_namespaced_config_map(keys.SETTINGS_CONFIGMAP, env.controller_ns)
    assert helm["labels"].items() <= (kept.metadata.labels or {}).items(), kept.metadata
    assert helm["annotations"].items() <= (kept.metadata.annotations or {}).items(), kept.metadata

    env.kube.core.delete_namespaced_config_map(keys.SETTINGS_CONFIGMAP, env.controller_ns)
    wait_written("the deleted ConfigMap written back")
