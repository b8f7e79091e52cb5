"""An upgrade from the latest recorded release to this tree, and the rollback, on a cluster in
use: every hold, attachment and usage record stays as it was.

The release is the one ``releases.yaml`` names last, taken from git history at its commit
(``releases.tree``, cached by commit). Its own demo builds the cluster a hoster has: its
chart and its code (the image's: the demo's local pods map the image's tag to the release's
tree), KubeVirt's own virt-api and virt-controller, GPU hosts laid out by its host playbook,
classes of both modes (one licensed), a three-level tenant tree with budgets, claims Bound
with their usage records, the licence copied, a VM stopped with its hold kept, and a VM
waiting on its budget. This test adds what the demo leaves out: a VM running on a held
claim and one on a template claim, a second stopped VM holding a claim, and a Lost claim
(its node failed, and no other node has room).

Then ``helm upgrade`` to this tree's chart and image while an order and a VM start are in
flight, and later ``helm rollback`` to the release. After each, under the lifecycle fuzz's
invariants (watched throughout, then settled):

- no claim that existed before changed phase, node or attachment;
- no usage record was deleted or made again (same uid);
- the order in flight was refused for no longer than the webhook gap (the longest run of
  refused probes while the controller's pod was replaced), and the VM in flight started;
- the new controller process took the binder Lease over.

The gap and the takeover are printed (``-s``) and recorded in BENCHMARKS.md.
"""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster, releases, tenants
from cozystack_gpu_testkit.answer_gap import Gap
from cozystack_gpu_testkit.cluster import alive
from cozystack_gpu_testkit.demo import local_pods, platform, run_state
from cozystack_gpu_testkit.demo.acts.common import Demo, Options
from cozystack_gpu_testkit.demo.console import Console
from cozystack_gpu_testkit.demo.hosts import H100, L40S_24C
from cozystack_gpu_testkit.invariants import Invariants
from cozystack_gpu_testkit.kubevirt import HANDLER_USER
from cozystack_gpu_testkit.objects import Kube, order_webhook_answers, wait_for
from cozystack_gpu_testkit.releases import DOCUMENTED_CHART, documented_upgrade

pytestmark = [pytest.mark.apiserver, pytest.mark.own_plane]

RESEARCH, ACME = "tenant-acme-research", "tenant-acme"
USERS = {RESEARCH: "alice", ACME: "bob"}
IMAGE = "ghcr.io/cozystack/cozystack-gpu-controller"
# This tree's image, as the upgrade names it (the release's is its version, the chart's
# default tag).
THIS_TAG = "this-tree"
CONTROLLER_POD = "cozystack-gpu-controller-0"
CONTROLLER_DEPLOYMENT = "cozystack-gpu-controller"
# How long a rollout may take here: the local kubelet notices the new template within 2 s,
# then stops the pod and starts the new one, which reads the cluster before it is ready.
ROLLOUT_TIMEOUT_S = 120
# How often the webhook is probed, and orders in flight tried again.
PROBE_S = 0.1
# What research orders in flight (its budget raised for them), and what the probes ask.
ORDER_CLASS = "l40s-24c"


@dataclass
class Held:
    """What a claim holds, as the upgrade must leave it."""

    phase: str | None
    node: str | None
    attached_to: str | None
    attached_uid: str | None


def _held(claim: dict[str, Any]) -> Held:
    status = claim.get("status") or {}
    return Held(
        status.get("phase"),
        status.get("nodeName"),
        status.get("attachedTo"),
        status.get("attachedToUID"),
    )


def _until_admitted(write: Callable[[], object], what: str) -> float:
    """``write`` (a tenant's order or VM) tried again until the API server admits it, as a
    tenant or a pipeline would; the seconds it was refused for."""
    start = time.monotonic()
    while True:
        try:
            write()
        except ApiException as exc:  # the webhooks unreachable (they fail closed)
            if time.monotonic() - start > ROLLOUT_TIMEOUT_S:
                raise AssertionError(f"{what} refused for {ROLLOUT_TIMEOUT_S} s: {exc}") from exc
            time.sleep(PROBE_S)
            continue
        return time.monotonic() - start


def _vm(name: str, *, claims: list[str] = (), templates: list[dict[str, Any]] = (),
        running: bool = True) -> dict[str, Any]:  # fmt: skip
    request: dict[str, Any] = {}
    if claims:
        request["claims"] = list(claims)
    if templates:
        request["claimTemplates"] = list(templates)
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name},
        "spec": {
            "runStrategy": "Always" if running else "Halted",
            "template": {
                "metadata": {
                    "labels": {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
                    "annotations": {keys.ANNOTATION_CLAIMS: json.dumps(request)},
                },
                "spec": {"domain": {"devices": {}, "memory": {"guest": "1Gi"}}},
            },
        },
    }


