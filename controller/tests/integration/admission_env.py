"""The admission tests' corner of the real cluster: a controller replica (its own process,
as a pod runs it) serving its webhooks over HTTPS with a throw-away CA, and the chart's
webhook configurations pointing the real kube-apiserver at it.

The replica does not lead: a Lease held by the test keeps its binder off, and the tests
write claim status as the binder would (as the test kit writes Node status as kubelet
would). The webhooks are under test here; the binder has its own tests, and a binder
acting beside them would make every state a race.

The configurations are the chart's own (``helm template`` of ``templates/webhooks.yaml``):
same rules, object selectors, failure policy, timeouts and side effects; only the client
config changes, from the in-cluster Service to ``https://127.0.0.1:<port>/<path>``, and the
object names get a suffix so they never meet a chart installed by another test.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import socket
import ssl
import time
import urllib.request
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.chart import helm_template
from cozystack_gpu_testkit.controller_process import ControllerProcess
from cozystack_gpu_testkit.objects import Kube, wait_for
from cozystack_gpu_testkit.pki import CertificateAuthority
from cozystack_gpu_testkit.ports import free_port

METRICS_READER = "cozystack-gpu-metrics-reader"


@dataclass
class MetricsReader:
    """A ServiceAccount bound to the chart's ClusterRole ``cozystack-gpu-metrics-reader``
    by the chart's own ClusterRoleBinding, as a hoster binds its Prometheus
    (``metrics.reader.subjects``), and a token of it, as its pod would have. The
    cluster-scoped names get ``suffix``: the cluster is shared."""

    kube: Kube
    namespace: str
    suffix: str
    account: str = "prometheus"
    token: str = ""
    cluster_scoped: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        rbac = client.RbacAuthorizationV1Api(self.kube.api)
        self.kube.core.create_namespaced_service_account(
            self.namespace, {"metadata": {"name": self.account}}
        )
        subject = {"kind": "ServiceAccount", "name": self.account, "namespace": self.namespace}
        values = {"metrics": {"reader": {"subjects": [subject]}}}
        for obj in helm_template("rbac-metrics.yaml", self.namespace, values):
            obj["metadata"]["name"] += f"-{self.suffix}"
            if obj["kind"] == "ClusterRole":
                assert obj["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
                rbac.create_cluster_role(obj)
            else:
                obj["roleRef"]["name"] += f"-{self.suffix}"
                rbac.create_cluster_role_binding(obj)
            self.cluster_scoped.append((obj["kind"], obj["metadata"]["name"]))
        self.token = self.token_of(self.namespace, self.account)
        wait_for(lambda: self.may_read(self.user), 15, "the reader's binding to take effect")

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.account}"

    def token_of(self, namespace: str, account: str) -> str:
        """A bound token of a ServiceAccount, as its pod's projected token."""
        answer = self.kube.core.create_namespaced_service_account_token(
            account, namespace, {"spec": {"expirationSeconds": 3600}}
        )
        return str(answer.status.token)

    def may_read(self, user: str, groups: tuple[str, ...] = ()) -> bool:
        review = client.AuthorizationV1Api(self.kube.api).create_subject_access_review(
            {
                "spec": {
                    "user": user,
                    "groups": list(groups),
                    "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
                }
            }
        )
        return bool(review.status.allowed)

    def delete(self) -> None:
        rbac = client.RbacAuthorizationV1Api(self.kube.api)
        for kind, name in self.cluster_scoped:
            with contextlib.suppress(ApiException):
                if kind == "ClusterRole":
                    rbac.delete_cluster_role(name)
                else:
                    rbac.delete_cluster_role_binding(name)


