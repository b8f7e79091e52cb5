"""Deleting a GPUClass that still holds claims says so where each reader looks: on the
class (which every user reads) that claims still keep it, with neither counts nor names; on
each tenant's claim of the class, that the offer is being withdrawn."""

from __future__ import annotations

from functools import partial
from typing import Any

from binder_env import Env, condition

from cozystack_gpu import keys
from cozystack_gpu_testkit.objects import unless, wait_for


def _class(env: Env, name: str) -> dict[str, Any]:
    found: dict[str, Any] = env.kube.custom.get_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name
    )
    return found


def test_a_deleted_class_says_claims_keep_it_without_counts_and_its_claims_hear_of_it(
    env: Env,
) -> None:
    node = env.node("n1", 4)
    old = env.gpu_class("old")
    other = f"{env.tenant}-b"
    env.kube.namespace(other, {f"tenant.cozystack.io/{other}": ""})
    try:
        env.kube.claim(env.tenant, "held", old, 1)
        env.kube.claim(env.tenant, "running", old, 1)
        env.kube.claim(other, "theirs", old, 1)
        for namespace, name in ((env.tenant, "held"), (env.tenant, "running"), (other, "theirs")):
            env.wait_phase(name, "Bound", namespace=namespace)
        env.kube.attach(env.tenant, "running", "vm")
        env.kube.vmi(env.tenant, "vm", claims=["running"], phase="Running", node=node)
        env.wait_phase("running", "Attached")
        wait_for(
            lambda: keys.FINALIZER_CLASS in _class(env, old)["metadata"].get("finalizers", []),
            what="the class-protection finalizer",
        )

        env.kube.custom.delete_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, old
        )

        def said_on_class() -> dict[str, Any] | None:
            cond = condition(_class(env, old), keys.CONDITION_AVAILABLE)
            return cond if "still hold" in cond.get("message", "") else None

        cond = wait_for(said_on_class, what="the class saying claims keep it")
        assert cond["status"] == "False" and cond["reason"] == "Deleting"
        assert cond["message"] == (
            "the class is being deleted and takes no new orders; claims still hold units of "
            "this class, and it is removed once none does"
        ), cond["message"]
        for name in ("held", "running", "theirs", env.tenant, other):
            assert name not in cond["message"], "every user reads the class: no names"
        assert not any(ch.isdigit() for ch in cond["message"]), (
            f"every user reads the class: it told them how many claims hold it: {cond['message']}"
        )

        def withdrawn(namespace: str, name: str) -> dict[str, Any] | None:
            claim = env.kube.get_claim(namespace, name)
            found = condition(claim, keys.CONDITION_OFFER_WITHDRAWN)
            return found or None

        for namespace, name in ((env.tenant, "held"), (env.tenant, "running"), (other, "theirs")):
            note = wait_for(partial(withdrawn, namespace, name), what=f"{name} told")
            assert note["status"] == "True" and note["reason"] == "ClassDeleting"
            assert note["message"].startswith(f"class {old} is being deleted: the hoster "), note
            assert other not in note["message"] or namespace == other
        assert env.phase("held") == "Bound" and env.phase("running") == "Attached"
    finally:
        unless(
            404,
            lambda: env.kube.custom.delete_namespaced_custom_object(
                keys.GROUP, keys.VERSION, other, keys.PLURAL_CLAIMS, "theirs"
            ),
        )
        unless(404, lambda: env.kube.core.delete_namespace(other))
