"""`make demo`, shortened, as an end-to-end test: its own control plane, the chart's controller
as pods on a real node (``--node=yes``), the agents of the simulated GPU hosts as local
processes, the host playbook on fixture trees, and every act checked.

Shortened: kubectl's tables are not shown, nothing is left running (the processes die with
the test and are stopped after it), and nothing waits for a person. Every act still runs and
checks its outcome as `make demo` does: a step that does not turn out as expected raises
DemoFailure with the step, what it expected and what it saw.
"""

from __future__ import annotations

import io
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from cozystack_gpu_testkit.demo import (
    existing_cluster,
    local_pods,
    node_pods,
    platform,
    run_state,
    story,
)
from cozystack_gpu_testkit.demo.acts.day_two import upgrade_controller
from cozystack_gpu_testkit.demo.acts.platform_up import platform_act
from cozystack_gpu_testkit.demo.console import DemoFailure

pytestmark = [pytest.mark.apiserver, pytest.mark.own_plane]

ACTS = (
    "Hosts",
    "Catalog",
    "Orders",
    "A VM starts",
    "A booked window",
    "Life goes on",
    "Day two",
    "The end",
)


def _marks(state: run_state.State) -> dict[str, str | None]:
    """The run mark each of the demo's objects there carries (None: none), the release's
    too, by kind and name."""
    api = run_state.admin_client(state.kubeconfig)
    marks: dict[str, str | None] = {}
    for kind in existing_cluster.FOREIGN_KINDS:
        for name in kind.names:
            obj = existing_cluster.read_foreign(api, kind, name)
            if obj is not None:
                marks[kind.what(name)] = (obj["metadata"].get("labels") or {}).get(run_state.MARK)
    marked = existing_cluster.release_listed(
        state.kubeconfig, state.bin_dir, f"{run_state.MARK}={state.run}"
    )
    marks[existing_cluster.FOREIGN_RELEASE] = state.run if marked else None
    return marks


def _ran_on_the_real_node(demo: story.Demo) -> dict[str, int]:
    """The controller's pods at the end, by name, with their containers' restart counts:
    each on the demo's real node, run by its containerd, Running and Ready."""
    assert demo.node is not None
    pods = node_pods.controller_pods(demo.api)
    for pod in pods:
        assert pod.spec.node_name == demo.node.name, pod.spec.node_name
        assert pod.status.phase == "Running", pod.status
        for container in pod.status.container_statuses:
            assert container.ready and container.container_id.startswith("containerd://")
    return {p.metadata.name: p.status.container_statuses[0].restart_count for p in pods}