class Cluster:
    """The release's demo cluster, taken over by this tree's test kit."""

    def __init__(self, directory: Path, release: releases.Release) -> None:
        self.directory = directory
        self.release = release
        state = run_state.State.load(directory)
        assert state is not None, f"no demo state in {directory}"
        # The release's local kubelet gives way to this tree's, which knows which code
        # each image holds (the release's under its tag, this tree's under THIS_TAG).
        run_state.stop_process(state, run_state.LOCAL_KUBELET)
        state.images = {
            f"{IMAGE}:{release.version}": str(release.code),
            f"{IMAGE}:{THIS_TAG}": str(cluster.REPO_ROOT / "controller"),
        }
        state.save()
        local_pods.start_local_kubelet(state, detach=False)
        self.state = state
        options = Options(dir=directory, detach=False, show=False, out=io.StringIO())
        self.demo = Demo(options, Console(directory / "logs", out=options.out), state)
        self.demo.connect()
        self.kube = self.demo.kube
        self.handler = tenants.impersonating(
            cluster.kubeconfig_client(state.kubeconfig), HANDLER_USER
        )
        self.tenant = {
            ns: tenants.impersonating(cluster.kubeconfig_client(state.kubeconfig), user)
            for ns, user in USERS.items()
        }

    def claims(self) -> dict[str, dict[str, Any]]:
        items = self.kube.custom.list_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLAIMS
        )["items"]
        return {f"{c['metadata']['namespace']}/{c['metadata']['name']}": c for c in items}

    def records(self) -> dict[str, str]:
        """Usage records by namespace/name: their uids."""
        items = self.kube.custom.list_cluster_custom_object(
            keys.WORKLOAD_GROUP, keys.WORKLOAD_VERSION, keys.WORKLOAD_PLURAL
        )["items"]
        return {
            f"{w['metadata']['namespace']}/{w['metadata']['name']}": w["metadata"]["uid"]
            for w in items
        }

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self.claims().get(f"{namespace}/{name}") or {}

    def phase(self, namespace: str, name: str) -> str | None:
        return (self.claim(namespace, name).get("status") or {}).get("phase")

    def start_vm(self, namespace: str, name: str, resource: str) -> None:
        """A VM whose VMI virt-controller made runs: its launcher pod, once the controller
        pinned it and kube-scheduler bound it, starts on its node with one device of
        ``resource``, and virt-handler marks the VMI Running there."""
        pod = wait_for(
            lambda: self._bound_launcher(namespace, name), 90, f"{name}'s launcher bound"
        )
        node = pod["spec"]["nodeName"]
        self.demo.kubelets.run_pod(node, namespace, pod["metadata"]["name"], {resource: 1})
        self.handler.vmi_phase(namespace, name, "Running", node)

    def _bound_launcher(self, namespace: str, vmi: str) -> dict[str, Any] | None:
        for pod in self.kube.core.list_namespaced_pod(namespace).items:
            owners = pod.metadata.owner_references or []
            ours = any(o.kind == "VirtualMachineInstance" and o.name == vmi for o in owners)
            if ours and pod.spec.node_name:
                return dict(self.kube.api.sanitize_for_serialization(pod))
        return None

    def lease(self) -> Any:
        return client.CoordinationV1Api(self.demo.api).read_namespaced_lease(
            keys.LEASE_NAME_BINDER, run_state.NAMESPACE
        )

    def controller_pid(self) -> int | None:
        return local_pods.local_pid(self.directory, CONTROLLER_POD)


