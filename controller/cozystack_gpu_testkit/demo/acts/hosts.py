"""Act 1, Hosts: the playbook prepares the GPU hosts; the agents report them."""

from __future__ import annotations

import sys
from collections.abc import Callable

from cozystack_gpu import keys
from cozystack_gpu_testkit.demo import local_pods, platform, run_state
from cozystack_gpu_testkit.demo.acts.common import Demo, _gpunode_serving, _gpunode_summary
from cozystack_gpu_testkit.demo.console import check, wait_until
from cozystack_gpu_testkit.demo.hosts import HOSTS, advertised, build_host, host_root, pods_file


# one piece: an act of the demo, its scenes in the order the viewer sees them
def act_hosts(demo: Demo) -> None:
    console = demo.console
    console.act(
        1,
        "Hosts",
        "Three GPU hosts boot; the host playbook lays them out; their agents report them.",
    )
    with console.step("three GPU hosts boot: sysfs trees, kubelets register their Nodes") as found:
        for host in HOSTS:
            build_host(demo.dir, host)
            demo.kubelets.register(host.name, gpu=True)
            found.append(f"{host.name}: {host.about}")

    with console.step("ansible-playbook hosts.yml: gpu_node_layout, node_labels") as found:
        recap = demo.ansible("hosts.yml", "ansible-hosts.log")
        for host in HOSTS:
            root = host_root(demo.dir, host.name)
            counts = {r: len(ids) for r, ids in advertised(root).items()}
            check(
                counts == host.advertises,
                f"{host.name}'s tree laid out as {host.advertises}",
                f"{counts}",
            )
            labels = demo.kube.core.read_node(host.name).metadata.labels or {}
            wanted = {**host.labels, keys.LABEL_NODE_LAYOUT_STATE: "applied"}
            missing = {k: v for k, v in wanted.items() if labels.get(k) != v}
            check(not missing, f"Node {host.name} labelled {wanted}", f"labels {labels}")
            found.append(
                f"{host.name}: " + ", ".join(f"{n} x {r}" for r, n in sorted(counts.items()))
            )
        found.extend(recap)
        found.append(f"log: {demo.logs / 'ansible-hosts.log'}")

    with console.step("device plugins advertise; kubelets serve pod-resources") as found:
        for host in HOSTS:
            devices = demo.kubelets.advertise(host.name)
            root = host_root(demo.dir, host.name)
            run_state.spawn(
                demo.state,
                f"kubelet/{host.name}",
                [sys.executable, "-m", "cozystack_gpu_testkit.fake_kubelet",
                 "--socket", str(root / "var/lib/kubelet/pod-resources/kubelet.sock"),
                 "--sysfs-root", str(root), "--pods-file", str(pods_file(demo.dir, host.name))],
                log=demo.logs / f"kubelet-{host.name}.log",
                detach=demo.options.detach,
            )  # fmt: skip
            found.append(
                f"{host.name} allocatable: "
                + ", ".join(f"{r}: {len(ids)}" for r, ids in sorted(devices.items()))
            )

    with console.step("the agent DaemonSet's pods, one per GPU node, as local processes") as found:
        daemonset = run_state.installed(demo.api, "DaemonSet", "cozystack-gpu-agent")
        spec = daemonset["spec"]["template"]["spec"]
        nodes = [
            n.metadata.name
            for n in demo.kube.core.list_node().items
            if platform.node_matches(spec, n.metadata.labels or {})
        ]
        check(
            sorted(nodes) == sorted(h.name for h in HOSTS),
            "the DaemonSet to select exactly the three GPU nodes",
            f"{sorted(nodes)}",
        )
        for node in sorted(nodes):
            name = f"cozystack-gpu-agent-{node}"
            demo.agents[node] = demo.pods.start(daemonset, name, node, host_root(demo.dir, node))
        for node, pod in sorted(demo.agents.items()):
            demo.pods.wait_ready(pod)
            found.append(f"{pod.name} on {node}: ready (its GPUNode written); log {pod.log}")
        found.append(
            "each as ServiceAccount cozy-gpu/cozystack-gpu-agent with a token bound to its Pod: "
            "the chart's own-node policy sees its node"
        )
        # Every chart pod runs now: the local kubelet takes them over (and the state file).
        pid = local_pods.start_local_kubelet(demo.state, detach=demo.options.detach)
        local = "these pods" if demo.node is not None else "these pods and the controller's"
        found.append(
            f"a local kubelet (pid {pid}) restarts {local} when their pod templates change, "
            f"as a cluster rolls them; log {demo.logs}/local-kubelet.log"
        )

    with console.step("GPUNodes: the agents' inventory, the binder's conditions") as found:
        for host in HOSTS:
            wait_until(
                serving(demo, host.name, host.advertises),
                expected=f"GPUNode {host.name} with {host.advertises}, Ready and Advertised",
                saw=gpunode_summary(demo, host.name),
                timeout=60,
            )
            found.append(f"{host.name}: {_gpunode_summary(demo.gpunode(host.name))}")
    demo.show("get", "nodes", "-L", f"{keys.LABEL_NODE_LAYOUT},{keys.LABEL_NODE_LAYOUT_STATE}")
    demo.show("get", "gpunodes")


def serving(demo: Demo, name: str, wanted: dict[str, int]) -> Callable[[], bool]:
    return lambda: _gpunode_serving(demo, name, wanted)


def gpunode_summary(demo: Demo, name: str) -> Callable[[], str]:
    return lambda: _gpunode_summary(demo.gpunode(name))
