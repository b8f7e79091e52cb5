"""One scenario's cluster (``Run``): a control plane of its own with an audit log of claim
status writes, a world of tenants and GPU nodes, replicas under a short Lease, the load and
the invariant checker; how healthy the controller is (``wait_healthy``), and the judgement
of the whole run (``finish``: its ``Result``)."""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit import chart, cluster
from cozystack_gpu_testkit.controller_process import ControllerProcess
from cozystack_gpu_testkit.fault_suite.audit import claim_feeds
from cozystack_gpu_testkit.invariants import NOT_JUDGED, Invariants, Violation
from cozystack_gpu_testkit.load import Load, LoadSettings, World, build_world
from cozystack_gpu_testkit.objects import NAD_CRD, WORKLOAD_CRD, Kube, wait_for
from cozystack_gpu_testkit.pki import CertificateAuthority
from cozystack_gpu_testkit.ports import free_port
from cozystack_gpu_testkit.proxy import Proxy

LEASE_S, RENEW_S, RETRY_S = 3.0, 2.0, 0.5
LEASE_ARGS = (
    "--lease-duration", str(LEASE_S),
    "--renew-deadline", str(RENEW_S),
    "--retry-period", str(RETRY_S),
)  # fmt: skip
# Claim status writes (what the partition and slow-server scenarios read back), and the
# controller's claim lists and watches (what tells an order never judged from one never
# seen).
AUDIT_RULES = [
    {
        "level": "Metadata",
        "verbs": ["patch", "update"],
        "resources": [{"group": keys.GROUP, "resources": [f"{keys.PLURAL_CLAIMS}/status"]}],
    },
    {
        "level": "Metadata",
        "verbs": ["list", "watch"],
        "resources": [{"group": keys.GROUP, "resources": [keys.PLURAL_CLAIMS]}],
    },
]
SETTLE_S = 120.0


@dataclass
class Result:
    """One scenario's figures; ``violations`` must be empty."""

    scenario: str
    healthy_s: list[float]  # per fault: seconds until healthy again
    healthy_bound_s: float  # the time the scenario states
    decided: int  # orders the binder decided during the run
    violations: list[str]
    faults: int
    kills: int = 0
    checks: int = 0  # invariant rule evaluations
    operations: int = 0  # load operations whose outcome was checked
    wall_s: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def worst_healthy_s(self) -> float:
        return max(self.healthy_s, default=0.0)

    def summary(self) -> str:
        extra = ", ".join(f"{k} {v}" for k, v in self.figures.items())
        return (
            f"{self.scenario}: healthy again within {self.worst_healthy_s:.1f} s "
            f"(bound {self.healthy_bound_s:.0f} s, measured {len(self.healthy_s)} times), "
            f"{self.decided} orders decided, {len(self.violations)} violations, "
            f"{self.kills} kills, {self.checks} checks, {self.operations} operations, "
            f"{self.wall_s:.0f} s" + (f"; {extra}" if extra else "")
        )