@pytest.fixture(scope="module")
def in_use(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    release = releases.latest()
    directory = Path(tempfile.mkdtemp(prefix="cgu-"))  # short: unix socket paths
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["PYTHONPATH"] = str(release.code)
    env["COZYSTACK_GPU_BIN_DIR"] = str(cluster.binary_dir())
    try:
        done = subprocess.run(
            [sys.executable, "-m", "cozystack_gpu_testkit.demo", "--dir", str(directory),
             "up", "--quiet"],
            cwd=release.code, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (
            f"release {release.version}'s demo failed:\n{done.stdout[-6000:]}{done.stderr[-3000:]}"
        )
        yield Cluster(directory, release)
    finally:
        if request.session.testsfailed and (directory / "logs").exists():
            kept = Path(tempfile.gettempdir()) / f"release-upgrade-logs-{os.getpid()}"
            shutil.copytree(directory / "logs", kept, dirs_exist_ok=True)
            print(f"\nthe demo's logs are kept in {kept}")
        platform.down(directory, say=lambda _line: None)
        shutil.rmtree(directory, ignore_errors=True)


def _a_tuesday(c: Cluster) -> None:
    """What the release's demo leaves, and what it leaves out."""
    # The hoster raises research's vGPU budget, so it has orders to make in flight.
    c.kube.core.patch_namespaced_resource_quota(
        "gpu", RESEARCH, {"spec": {"hard": {keys.quota_key(ORDER_CLASS): "5"}}}
    )
    render = c.claim(ACME, "render")["status"]["nodeName"]
    held = [n for n in ("desk", "spare") if c.claim(RESEARCH, n)["status"]["nodeName"] != render]
    assert held, f"desk and spare both on {render}, render's node: nothing to run beside it"
    running = held[0]
    alice, bob = c.tenant[RESEARCH], c.tenant[ACME]
    tenants.grant_tenant_admin(c.demo.api, (), USERS[ACME], [ACME])
    # A VM running on a held claim: the demo's desk-vm again where desk is the one, else
    # a VM of its own naming spare; the other hold's VM stays stopped.
    vms = {"desk": "desk-vm", "spare": "spare-vm"}
    if running == "desk":
        alice.custom.patch_namespaced_custom_object(
            keys.VM.group, keys.VM.version, RESEARCH, keys.VM.plural, "desk-vm",
            {"spec": {"runStrategy": "Always"}},
        )  # fmt: skip
        _create_vm(alice, RESEARCH, _vm("spare-vm", claims=["spare"], running=False))
    else:
        _create_vm(alice, RESEARCH, _vm("spare-vm", claims=["spare"]))
    c.start_vm(RESEARCH, vms[running], L40S_24C)
    # A VM running on a template claim (acme's last free h100 but one).
    _create_vm(bob, ACME, _vm("tmpl-vm", templates=[{"name": "gpu", "class": "h100", "count": 1}]))
    c.start_vm(ACME, "tmpl-vm", H100)
    wait_for(lambda: c.phase(RESEARCH, running) == "Attached", 60, f"{running} Attached")
    template = keys.template_claim_name("tmpl-vm", "gpu")
    wait_for(lambda: c.phase(ACME, template) == "Attached", 60, f"{template} Attached")
    # A Lost claim: render's node fails, and no other node has an l40s free.
    c.demo.kubelets.ready(render, False)
    wait_for(lambda: c.phase(ACME, "render") == "Lost", 60, "render Lost")
    left = Invariants(c.demo.api).wait_settled(60)
    assert not left, left


def _create_vm(kube: Kube, namespace: str, body: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(
        keys.VM.group, keys.VM.version, namespace, keys.VM.plural, body
    )


def _rolled(c: Cluster, old_pid: int | None, code: Path) -> int | None:
    """The controller's new process, once it runs ``code`` and is ready."""
    pid = c.controller_pid()
    if pid is None or pid == old_pid or local_pods.process_env(pid).get("PYTHONPATH") != str(code):
        return None
    pod = c.demo.pod(run_state.NAMESPACE, CONTROLLER_POD) or {}
    ready = [x for x in (pod.get("status") or {}).get("conditions") or [] if x["type"] == "Ready"]
    return pid if ready and ready[0]["status"] == "True" else None


@dataclass
class Rollout:
    """What a rollout cost: the longest run of refused webhook probes, how long the order
    and the VM in flight were refused, the time until the new replica was ready, and from
    the old process's exit to the new Lease holder's acquireTime."""

    gap_s: float
    order_refused_s: float
    vm_refused_s: float
    rolled_s: float
    takeover_s: float

    def __str__(self) -> str:
        return (
            f"webhook gap {self.gap_s:.1f} s, order refused {self.order_refused_s:.1f} s, VM "
            f"refused {self.vm_refused_s:.1f} s, new replica ready after {self.rolled_s:.1f} "
            f"s, Lease taken {self.takeover_s:.1f} s after the old process exited"
        )


def _roll(c: Cluster, change: Any, code: Path, order: str, vm: str | None) -> Rollout:
    """``change`` (a helm upgrade or rollback) with an order and a VM start in flight;
    returns what it cost them. Checks every hold, attachment and record stayed."""
    before = {k: _held(v) for k, v in c.claims().items()}
    records = c.records()
    old_pid = c.controller_pid()
    old_lease = c.lease()
    alice, bob = c.tenant[RESEARCH], c.tenant[ACME]
    invariants = Invariants(c.demo.api)
    answered = functools.partial(order_webhook_answers, alice, RESEARCH, ORDER_CLASS)
    with (
        invariants.watching(),
        Gap(answered, period_s=PROBE_S, close_within_s=ROLLOUT_TIMEOUT_S) as gap,
        Exit(old_pid) as exited,
    ):
        began = time.monotonic()
        change()
        # In flight while no replica serves: from the moment the old one is gone.
        wait_for(
            lambda: exited.at, ROLLOUT_TIMEOUT_S, f"the old controller process {old_pid} to stop"
        )
        vm_refused = 0.0
        if vm:
            body = _vm(vm, templates=[{"name": "gpu", "class": "h100", "count": 1}])
            vm_refused = _until_admitted(lambda: _create_vm(bob, ACME, body), f"VM {vm}")
        refused = _until_admitted(
            lambda: alice.claim(RESEARCH, order, ORDER_CLASS, 1), f"order {order}"
        )
        new_pid = wait_for(lambda: _rolled(c, old_pid, code), ROLLOUT_TIMEOUT_S, "the rollout")
        rolled_s = time.monotonic() - began
        lease = wait_for(lambda: _taken_over(c, old_lease), ROLLOUT_TIMEOUT_S, "a new Lease holder")
        if vm:
            c.start_vm(ACME, vm, H100)
            template = keys.template_claim_name(vm, "gpu")
            wait_for(lambda: c.phase(ACME, template) == "Attached", 60, f"{template} Attached")
    assert new_pid != old_pid
    left = invariants.wait_settled(60)
    assert not left and not invariants.seen, (left, invariants.seen)
    after = {k: _held(v) for k, v in c.claims().items()}
    changed = {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v}
    assert not changed, changed
    now = c.records()
    assert {k: now.get(k) for k in records} == records, (records, now)
    # Nothing a tenant writes is refused for longer than the webhooks' gap (a webhook the
    # new chart adds fails open, or its VM creates would wait for the whole rollout).
    assert max(refused, vm_refused) <= gap.longest_s + 1.0, (refused, vm_refused, gap)
    assert exited.at is not None, f"the old controller process {old_pid} still runs"
    takeover = lease.spec.acquire_time.timestamp() - exited.at
    return Rollout(gap.longest_s, refused, vm_refused, rolled_s, takeover)


def _taken_over(c: Cluster, old: Any) -> Any:
    """The Lease once a holder acquired it after ``old`` (a transition, not a renewal)."""
    lease = c.lease()
    transitions = lease.spec.lease_transitions or 0
    if lease.spec.holder_identity and transitions > (old.spec.lease_transitions or 0):
        return lease
    return None


@dataclass
class Exit:
    """When a process ended (epoch seconds), seen by polling it."""

    pid: int | None
    at: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Exit:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()

    def _run(self) -> None:
        while self.pid is not None and not self._stop.is_set():
            if not alive(self.pid):  # a zombie not reaped yet has exited too
                self.at = time.time()
                return
            time.sleep(0.02)


def test_an_upgrade_and_its_rollback_keep_every_hold_attachment_and_record(
    in_use: Cluster,
) -> None:
    c = in_use
    _a_tuesday(c)
    log = c.directory / "logs" / "helm.log"
    this_tree = cluster.REPO_ROOT / "controller"
    revision = _revision(c)

    def upgrade() -> None:
        # The upgrade as docs/operations.md prints it, with this tree's chart for the
        # release's tarball and this tree's image; from 0.1.0, whose controller made
        # gpu-settings itself, Helm adopts it once (the page says so), a no-op later.
        command = documented_upgrade().replace(DOCUMENTED_CHART, str(this_tree / "chart"))
        platform.helm_command(
            c.state, f"{command} --take-ownership --set image.tag={THIS_TAG}", log
        )

    up = _roll(c, upgrade, this_tree, "during-upgrade", "late-vm")
    back = _roll(
        c, lambda: platform.helm_rollback(c.state, revision, log), c.release.code,
        "during-rollback", None,
    )  # fmt: skip
    print(f"\nupgrade {c.release.version} -> this tree: {up}")
    print(f"rollback -> {c.release.version}: {back}")


def _revision(c: Cluster) -> int:
    """The release's current helm revision (the release's demo upgraded it once)."""
    done = subprocess.run(
        [str(Path(c.state.bin_dir) / "helm"), "--kubeconfig", c.state.kubeconfig, "-n",
         run_state.NAMESPACE, "status", run_state.RELEASE, "-o", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(json.loads(done.stdout)["version"])
