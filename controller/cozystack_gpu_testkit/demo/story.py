"""The demo's story: a platform, then eight acts, each a function whose outcome is checked.

Every act reads back what it did from the API server (or the hosts' sysfs trees) and stops the
demo when that is not what it expects (:mod:`.console`). The acts hand on what later acts need
(where claims were bound, which pod runs the VM) in :class:`Demo`.

Here are the order of the acts and the demo's start and end; each act is a module of
:mod:`.acts`, and what they share (``Options``, ``Demo``, the story's names such as
``FREE_AT_END``) is in :mod:`.acts.common`, re-exported here for the demo's callers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.demo import local_pods, run_state
from cozystack_gpu_testkit.demo.acts.catalog import act_catalog
from cozystack_gpu_testkit.demo.acts.common import (
    BURST,
    FREE_AT_END,
    RESEARCH,
    TENANT_USER,
    Demo,
    Options,
)
from cozystack_gpu_testkit.demo.acts.day_two import act_day_two
from cozystack_gpu_testkit.demo.acts.hosts import act_hosts
from cozystack_gpu_testkit.demo.acts.life import act_life
from cozystack_gpu_testkit.demo.acts.orders import act_orders
from cozystack_gpu_testkit.demo.acts.platform_up import platform_act
from cozystack_gpu_testkit.demo.acts.reservation import act_window
from cozystack_gpu_testkit.demo.acts.the_end import act_end
from cozystack_gpu_testkit.demo.acts.vm_start import act_vm
from cozystack_gpu_testkit.demo.console import Console, DemoFailure
from cozystack_gpu_testkit.demo.hosts import check_socket_paths

__all__ = ["ACTS", "FREE_AT_END", "Demo", "Options", "fail", "finish", "play", "prepare"]

ACTS: tuple[Callable[[Demo], None], ...] = (
    platform_act,
    act_hosts,
    act_catalog,
    act_orders,
    act_vm,
    act_window,
    act_life,
    act_day_two,
    act_end,
)


def prepare(options: Options) -> Demo:
    """The demo's directory and state, before anything starts."""
    directory = options.dir
    directory.mkdir(parents=True, exist_ok=True)
    check_socket_paths(directory, lambda node: local_pods.pod_root(directory, node, "agent"))
    (directory / "logs").mkdir(exist_ok=True)
    state = run_state.State(
        dir=str(directory),
        kubeconfig=options.kubeconfig or "",
        bin_dir=str(cluster.binary_dir()),
        own_plane=options.kubeconfig is None,
        run=run_state.new_run(),
        images=dict(options.images),
    )
    state.save()
    console = Console(directory / "logs", out=options.out, show_output=options.show)
    return Demo(options, console, state)


def play(demo: Demo) -> None:
    """Every act in order; raises :class:`DemoFailure` at the first step that fails.
    Whatever it started stays up (``platform.down`` stops it)."""
    for act in ACTS:
        act(demo)


def finish(demo: Demo) -> None:
    """The closing lines: how to reach the cluster, how to stop it."""
    say = demo.console.say
    say()
    say(f"The demo ran in {demo.console.elapsed():.0f} s. The cluster stays up:")
    say()
    say(f"  export KUBECONFIG={demo.state.kubeconfig}")
    # kubectl and helm from the built binaries, kubectl-gpu from this environment.
    say(f"  export PATH={demo.state.bin_dir}:{Path(sys.executable).parent}:$PATH")
    say("  kubectl get gpuclasses; kubectl get gpuclaims -A; kubectl get gpunodes")
    say("  kubectl get gpureservations -A")
    say(f"  kubectl gpu explain claim {keys.template_claim_name(BURST, 'gpu')} -n {RESEARCH} "
        f"--as {TENANT_USER}; kubectl gpu top classes")  # fmt: skip
    say()
    if demo.node is not None:
        say(f"The controller runs as pods on the real node {demo.node.name}; the GPU hosts, their")
        say("kubelets and KubeVirt's virt-handler are simulated. helm upgrade rolls the")
        say("controller's pods (the Deployment) and the agents' local processes (a local")
        say("kubelet, its log: local-kubelet.log), e.g.")
    else:
        say("helm upgrade reaches the controller and agents: a local kubelet restarts their")
        say("processes when the pod templates change (its log: local-kubelet.log), e.g.")
    say(f"  helm upgrade {run_state.RELEASE} {run_state.CHART} -n {run_state.NAMESPACE} "
        "--reset-then-reuse-values --set controller.settings.writeWorkers=4")  # fmt: skip
    say()
    say(f"Logs: {demo.logs}/. Stop everything (controller, agents, kubelets, control plane):")
    say(f"  {demo.options.down_command}")


def fail(demo: Demo, failure: DemoFailure) -> None:
    say = demo.console.say
    say(failure.explain())
    if demo.state.kubeconfig:
        say(f"  the cluster is left up to look at: export KUBECONFIG={demo.state.kubeconfig}")
    say(f"  {demo.options.down_command} stops what the demo started")