def test_the_demo_runs_every_act_to_its_checked_outcome(tmp_path: Path) -> None:
    # Short: kubelet's pod-resources sockets live below it (unix socket paths are short).
    directory = Path(tempfile.mkdtemp(prefix="cgd-"))
    out = io.StringIO()
    options = story.Options(dir=directory, detach=False, show=False, out=out, node="yes")
    demo = story.prepare(options)
    try:
        story.play(demo)
        writes = platform.audited_writes(directory)
        marks = _marks(demo.state)
        controller_pods = _ran_on_the_real_node(demo)
    except DemoFailure as failure:
        kept = tmp_path / "demo-logs"
        shutil.copytree(directory / "logs", kept)
        for log in (directory / "cluster").glob("*.log"):
            shutil.copy(log, kept / log.name)
        pytest.fail(f"{out.getvalue()}{failure.explain()}\n  (logs kept in {kept})", pytrace=False)
    finally:
        platform.down(directory, say=lambda _line: None)

    text = out.getvalue()
    for number, title in enumerate(ACTS, 1):
        assert f" Act {number}. {title}\n" in text, text
    assert "✗" not in text
    # The story's own claims about the end, as the last act found them.
    assert f"free per class {story.FREE_AT_END}" in text, text
    # The controller ran as the Deployment's two pods on the real node, from the image; the
    # agents of the simulated GPU hosts as local processes, followed by the local kubelet.
    assert "a real node, worker-01: containerd and kubelet" in text, text
    assert "a local kubelet (pid " in text, text
    assert "image localhost/cozystack-gpu-controller:" in text, text
    # helm upgrade: the Deployment replaced both pods with pods of the new template.
    rolled = re.search(
        r"(\S+), (\S+) → (\S+) \(\S+\), (\S+) \(\S+\), GPU_REJECTION_TTL 600 → 300; "
        r"Ready, Lease held by (\S+), webhooks answering",
        text,
    )
    assert rolled, text
    old, new = {rolled[1], rolled[2]}, {rolled[3], rolled[4]}
    assert len(old) == len(new) == 2 and not old & new, rolled[0]
    assert rolled[5] in new and new == set(controller_pods), (rolled[0], controller_pods)
    assert set(controller_pods.values()) == {0}, (
        f"a controller container restarted: {controller_pods}"
    )
    # The licensed class: its token copied into the entitled tenant only, and the VM's disk.
    assert "l40s-24c: vgpu L40S-24C, capacity 6, free 6, licensed (nls-token" in text, text
    assert (
        "Secret gpu-license-l40s-24c in tenant-acme-research (vGPU entitled) only: "
        "keys client_configuration_token.tok, feature-type (1)"
    ) in text, text
    assert "no copy in tenant-root, tenant-acme (not entitled)" in text, text
    assert (
        'volume {"name": "gpu-cozystack-license", "secret": {"secretName": "gpu-license-l40s-24c"}}'
    ) in text, text
    assert '"serial": "gpu-license"' in text, text
    # The tenants' steps are the tenants': every order, VM create and VM stop in a tenant's
    # namespace was judged by the API server as that tenant's user (its audit log), and the
    # rest of the writes there are the platform's own service accounts (template claims,
    # finalizers).
    users = {"tenant-acme-research": "alice", "tenant-acme": "bob"}
    assert "RoleBinding tenant-acme-research/alice-admin: ClusterRole admin" in text, text
    tenant_writes = [w for w in writes if w.namespace in users]
    by_hand = [w for w in tenant_writes if not w.user.startswith("system:serviceaccount:")]
    assert all(w.user == users[w.namespace] for w in by_hand), by_hand
    done = {(w.verb, w.resource, w.namespace, w.name) for w in by_hand if w.code < 300}
    for namespace, name in (
        ("tenant-acme-research", "train"),
        ("tenant-acme-research", "desk"),
        ("tenant-acme-research", "spare"),
        ("tenant-acme", "render"),
    ):
        assert ("create", "gpuclaims", namespace, name) in done, (name, by_hand)
    for verb, name in (("create", "desk-vm"), ("patch", "desk-vm"), ("create", "burst")):
        assert (verb, "virtualmachines", "tenant-acme-research", name) in done, (name, by_hand)
    refused = {(w.namespace, w.name) for w in by_hand if w.code >= 400}
    assert refused >= {("tenant-acme-research", "more"), ("tenant-acme", "big")}, by_hand
    # The booked window: bob's booking (a day ahead refused, minutes ahead booked), his
    # on-demand order refused for it, his VM on it; the controller halted the VM at its end.
    assert ("create", "gpureservations", "tenant-acme", "sprint") in done, by_hand
    assert ("create", "virtualmachines", "tenant-acme", "sprint-vm") in done, by_hand
    assert refused >= {("tenant-acme", "sprint"), ("tenant-acme", "on-demand")}, by_hand
    controller = f"system:serviceaccount:{run_state.NAMESPACE}:cozystack-gpu-controller"
    halted = ("patch", "virtualmachines", "tenant-acme", "sprint-vm", controller)
    assert any((w.verb, w.resource, w.namespace, w.name, w.user) == halted and w.code < 300
               for w in tenant_writes), tenant_writes  # fmt: skip
    assert "(reservations.maxLead, which the hoster sets)" in text, text
    assert "(units reservations booked for their windows are not free to orders)" in text, text
    assert "Events WindowEnding on GPUReservation sprint and VMI sprint-vm" in text, text
    assert "VM sprint-vm: runStrategy Halted by the controller; VMI gone" in text, text
    # kubectl gpu: a tenant's explain of its waiting claim, and the hoster's top.
    assert "alice creates the VM with its own rights (ClusterRole admin)" in text, text
    assert "$ kubectl gpu explain vm burst -n tenant-acme-research --as alice" in text, text
    explain = "$ kubectl gpu explain claim burst-gpu -n tenant-acme-research --as alice"
    assert explain in text, text
    told = text.split(explain, 1)[1].split("  ✓ ", 1)[0]
    assert "Phase:      Pending" in told and "BudgetExceeded" in told, told
    assert "- ask for a budget: the message above says which key and who can raise it" in told
    for other in ("render", "gpu-h100-01", "gpu-l40s-01", "gpu-l40s-02", "worker-01"):
        assert other not in told, f"a tenant's explain names {other}:\n{told}"
    top = text.split("$ kubectl gpu top nodes\n", 1)[1].split("  ✓ ", 1)[0]
    assert "NODE" in top and "ALLOCATABLE" in top, top
    for node in ("gpu-h100-01", "gpu-l40s-01", "gpu-l40s-02"):
        assert node in top, top
    assert "as alice: exit 1: error: top needs to list nodes" in text, text
    assert not directory.exists(), "demo down leaves nothing behind"
    # Each object of the demo's names, and its release, carries the run's mark: on a cluster
    # it did not start, what `make demo-down` removes by.
    made = {
        *(f"namespace {n}" for n in existing_cluster.FOREIGN_NAMESPACES),
        *(f"gpuclass {n}" for n in existing_cluster.FOREIGN_CLASSES),
        *(f"node {n}" for n in existing_cluster.FOREIGN_NODES),
        f"secret {run_state.NAMESPACE}/{existing_cluster.FOREIGN_SECRET}",
        f"serviceaccount {run_state.NAMESPACE}/{existing_cluster.FOREIGN_SERVICE_ACCOUNT}",
        existing_cluster.FOREIGN_RELEASE,
    }
    assert set(marks) >= made, marks
    assert {what for what, run in marks.items() if run != demo.state.run} == set(), marks


