"""Act 8, The end: what is left free once the tenants let go."""

from __future__ import annotations

from cozystack_gpu_testkit.demo import run_state
from cozystack_gpu_testkit.demo.acts.common import (
    FREE_AT_END,
    ORDERS,
    Demo,
    _free,
    _gpunode_serving,
    _gpunode_summary,
)
from cozystack_gpu_testkit.demo.console import check, wait_until
from cozystack_gpu_testkit.demo.hosts import HOSTS


def act_end(demo: Demo) -> None:
    console = demo.console
    console.act(8, "The end", "Classes, claims and nodes as they stand; the cluster stays up.")
    with console.step("the catalog, the holds and the nodes agree") as found:
        wait_until(
            lambda: _free(demo) == FREE_AT_END,
            expected=f"free units per class {FREE_AT_END}",
            saw=lambda: f"{_free(demo)}",
            timeout=30,
        )
        phases = {}
        for ns, name, _cls, _count in ORDERS:
            claim = demo.claim(ns, name) or {}
            phases[name] = (claim.get("status") or {}).get("phase")
        check(
            set(phases.values()) == {"Bound"},
            "every claim Bound (the VM is gone; holds stay)",
            f"{phases}",
        )
        for host in HOSTS:
            check(
                _gpunode_serving(demo, host.name, host.advertises),
                f"GPUNode {host.name} serving",
                _gpunode_summary(demo.gpunode(host.name)),
            )
        found.append(f"free per class {FREE_AT_END}; claims {phases}")
    demo.show("get", "gpuclasses")
    demo.show("get", "gpuclaims", "-A")
    demo.show("get", "gpunodes")
    demo.show("-n", run_state.NAMESPACE, "get", "pods", "-o", "wide")