class Run:
    """One scenario's cluster: a control plane, a world, replicas, load and a checker."""

    def __init__(
        self,
        name: str,
        workdir: Path,
        *,
        replicas: int = 2,
        proxied: bool = False,
        apiserver_args: Sequence[str] = (),
        nodes: int = 6,
        gpus: int = 8,
        load: LoadSettings | None = None,
        replica_args: Sequence[str] = (),
        webhooks: bool = False,
        dra_nodes: int = 0,
    ) -> None:
        self.name = name
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        bin_dir = cluster.binary_dir()
        crds = [
            *sorted(cluster.CRD_DIR.glob("*.yaml")),
            WORKLOAD_CRD,
            cluster.kubevirt_crds(bin_dir),
            NAD_CRD,
        ]
        self.plane = cluster.start(
            bin_dir=bin_dir,
            scheduler=True,
            controller_manager=True,
            crds=crds,
            audit=AUDIT_RULES,
            extra_apiserver_args=tuple(apiserver_args),
        )
        assert self.plane.audit_log is not None
        self.audit_log = self.plane.audit_log
        self.proxies: dict[str, Proxy] = {}
        self.replicas: dict[str, ControllerProcess] = {}
        # Every replica serves the admission webhooks when asked, with one CA's pair.
        self.webhook_ca = CertificateAuthority()
        self.webhook_ports: dict[str, int] = {}
        self.load: Load | None = None
        try:
            self.api = self.plane.api_client()
            self.kube = Kube(self.api)
            self.world: World = build_world(
                self.kube, name, nodes=nodes, gpus=gpus, dra_nodes=dra_nodes
            )
            self.namespace = f"ctl-{name}"
            self.kube.namespace(self.namespace)
            # As the chart installs it: a late claim write of an overtaken leader is refused.
            chart.install_claim_fence(self.api, self.namespace)
            for i in range(replicas):
                identity = f"r{i + 1}"
                self.replicas[identity] = self._replica(identity, proxied, webhooks, replica_args)
            self.checker = Invariants(self.api)
            self._canaries = 0
            self.wait_healthy(time.monotonic(), 90.0)
            self.load = Load(self.plane.api_client(), self.world, load)
        except BaseException:
            self.close()
            raise

    def _replica(
        self, identity: str, proxied: bool, webhooks: bool, replica_args: Sequence[str]
    ) -> ControllerProcess:
        """One replica under the suite's short Lease: behind a proxy of its own when
        ``proxied`` (so a fault can cut or slow it alone), serving the webhooks when asked."""
        port = int(self.plane.server.rsplit(":", 1)[1])
        kubeconfig = None
        if proxied:
            source = self.source_ip(identity)
            proxy = Proxy(("127.0.0.1", port), source=source, name=identity)
            self.proxies[identity] = proxy
            kubeconfig = self._kubeconfig_via(proxy)
        serving: tuple[str, ...] = ()
        if webhooks:
            self.webhook_ports[identity] = free_port()
            serving = (
                "--webhook-port", str(self.webhook_ports[identity]),
                "--webhook-cert-dir", str(self._webhook_certs()),
            )  # fmt: skip
        return ControllerProcess(
            self.plane,
            self.namespace,
            identity,
            self.workdir,
            *LEASE_ARGS,
            *serving,
            *replica_args,
            kubeconfig=kubeconfig,
        )

    def _webhook_certs(self) -> Path:
        """tls.crt, tls.key and ca.crt for 127.0.0.1, as a cert-manager Secret holds them."""
        certs = self.workdir / "webhook-certs"
        if not certs.is_dir():
            certs.mkdir()
            pair = self.webhook_ca.issue(
                "cozystack-gpu-webhook", ip_addresses=("127.0.0.1",), server=True
            )
            pair.write(certs / "tls.crt", certs / "tls.key")
            (certs / "ca.crt").write_bytes(self.webhook_ca.cert_pem)
        return certs

    def webhook_serving(self, identity: str) -> bool:
        """The replica's webhook server completes a TLS handshake."""
        context = ssl.create_default_context(cadata=self.webhook_ca.cert_pem.decode())
        try:
            with (
                socket.create_connection(("127.0.0.1", self.webhook_ports[identity]), 1) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1"),
            ):
                return True
        except OSError:
            return False

    @staticmethod
    def source_ip(identity: str) -> str:
        """The loopback address a proxied replica's requests come from (audit log)."""
        return f"127.0.0.{10 + int(identity.removeprefix('r'))}"

    def _kubeconfig_via(self, proxy: Proxy) -> Path:
        config = yaml.safe_load(self.plane.kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = f"https://{proxy.address}"
        path = self.workdir / f"kubeconfig-{proxy.name}"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    # --- the controller's state ----------------------------------------------------------

    def holder(self) -> str | None:
        try:
            lease = client.CoordinationV1Api(self.api).read_namespaced_lease(
                keys.LEASE_NAME_BINDER, self.namespace, _request_timeout=(5, 10)
            )
        except Exception:  # no Lease yet, or the server is away
            return None
        return lease.spec.holder_identity or None

    def leader_healthy(self) -> bool:
        """The Lease holder runs and answers /healthz 200 as a synced leader."""
        holder = self.holder()
        replica = self.replicas.get(holder or "")
        if replica is None or replica.proc.poll() is not None:
            return False
        status, body = replica.health()
        if status != 200:
            return False
        try:
            binder = json.loads(body).get("binder") or {}
        except ValueError:
            return False
        return bool(binder.get("leader") and binder.get("synced"))

    def wait_healthy(self, since: float, timeout: float) -> float:
        """Seconds from ``since`` until the leader is healthy and a new canary order is
        Bound (then released); raises when that takes more than ``timeout``."""
        wait_for(self.leader_healthy, timeout, "a healthy, synced leader", interval=0.25)
        self._canaries += 1
        name = f"canary-{self._canaries}"
        deadline = since + timeout
        custom = client.CustomObjectsApi(self.api)
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND_CLAIM,
            "metadata": {"name": name},
            "spec": {"class": self.world.canary_class, "count": 1},
        }
        tenant = self.world.canary_tenant

        def ordered() -> bool:
            try:
                custom.create_namespaced_custom_object(
                    keys.GROUP, keys.VERSION, tenant, keys.PLURAL_CLAIMS, body,
                    _request_timeout=(5, 10),
                )  # fmt: skip
            except ApiException as exc:
                return bool(exc.status == 409)
            except Exception:  # the server is still coming back
                return False
            return True

        def bound() -> bool:
            try:
                claim = custom.get_namespaced_custom_object(
                    keys.GROUP, keys.VERSION, tenant, keys.PLURAL_CLAIMS, name,
                    _request_timeout=(5, 10),
                )  # fmt: skip
            except Exception:
                return False
            return bool((claim.get("status") or {}).get("phase") == "Bound")

        for step, what in ((ordered, "ordered"), (bound, "Bound")):
            left = max(1.0, deadline - time.monotonic())
            wait_for(step, left, f"canary {name} {what}", interval=0.1)
        took = time.monotonic() - since
        try:
            custom.delete_namespaced_custom_object(
                keys.GROUP, keys.VERSION, tenant, keys.PLURAL_CLAIMS, name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        return took

    @property
    def running_load(self) -> Load:
        assert self.load is not None
        return self.load

    def log_lines(self, needle: str) -> int:
        """How many lines of every replica's log contain ``needle``."""
        return sum(
            sum(needle in line for line in replica.log.read_text(errors="replace").splitlines())
            for replica in self.replicas.values()
            if replica.log.exists()
        )

    # --- ending ----------------------------------------------------------------------------

    def finish(
        self,
        scenario: str,
        healthy: list[float],
        bound_s: float,
        *,
        faults_injected: int,
        kills: int = 0,
        figures: dict[str, Any] | None = None,
    ) -> Result:
        """Stops the load, waits for the cluster to settle and judges the whole run."""
        load = self.running_load
        load.stop()
        found: list[Violation] = list(self.checker.seen)
        final = self.checker.wait_settled(SETTLE_S)
        violations = [str(v) for v in found] + [str(v) for v in final if v not in found]
        if any(v.rule == NOT_JUDGED for v in final):
            feeds = claim_feeds(self.audit_log)
            violations += [f"claim feeds of the binders: {feed}" for feed in feeds]
        violations += [f"order lost: {name}" for name in load.lost_orders()]
        if load.failure is not None:
            violations.append(f"the load failed: {load.failure}")
        for identity, replica in self.replicas.items():
            # A replica restarted a moment ago may still be starting: it gets a while.

            def answers(replica: ControllerProcess = replica) -> bool:
                return replica.health()[0] == 200

            try:
                wait_for(answers, 60, "a healthy replica", 0.5)
            except AssertionError:
                status, body = replica.health()
                ended = replica.proc.poll()
                why = (
                    f"; its process ended ({ended}):\n{replica.log_tail(8)}"
                    if ended is not None
                    else ""
                )
                violations.append(f"replica {identity} unhealthy at the end: {status} {body}{why}")
        violations += [
            f"not healthy again within {bound_s:.0f} s: took {took:.1f} s"
            for took in healthy
            if took > bound_s
        ]
        return Result(
            scenario=scenario,
            healthy_s=[round(t, 2) for t in healthy],
            healthy_bound_s=bound_s,
            decided=load.decided(),
            violations=violations,
            faults=faults_injected,
            kills=kills,
            checks=self.checker.checks,
            operations=load.counts.operations,
            wall_s=time.monotonic() - self.started,
            figures={
                **(figures or {}),
                "moves": self.checker.moves,
                "pods of ended VMIs their claims moved from": len(
                    self.checker.pins_left_after_the_end
                ),
            },
        )

    def close(self) -> None:
        if self.load is not None:
            self.load.stop()
        for replica in self.replicas.values():
            replica.stop()
        for proxy in self.proxies.values():
            proxy.stop()
        self.plane.stop()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
