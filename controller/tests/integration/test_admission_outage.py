"""The webhooks fail closed, and only for what uses claims: with the webhook server down,
the real kube-apiserver refuses VMIs and launcher pods with the reference label (and claim
orders), and admits every other VMI and pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from admission_env import Corner, create_vmi, refusal, serving, vmi_body
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
        corner = Corner(kube)
        corner.node("n1", 1)
        gpu_class = corner.gpu_class("h100")
        corner.order(namespace, "held", gpu_class)
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

        # An order cannot be checked, so it is not taken. The configurations are rendered
        # as for a server without MutatingAdmissionPolicy: the claim webhook's mutating
        # half, which puts claim-protection on, is the first to fail.
        with pytest.raises(ApiException) as caught:
            kube.claim(namespace, "a", "any-class")
        failed = 'failed calling webhook "gpuclaim-protection.gpu.cozystack.io"'
        assert failed in refusal(caught.value)
        # The controller's own finalizer writes on claims and classes go on.
        kube.custom.patch_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, "held",
            {"metadata": {"finalizers": [keys.FINALIZER_CLAIM]}},
        )  # fmt: skip
        kube.custom.patch_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, gpu_class,
            {"metadata": {"finalizers": [keys.FINALIZER_CLASS]}},
        )  # fmt: skip
