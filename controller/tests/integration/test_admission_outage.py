"""The webhooks fail closed, and only for what uses claims: with the webhook server down,
the real kube-apiserver refuses VMIs and launcher pods with the reference label (and claim
orders), and admits every other VMI and pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from admission_env import create_vmi, refusal, serving, vmi_body
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit.objects import Kube

pytestmark = pytest.mark.apiserver


def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]},
    }


def test_with_the_server_down_only_objects_that_use_claims_are_refused(
    control_plane: Any, kube: Kube, tmp_path: Path, namespace: str
) -> None:
    with serving(control_plane, kube, tmp_path) as replica:
        replica.stop()
        labelled = vmi_body("with-claims", {"claims": ["a"]})
        with pytest.raises(ApiException) as caught:
            create_vmi(kube, namespace, labelled)
        assert 'failed calling webhook "vmi.gpu.cozystack.io"' in refusal(caught.value)

        created = create_vmi(kube, namespace, vmi_body("plain", labelled=False))
        assert created["metadata"]["name"] == "plain"

        reference = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
        with pytest.raises(ApiException) as caught:
            kube.core.create_namespaced_pod(namespace, pod("launcher", reference))
        assert 'failed calling webhook "pod.gpu.cozystack.io"' in refusal(caught.value)
        kube.core.create_namespaced_pod(namespace, pod("plain", {}))

        # An order cannot be checked, so it is not taken.
        with pytest.raises(ApiException) as caught:
            kube.claim(namespace, "a", "any-class")
        assert 'failed calling webhook "gpuclaim.gpu.cozystack.io"' in refusal(caught.value)