def test_without_a_real_node_the_demo_runs_and_rolls_the_controller_as_a_local_process() -> None:
    # The platform act and day two's upgrade only: the rest of the story does not depend on
    # where the controller runs.
    directory = Path(tempfile.mkdtemp(prefix="cgd-"))
    out = io.StringIO()
    options = story.Options(dir=directory, detach=False, show=False, out=out, node="no")
    demo = story.prepare(options)
    try:
        platform_act(demo)
        # The hosts act starts it once the agents run; it rolls the controller's process too.
        local_pods.start_local_kubelet(demo.state, detach=False)
        upgrade_controller(demo)
        controller_pods = node_pods.controller_pods(demo.api)
    except DemoFailure as failure:
        pytest.fail(f"{out.getvalue()}{failure.explain()}", pytrace=False)
    finally:
        platform.down(directory, say=lambda _line: None)
    text = out.getvalue()
    assert "no real node: not asked for (--node=no)" in text, text
    assert "a real node, " not in text, text
    # No Deployment controller runs without the node: the one pod is the demo's.
    assert [p.metadata.name for p in controller_pods] == ["cozystack-gpu-controller-0"]
    rolled = re.search(r"cozystack-gpu-controller-0: pid (\d+) → (\d+), GPU_REJECTION_TTL", text)
    assert rolled and rolled[1] != rolled[2], text
    assert "GPU_REJECTION_TTL 600 → 300; Ready, Lease held by cozystack-gpu-controller-0" in text