@dataclass
class Replica:
    """One controller process serving the webhooks on 127.0.0.1:``port``."""

    plane: cluster.ControlPlane
    namespace: str
    log_dir: Path
    args: tuple[str, ...] = ()
    # The replica's credentials (e.g. a ServiceAccount's); None: the plane's admin.
    kubeconfig: Path | None = None
    port: int = field(default_factory=free_port)
    ca: CertificateAuthority = field(default_factory=CertificateAuthority)
    process: ControllerProcess | None = None
    # Whether ``start`` waits for /readyz, as the webhook Service waits for a replica.
    wait_ready: bool = True

    @property
    def cert_dir(self) -> Path:
        return self.log_dir / "webhook-certs"

    @property
    def ca_pem(self) -> bytes:
        return self.ca.cert_pem

    def start(self) -> None:
        self._hold_lease()
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        pair = self.ca.issue("cozystack-gpu-webhook", ip_addresses=("127.0.0.1",), server=True)
        pair.write(self.cert_dir / "tls.crt", self.cert_dir / "tls.key")
        (self.cert_dir / "ca.crt").write_bytes(self.ca.cert_pem)
        self.process = ControllerProcess(
            self.plane,
            self.namespace,
            f"adm-{uuid.uuid4().hex[:6]}",
            self.log_dir,
            "--webhook-port",
            str(self.port),
            "--webhook-cert-dir",
            str(self.cert_dir),
            *self.args,
            kubeconfig=self.kubeconfig,
        )
        wait_for(self._serving, 60, f"the webhook server on port {self.port}")
        if self.wait_ready:
            # As kubelet's readiness probe keeps it out of the Service until then.
            wait_for(self.is_ready, 60, "the replica ready (its first listing)")

    def is_ready(self) -> bool:
        assert self.process is not None
        return self.process.ready()[0] == 200

    def _hold_lease(self) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        client.CoordinationV1Api(self.plane.api_client()).create_namespaced_lease(
            self.namespace,
            {
                "metadata": {"name": keys.LEASE_NAME_BINDER},
                "spec": {
                    "holderIdentity": "the-test-plays-the-binder",
                    "leaseDurationSeconds": 24 * 3600,
                    "acquireTime": now,
                    "renewTime": now,
                },
            },
        )

    def _serving(self) -> bool:
        assert self.process is not None
        if self.process.proc.poll() is not None:
            raise AssertionError(f"the controller exited:\n{self.process.log_tail()}")
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        try:
            with (
                socket.create_connection(("127.0.0.1", self.port), timeout=1) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1"),
            ):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def review(self, path: str, request: Mapping[str, Any]) -> dict[str, Any]:
        """POST one AdmissionReview to the webhook as the API server would; its response."""
        body = json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {"uid": str(uuid.uuid4()), **request},
            }
        ).encode()
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        req = urllib.request.Request(
            f"https://127.0.0.1:{self.port}{path}",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, context=context, timeout=15) as resp:
            answer: dict[str, Any] = json.loads(resp.read())["response"]
        return answer


def configurations(
    replica: Replica, suffix: str, only: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """The chart's webhook configurations, pointed at ``replica``; ``only`` keeps the
    named webhooks (e.g. ``vmi.gpu.cozystack.io``)."""
    keep = set(only) if only is not None else None
    objects = helm_template("webhooks.yaml", replica.namespace)
    ca_bundle = base64.b64encode(replica.ca_pem).decode()
    for obj in objects:
        obj["metadata"] = {"name": f"cozystack-gpu-{suffix}"}
        hooks = []
        for hook in obj["webhooks"]:
            if keep is not None and hook["name"] not in keep:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{replica.port}{path}",
                "caBundle": ca_bundle,
            }
            hooks.append(hook)
        obj["webhooks"] = hooks
    return [obj for obj in objects if obj["webhooks"]]


def install(api: Any, objects: list[dict[str, Any]]) -> None:
    admission = client.AdmissionregistrationV1Api(api)
    for obj in objects:
        if obj["kind"] == "MutatingWebhookConfiguration":
            admission.create_mutating_webhook_configuration(obj)
        else:
            admission.create_validating_webhook_configuration(obj)


