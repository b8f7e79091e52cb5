"""The demo's pure parts: how a pod's container is mapped to a local process, which nodes a
DaemonSet selects, when the local kubelet restarts a pod, how a step that does not turn out
as expected stops the demo, and the booked window's times and the hoster's limits on it."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest

from cozystack_gpu import config
from cozystack_gpu_testkit.demo.acts import reservation
from cozystack_gpu_testkit.demo.acts.common import CHART_VALUES, WINDOW_WARN_S
from cozystack_gpu_testkit.demo.console import Console, DemoFailure, Mismatch, check, wait_until
from cozystack_gpu_testkit.demo.existing_cluster import chosen_cluster
from cozystack_gpu_testkit.demo.hosts import check_socket_paths
from cozystack_gpu_testkit.demo.local_pods import (
    Rollout,
    expand_vars,
    localize,
    rollout,
    template_hash,
)
from cozystack_gpu_testkit.demo.platform import node_matches

ROOT = Path("/demo/pods/gpu-1/agent")


def test_container_variables_expand_as_kubelet_expands_them() -> None:
    env = {"NODE_NAME": "gpu-1"}
    assert expand_vars("--node=$(NODE_NAME)", env) == "--node=gpu-1"
    # An unknown variable stays as written, as kubelet leaves it.
    assert expand_vars("$(OTHER)/x", env) == "$(OTHER)/x"


def test_container_paths_lie_below_the_pod_root_and_ports_are_mapped() -> None:
    ports = {8080: 41000, 9443: 41001}
    assert localize("--sysfs-root=/host", ROOT, ports) == f"--sysfs-root={ROOT}/host"
    assert localize("/var/run/certs", ROOT, ports) == f"{ROOT}/var/run/certs"
    assert localize("--listen=0.0.0.0:8080", ROOT, ports) == "--listen=0.0.0.0:41000"
    assert localize("--health-port=8080", ROOT, ports) == "--health-port=41000"
    assert localize("9443", ROOT, ports) == "41001"
    # Numbers that only contain a port are not ports.
    assert localize("18080", ROOT, ports) == "18080"
    assert localize("--period=60", ROOT, ports) == "--period=60"


def test_a_daemonset_selects_nodes_by_its_selector_and_required_affinity() -> None:
    spec = {
        "nodeSelector": {"pool": "gpu"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "layout-state", "operator": "Exists"}]}
                    ]
                }
            }
        },
    }
    assert node_matches(spec, {"pool": "gpu", "layout-state": "applied"})
    assert not node_matches(spec, {"pool": "gpu"})
    assert not node_matches(spec, {"layout-state": "applied"})
    assert node_matches({}, {})


def _deployment(template: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "Deployment", "metadata": {"generation": 1}, "spec": {"template": template}}


def test_a_changed_pod_template_restarts_the_local_pod_and_an_unchanged_one_keeps_it() -> None:
    env = [{"name": "GPU_REJECTION_TTL", "value": "600"}]
    template = {
        "metadata": {"labels": {"app": "controller"}, "annotations": {"checksum/cert": "ab"}},
        "spec": {"containers": [{"name": "c", "env": env}]},
    }
    started = template_hash(template)
    # The same template (as read back, keys in another order, other fields changed): kept.
    same = dict(reversed(list(copy.deepcopy(template).items())))
    owner = _deployment(same)
    owner["metadata"]["generation"] = 2
    owner["spec"]["replicas"] = 1
    assert rollout(started, owner) is Rollout.KEEP
    # A new env value (helm upgrade --set controller.settings...) or annotation: restarted.
    upgraded = copy.deepcopy(template)
    upgraded["spec"]["containers"][0]["env"][0]["value"] = "300"
    assert rollout(started, _deployment(upgraded)) is Rollout.RESTART
    annotated = copy.deepcopy(template)
    annotated["metadata"]["annotations"]["checksum/cert"] = "cd"
    assert rollout(started, _deployment(annotated)) is Rollout.RESTART
    # Its Deployment or DaemonSet gone (helm uninstall): the process stops.
    assert rollout(started, None) is Rollout.STOP
    # Stopped with its owner gone; started again when the owner is back, whatever template.
    assert rollout(started, None, stopped=True) is Rollout.KEEP
    assert rollout(started, owner, stopped=True) is Rollout.START


def test_a_step_that_sees_something_else_stops_the_demo_naming_it(tmp_path: Path) -> None:
    out = io.StringIO()
    console = Console(tmp_path, out=out)
    console.act(3, "Orders", "what happens")
    with console.step("an order binds") as found:
        found.append("bound on gpu-1")
    assert "  ✓ an order binds (" in out.getvalue()
    assert "      bound on gpu-1\n" in out.getvalue()
    with pytest.raises(DemoFailure) as failure, console.step("an order is refused"):
        check(False, "a refusal", "it was admitted")
    assert failure.value.step == "act 3 (Orders): an order is refused"
    assert (failure.value.expected, failure.value.saw) == ("a refusal", "it was admitted")
    assert failure.value.logs == tmp_path
    explained = failure.value.explain()
    assert "expected: a refusal" in explained and "saw:      it was admitted" in explained
    assert str(tmp_path) in explained


def test_an_error_in_a_step_stops_the_demo_with_the_error(tmp_path: Path) -> None:
    console = Console(tmp_path, out=io.StringIO())
    with pytest.raises(DemoFailure) as failure, console.step("helm install"):
        raise RuntimeError("helm install failed: no chart")
    assert failure.value.saw == "RuntimeError: helm install failed: no chart"


def test_waiting_gives_up_saying_what_it_saw_last() -> None:
    assert wait_until(lambda: "ok", expected="x", saw=lambda: "never") == "ok"
    with pytest.raises(Mismatch) as mismatch:
        wait_until(lambda: None, expected="a Bound claim", saw=lambda: "Pending", timeout=0.05)
    assert mismatch.value.expected == "a Bound claim (within 0 s)"
    assert mismatch.value.saw == "Pending"


def test_a_directory_too_deep_for_unix_sockets_is_refused_before_anything_starts() -> None:
    deep = Path("/" + "d" * 80)
    with pytest.raises(ValueError, match="choose a shorter --dir"):
        check_socket_paths(deep, lambda node: deep / "pods" / node / "agent")
    check_socket_paths(Path("/tmp/cgd-x"), lambda node: Path("/tmp/cgd-x/pods") / node / "agent")


def test_the_demo_never_writes_to_a_cluster_it_was_not_told_to_use() -> None:
    """A $KUBECONFIG left set in the shell is not a request: the demo starts its own plane
    and says it ignored it; only --existing-cluster uses it, and then says what it makes."""
    assert chosen_cluster(None, existing=False) == (None, [])
    kubeconfig, notice = chosen_cluster("/home/hoster/.kube/prod", existing=False)
    assert kubeconfig is None
    assert "/home/hoster/.kube/prod) is ignored" in notice[0]
    assert "CLUSTER=existing" in notice[1]
    kubeconfig, notice = chosen_cluster("/home/hoster/.kube/prod", existing=True)
    assert kubeconfig == "/home/hoster/.kube/prod"
    told = "\n".join(notice)
    for made in ("gpu-h100-01", "tenant-acme-research", "l40s-24c", "nls-token", "make demo-down"):
        assert made in told, made
    # What it makes there is marked, and only what is marked goes again.
    assert "labelled with this run's id as\n! demo.cozystack.io/run." in told, told
    assert "removes only what" in told and "carries this run's label" in told, told
    with pytest.raises(ValueError, match="KUBECONFIG is not set"):
        chosen_cluster(None, existing=True)


def test_the_booked_window_opens_on_a_whole_minute_after_the_booking() -> None:
    minute = 60
    hour = 1_800_000_000  # a whole minute (and hour) in epoch seconds
    # Early in a minute the window opens at the next one; later, at the one after.
    assert reservation.window_times(hour + 10) == (hour + minute, hour + 3 * minute)
    assert reservation.window_times(hour + 30) == (hour + minute, hour + 3 * minute)
    assert reservation.window_times(hour + 31) == (hour + 2 * minute, hour + 4 * minute)
    assert reservation.window_times(hour) == (hour + minute, hour + 3 * minute)
    for second in range(0, 2 * minute):
        now = hour + second + 0.5
        start, end = reservation.window_times(now)
        # Whole minutes, as the reservation webhook takes them; far enough ahead for the
        # booking and the refused order, near enough that the act waits a minute and a half
        # at most.
        assert start % minute == 0 and end % minute == 0
        assert reservation.WINDOW_LEAD_S <= start - now < reservation.WINDOW_LEAD_S + minute
        assert end - start == reservation.WINDOW_MINUTES * minute


def test_the_hosters_limits_in_the_demo_put_the_warning_inside_the_window() -> None:
    limits = CHART_VALUES["reservations"]
    settings = config.parse(
        [
            f"--reservation-max-lead={limits['maxLead']}",
            f"--reservation-warn-before={limits['warnBefore']}",
        ]
    )
    length = reservation.WINDOW_MINUTES * 60
    # Warned after the VM has had time to start, before the end; as the act's step says.
    assert 0 < settings.reservation_warn_before <= length / 2
    assert settings.reservation_warn_before == WINDOW_WARN_S
    # The act's window is booked within maxLead; the same window a day later is not.
    assert reservation.WINDOW_LEAD_S + 60 <= settings.reservation_max_lead < reservation.DAY
    assert reservation.clock(1_800_000_000) == "08:00 UTC"
    assert reservation.clock(1_800_000_000 + 90) == "08:01:30 UTC"
