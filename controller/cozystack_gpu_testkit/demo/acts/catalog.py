"""Act 2, Catalog: the hoster's GPU classes and what they offer."""

from __future__ import annotations

import base64

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit.demo import existing_cluster, run_state
from cozystack_gpu_testkit.demo.acts.common import (
    FREE_AT_START,
    STAND_IN_TOKEN,
    TOKEN_SECRET,
    Demo,
    _free,
)
from cozystack_gpu_testkit.demo.console import check, wait_until
from cozystack_gpu_testkit.metrics_scrape import scrape
from cozystack_gpu_testkit.objects import unless


def act_catalog(demo: Demo) -> None:
    console = demo.console
    console.act(2, "Catalog", "The hoster's offers, created with the gpu_class module.")
    with console.step(
        f"the vGPU guests' licence token: Secret {run_state.NAMESPACE}/{TOKEN_SECRET}"
    ) as found:
        _token_secret(demo)
        found.append(
            f"key {keys.LICENSE_TOKEN_KEY}: a stand-in for the client configuration token; "
            "only the controller reads it"
        )

    with console.step("ansible-playbook catalog.yml: gpu_class, one per offer") as found:
        recap = demo.ansible("catalog.yml", "ansible-catalog.log")
        found.extend(recap)

    with console.step("capacity and free units per class") as found:
        wait_until(
            lambda: _free(demo) == FREE_AT_START,
            expected=f"free units per class {FREE_AT_START}",
            saw=lambda: f"{_free(demo)}",
            timeout=60,
        )
        capacity = wait_until(
            lambda: _capacity_is(demo, FREE_AT_START),
            expected=f"capacity per class (the controller's metrics) {FREE_AT_START}",
            saw=lambda: f"{_capacity(demo)}",
            timeout=30,
        )
        for name, cls in sorted(demo.classes().items()):
            spec = cls["spec"]
            lic = spec.get("license")
            found.append(
                f"{name}: {spec['mode']} {spec.get('profile') or spec['model']}, "
                f"capacity {capacity[name]}, free {cls['status']['free']}"
                + (
                    f", licensed ({lic['secretRef']['name']}/{lic['secretRef']['key']}, "
                    f"FeatureType {lic.get('featureType', keys.LICENSE_DEFAULT_FEATURE_TYPE)})"
                    if lic
                    else ""
                )
            )
    demo.show("get", "gpuclasses")


def _token_secret(demo: Demo) -> None:
    """The hoster's token Secret (kubectl create secret generic ... --from-file=...), marked
    as a licence token (kubectl label secret ... gpu.cozystack.io/license-token=true)."""
    body = {
        "metadata": {
            "name": TOKEN_SECRET,
            "labels": {keys.LABEL_LICENSE_TOKEN: keys.LICENSE_TOKEN_MARK, **demo.state.mark},
        },
        "data": {keys.LICENSE_TOKEN_KEY: base64.b64encode(STAND_IN_TOKEN).decode()},
    }
    try:
        demo.kube.core.create_namespaced_secret(run_state.NAMESPACE, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        demo.kube.core.replace_namespaced_secret(TOKEN_SECRET, run_state.NAMESPACE, body)


def _capacity_is(demo: Demo, wanted: dict[str, int]) -> dict[str, int] | None:
    capacity = _capacity(demo)
    return capacity if capacity == wanted else None


def _capacity(demo: Demo) -> dict[str, int]:
    """cozystack_gpu_class_capacity_units from the controller's /metrics (capacity is for the
    hoster only: GPUClass status does not show it)."""
    host, port = demo.metrics_endpoint()
    status, text = scrape(
        port,
        _metrics_token(demo),
        base64.b64decode(
            demo.kube.core.read_namespaced_secret(
                "cozystack-gpu-webhook-tls", run_state.NAMESPACE
            ).data["ca.crt"]
        ),
        host=host,
        server_name=f"cozystack-gpu-webhook.{run_state.NAMESPACE}.svc",
    )
    check(status == 200, "/metrics to answer the hoster's Prometheus", f"{status} {text}")
    capacity: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("cozystack_gpu_class_capacity_units{"):
            labels, value = line.rsplit(" ", 1)
            name = labels.split('class="', 1)[1].split('"', 1)[0]
            capacity[name] = int(float(value))
    return capacity


def _metrics_token(demo: Demo) -> str:
    """A token of the ServiceAccount CHART_VALUES binds to the metrics reader role, as the
    hoster's Prometheus pod would have."""
    if not demo.metrics_token:
        account = existing_cluster.FOREIGN_SERVICE_ACCOUNT
        metadata = {"name": account, "labels": demo.state.mark}
        unless(
            409,
            lambda: demo.kube.core.create_namespaced_service_account(
                run_state.NAMESPACE, {"metadata": metadata}
            ),
        )
        demo.metrics_token = str(
            demo.kube.core.create_namespaced_service_account_token(
                account, run_state.NAMESPACE, {"spec": {"expirationSeconds": 3600}}
            ).status.token
        )
    return demo.metrics_token