def remove(api: Any, objects: list[dict[str, Any]]) -> None:
    admission = client.AdmissionregistrationV1Api(api)
    for obj in objects:
        name = obj["metadata"]["name"]
        try:
            if obj["kind"] == "MutatingWebhookConfiguration":
                admission.delete_mutating_webhook_configuration(name)
            else:
                admission.delete_validating_webhook_configuration(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def suffixed(objects: list[dict[str, Any]], suffix: str) -> list[dict[str, Any]]:
    """Cluster-scoped policy names get a suffix, so a chart another test installs never
    meets them; each binding follows its policy."""
    for obj in objects:
        obj["metadata"]["name"] += f"-{suffix}"
        if obj["kind"] == "ValidatingAdmissionPolicyBinding":
            obj["spec"]["policyName"] += f"-{suffix}"
    return objects


def remove_policies(api: Any, objects: list[dict[str, Any]]) -> None:
    """What ``install_policies`` created, deleted."""
    admission = client.AdmissionregistrationV1Api(api)
    for obj in objects:
        name = obj["metadata"]["name"]
        if obj["kind"] == "ValidatingAdmissionPolicy":
            admission.delete_validating_admission_policy(name)
        else:
            admission.delete_validating_admission_policy_binding(name)


def refusal(exc: ApiException) -> str:
    """The message an admission refusal carries to the client."""
    return str(json.loads(exc.body).get("message", ""))


def vmi_body(
    name: str,
    request: Mapping[str, Any] | None = None,
    *,
    labelled: bool = True,
    spec: Mapping[str, Any] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A VMI as a user or virt-controller submits it; ``request`` becomes the claims
    annotation (JSON) and the reference label is set unless ``labelled`` is False."""
    notes = dict(annotations or {})
    if request is not None:
        notes[keys.ANNOTATION_CLAIMS] = json.dumps(request)
    labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE} if labelled else {}
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "labels": labels, "annotations": notes},
        "spec": dict(spec or {"domain": {"devices": {}, "memory": {"guest": "1Gi"}}}),
    }


@dataclass
class Corner:
    """Unique names for one test: nodes, classes and a resource name nobody else uses,
    with class node selectors on a per-test label."""

    kube: Kube
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def selector(self) -> dict[str, str]:
        return {"test.cozystack.io/id": self.id}

    def name(self, base: str) -> str:
        return f"{base}-{self.id}"

    def resource(self, base: str = "GPU") -> str:
        return f"nvidia.com/{base}_{self.id}"

    def node(self, base: str, gpus: int, resource: str | None = None, **kw: Any) -> str:
        name = self.name(base)
        labels = {**self.selector, **kw.pop("labels", {})}
        self.kube.gpu_node(name, resource or self.resource(), gpus, labels=labels, **kw)
        return name

    def gpu_class(self, base: str, resource: str | None = None, **spec: Any) -> str:
        name = self.name(base)
        selector = spec.pop("selector", self.selector)
        self.kube.gpu_class(name, resource or self.resource(), selector=selector, **spec)
        return name

    def order(self, namespace: str, name: str, gpu_class: str, count: int = 1) -> dict[str, Any]:
        return order(self.kube, namespace, name, gpu_class, count)

    def bound(
        self, namespace: str, name: str, gpu_class: str, count: int = 1, *, node: str
    ) -> dict[str, Any]:
        """Order a claim and bind it to ``node``, as the binder would."""
        self.order(namespace, name, gpu_class, count)
        return bind(self.kube, namespace, name, node)


def order(kube: Kube, namespace: str, name: str, gpu_class: str, count: int = 1) -> dict[str, Any]:
    """Order a claim through the claim webhook. Right after a node or class is created
    the replica's watches may not have it yet, and the webhook refuses what it cannot
    place; an order refused for that is sent again."""
    outcome: list[dict[str, Any]] = []

    def admitted() -> bool:
        try:
            outcome[:] = [kube.claim(namespace, name, gpu_class, count)]
        except ApiException as exc:
            if exc.status == 403 and "no node serv" in refusal(exc):
                return False
            raise
        return True

    wait_for(admitted, 15, f"the replica to see what claim {name} needs")
    return outcome[0]


def bind(kube: Kube, namespace: str, name: str, node: str, phase: str = "Bound") -> dict[str, Any]:
    """Write a claim's status as the binder writes a bind."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    result: dict[str, Any] = kube.custom.patch_namespaced_custom_object_status(
        keys.GROUP,
        keys.VERSION,
        namespace,
        keys.PLURAL_CLAIMS,
        name,
        {"status": {"phase": phase, "nodeName": node, "boundAt": now}},
    )
    return result


def phase(
    kube: Kube, namespace: str, name: str, wanted: str, timeout: float = 30.0
) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    def check() -> dict[str, Any] | None:
        obj = kube.get_claim(namespace, name)
        seen[:] = [obj]
        return obj if (obj.get("status") or {}).get("phase") == wanted else None

    try:
        result: dict[str, Any] = wait_for(check, timeout, f"claim {namespace}/{name} {wanted}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the claim: {seen[0] if seen else None}") from None
    return result


def create_vmi(kube: Kube, namespace: str, body: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    result: dict[str, Any] = kube.custom.create_namespaced_custom_object(
        keys.VMI.group, keys.VMI.version, namespace, keys.VMI.plural, dict(body), **kw
    )
    return result


def wait_effective(kube: Kube, namespace: str, timeout: float = 30.0) -> None:
    """Until the API server calls the webhooks: a labelled VMI with a malformed annotation
    is refused (a dry run, so nothing is left behind)."""

    def refused() -> bool:
        body = vmi_body(f"probe-{uuid.uuid4().hex[:6]}", annotations={})
        body["metadata"]["annotations"][keys.ANNOTATION_CLAIMS] = "probe"
        try:
            create_vmi(kube, namespace, body, dry_run="All")
        except ApiException as exc:
            return "is malformed" in refusal(exc)
        time.sleep(0.2)
        return False

    wait_for(refused, timeout, "the API server to call the webhooks")


@contextlib.contextmanager
def serving(
    plane: cluster.ControlPlane,
    kube: Kube,
    log_dir: Path,
    only: Iterable[str] | None = None,
    args: tuple[str, ...] = (),
    *,
    kubeconfig: Path | None = None,
    wait_ready: bool = True,
) -> Iterator[Replica]:
    """A replica in its own namespace, the chart's configurations pointing at it (``only``
    some of them), until the block ends; then neither is left behind. It is called once
    ready (as the webhook Service waits for it) unless ``wait_ready`` is False."""
    suffix = uuid.uuid4().hex[:6]
    namespace = f"ctl-adm-{suffix}"
    kube.namespace(namespace)
    replica = Replica(
        plane, namespace, log_dir, args=args, kubeconfig=kubeconfig, wait_ready=wait_ready
    )
    replica.start()
    objects = configurations(replica, suffix, only)
    install(kube.api, objects)
    try:
        if only is None or "vmi.gpu.cozystack.io" in set(only):
            wait_effective(kube, namespace)
        yield replica
    finally:
        remove(kube.api, objects)
        # The API server forgets deleted configurations a moment later: stopping the
        # replica before would refuse the next module's claims (the webhooks fail closed).
        wait_forgotten(kube, namespace)
        replica.stop()


def wait_forgotten(kube: Kube, namespace: str, timeout: float = 30.0) -> None:
    """Until no configuration of this module is called: a dry-run VMI with a malformed
    annotation and a dry-run claim of a missing class both pass the API server."""

    def passes() -> bool:
        body = vmi_body(f"probe-{uuid.uuid4().hex[:6]}", annotations={})
        body["metadata"]["annotations"][keys.ANNOTATION_CLAIMS] = "probe"
        claim = {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND_CLAIM,
            "metadata": {"name": "probe"},
            "spec": {"class": "no-such-class", "count": 1},
        }
        try:
            create_vmi(kube, namespace, body, dry_run="All")
            kube.custom.create_namespaced_custom_object(
                keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, claim, dry_run="All"
            )
        except ApiException:
            time.sleep(0.2)
            return False
        return True

    wait_for(passes, timeout, "the API server to forget the webhook configurations")
