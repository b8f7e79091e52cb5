"""What tenants do to claims: order one (under an odd name too), delete one (most often one a
running VM uses), try to strip its finalizers, cut a template claim from its VMI, squat a
template claim's name, cut a usage record loose from its claim."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.objects import MutableObj, translate
from cozystack_gpu.objects.translate import meta
from cozystack_gpu_testkit import kubevirt
from cozystack_gpu_testkit.fault_suite import Run
from cozystack_gpu_testkit.fuzz.stage import Stage, describe
from cozystack_gpu_testkit.objects import TIMEOUT, message_of, wait_for

log = logging.getLogger(__name__)


def order(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    world = run.world
    namespace = stage.rng.choice(world.tenants)
    name = stage.next_name("c")
    gpu_class = stage.rng.choice(world.classes)
    count = 2 if stage.rng.random() < 0.25 else 1
    return _submit_order(stage, namespace, name, gpu_class, count, f"{namespace}/{name}")


def _submit_order(
    stage: Stage, namespace: str, name: str, gpu_class: str, count: int, shown: str
) -> tuple[str, str, set[str]]:
    """The tenant admin orders ``count`` units of ``gpu_class`` as claim ``name``."""
    body = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": {"name": name},
        "spec": {"class": gpu_class, "count": count},
    }
    args = f"{shown} {gpu_class} x{count}"
    try:
        stage.claim_call(stage.tenant.custom.create_namespaced_custom_object, namespace, body)
    except ApiException as exc:
        return args, f"refused: {message_of(exc)}", {name}
    return args, "accepted", {name}


def delete_claim(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    picked = stage.attached_pick()
    if picked is None:
        return "", "no claim", set()
    namespace, name = picked
    args = f"{namespace}/{name} ({describe(stage.claims[picked])})"
    try:
        stage.claim_call(stage.tenant.custom.delete_namespaced_custom_object, namespace, name)
    except ApiException as exc:
        return args, f"refused: {message_of(exc)}", {name}
    return args, "deleted", {name}


def strip_finalizers(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    picked = stage.attached_pick()
    if picked is None:
        return "", "no claim", set()
    namespace, name = picked
    args = f"{namespace}/{name} ({describe(stage.claims[picked])})"
    custom = stage.tenant.custom
    try:
        stage.claim_call(custom.delete_namespaced_custom_object, namespace, name)
    except ApiException as exc:
        if exc.status != 404:
            return args, f"delete refused: {message_of(exc)}", {name}
    try:
        current = stage.claim_call(custom.get_namespaced_custom_object, namespace, name)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return args, "deleted at once: no finalizer held it", {name}
    if not meta(current).get("finalizers"):
        return args, "gone or no finalizers to strip", {name}
    patch = [{"op": "remove", "path": "/metadata/finalizers"}]
    try:
        stage.claim_call(
            custom.patch_namespaced_custom_object, namespace, name, patch,
            _content_type="application/json-patch+json", _request_timeout=TIMEOUT,
        )  # fmt: skip
    except ApiException as exc:
        return args, f"strip refused: {message_of(exc)}", {name}
    return args, f"STRIPPED {meta(current).get('finalizers')}", {name}


def cut_owner(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """The tenant cuts a VM's template claim from its VMI, so that the garbage collector
    would never delete it: its owner references removed, a second owner of its own
    added, the template label or the VMI-uid annotation taken off. The protection
    policy refuses each; a cut that passes must still not outlive the VMI
    (``ORPHANED``)."""
    running = stage.kubevirt.running
    templates = sorted(
        (key for key, c in stage.claims.items() if translate.made_by_template(c)),
        key=lambda k: ((k[0], str((stage.claims[k].get("status") or {}).get("attachedTo")))
                       not in running, k),
    )  # fmt: skip
    if not templates:
        return "", "no template claim", set()
    namespace, name = templates[0] if stage.rng.random() < 0.7 else stage.rng.choice(templates)
    mode = stage.rng.choice(("owners removed", "second owner", "label removed", "uid removed"))
    args = f"{namespace}/{name} ({describe(stage.claims[(namespace, name)])}): {mode}"
    patch: Any
    content_type = "application/merge-patch+json"
    if mode == "owners removed":
        patch = {"metadata": {"ownerReferences": None}}
    elif mode == "label removed":
        patch = {"metadata": {"labels": {keys.LABEL_TEMPLATE_CLAIM: None}}}
    elif mode == "uid removed":
        patch = {"metadata": {"annotations": {keys.ANNOTATION_TEMPLATE_VMI_UID: None}}}
    else:
        holder = stage.tenant.core.create_namespaced_config_map(
            namespace, {"metadata": {"generateName": "holder-"}}, _request_timeout=TIMEOUT
        )
        owner = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "name": holder.metadata.name, "uid": holder.metadata.uid,
        }  # fmt: skip
        patch = [{"op": "add", "path": "/metadata/ownerReferences/-", "value": owner}]
        content_type = "application/json-patch+json"
    try:
        stage.claim_call(
            stage.tenant.custom.patch_namespaced_custom_object, namespace, name, patch,
            _content_type=content_type, _request_timeout=TIMEOUT,
        )  # fmt: skip
    except ApiException as exc:
        return args, f"refused: {message_of(exc)}", {name}
    return args, f"CUT ({mode})", {name}


def squat_template(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """The tenant pre-creates a claim named like a VM's template claim, with a bigger
    count: after the VM's VMI is deleted (its own template claim goes with it), before
    the next VMI's gate runs. virt-controller makes that next VMI as soon as the old one
    is gone: the squat gets in only when the gate has not yet made its claim."""
    vms = [vm for vm in stage.vms.values() if vm.templates and not vm.gone]
    if not vms:
        return "", "no VM with templates", set()
    vm = stage.rng.choice(sorted(vms, key=lambda v: v.name))
    entry = vm.templates[0]
    name = stage.template_name(vm, entry)
    custom = run.kube.custom
    old = kubevirt.get_vmi(run.kube, vm.namespace, vm.name)
    try:
        stage.vmi_call(custom.delete_namespaced_custom_object, vm.namespace, vm.name)
    except ApiException as exc:
        if exc.status != 404:
            raise

    def claim_gone() -> bool:
        """The old VMI's template claim gone (or already the next VMI's): meanwhile the
        nodes go on (the VMI waits for its guest to shut down and its pod to go)."""
        try:
            stage.kubevirt.reconcile()
        except Exception as exc:  # the server away for a moment: the next poll
            log.debug("squat: %s", exc)
        try:
            claim = stage.claim_call(custom.get_namespaced_custom_object, vm.namespace, name)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        owners = {str(r.get("uid")) for r in meta(claim).get("ownerReferences") or []}
        return old is not None and kubevirt.uid_of(old) not in owners

    # The garbage collector takes the old VMI's template claim; one still there
    # (protected, or slow) makes the create below say so.
    with contextlib.suppress(AssertionError):
        wait_for(claim_gone, 20, f"claim {name} collected", 0.5)
    owner: list[MutableObj] = []
    others = [
        v for v in stage.vmi_call(custom.list_namespaced_custom_object, vm.namespace)["items"]
        if meta(v)["name"] != vm.name
    ]  # fmt: skip
    if others and stage.rng.random() < 0.6:
        # The claim webhook takes a labelled claim owned by any VMI: another of hers.
        other = stage.rng.choice(others)
        owner = [
            {
                "apiVersion": keys.VMI.api_version,
                "kind": keys.VMI.kind,
                "name": meta(other)["name"],
                "uid": meta(other)["uid"],
                "controller": True,
            }
        ]
    labelled = bool(owner) or stage.rng.random() < 0.3
    body = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": {
            "name": name,
            "labels": (
                {keys.LABEL_TEMPLATE_CLAIM: keys.LABEL_TEMPLATE_CLAIM_VALUE} if labelled else {}
            ),
            "ownerReferences": owner,
        },
        "spec": {"class": entry["class"], "count": int(entry["count"]) + 1},
    }
    args = (
        f"{vm.namespace}/{name} x{int(entry['count']) + 1} for entry x{entry['count']}, "
        f"label {labelled}, owner {'VMI ' + owner[0]['name'] if owner else 'none'}, "
        "after its VMI was deleted"
    )
    try:
        stage.claim_call(stage.tenant.custom.create_namespaced_custom_object, vm.namespace, body)
    except ApiException as exc:
        return args, f"refused: {message_of(exc)}", stage.names(vm)
    return args, "accepted", stage.names(vm)


# A prefix long enough that two orders of it agree up to where a record's name is cut.
LONG_PREFIX = "long-" + "x" * 240


def odd_name_order(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """An order under a name at the edges of what the API server accepts: 253 characters,
    two long ones that agree up to a usage record's name limit, one with dots, and one the
    API server refuses (a trailing newline, which a ``$`` anchor would let through). Each
    accepted order gets a usage record of its own once bound (the invariants' RECORDS)."""
    world = run.world
    namespace = stage.rng.choice(world.tenants)
    seq = stage.next_name("")
    name = stage.rng.choice(
        (
            ("n" + seq + "-" + "y" * 253)[:253],
            f"{LONG_PREFIX}-{seq}",
            f"dotted.{seq}.order",
            f"gpu{seq}\n",
        )
    )
    gpu_class = stage.rng.choice(world.classes)
    shown = f"{namespace}/{name!r} ({len(name)} characters)"
    return _submit_order(stage, namespace, name, gpu_class, 1, shown)


def orphan_record(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """The tenant admin cuts a usage record loose from its claim (its ownerReferences
    removed), so it is never repaired and bills a later claim of that name. No tenant role
    reaches Workloads; were the cut made, the binder replaces the record with one of the
    claim's own and removes the orphan (the invariants' RECORDS)."""
    records = [
        (namespace, item["metadata"]["name"])
        for namespace in run.world.tenants
        for item in run.kube.custom.list_namespaced_custom_object(
            keys.WORKLOAD.group, keys.WORKLOAD.version, namespace, keys.WORKLOAD.plural,
            _request_timeout=TIMEOUT,
        )["items"]
    ]  # fmt: skip
    if not records:
        return "", "no usage record", set()
    namespace, name = stage.rng.choice(sorted(records))
    args = f"{namespace}/{name}"
    patch = [{"op": "remove", "path": "/metadata/ownerReferences"}]
    try:
        stage.tenant.custom.patch_namespaced_custom_object(
            keys.WORKLOAD.group, keys.WORKLOAD.version, namespace, keys.WORKLOAD.plural, name,
            patch, _content_type="application/json-patch+json", _request_timeout=TIMEOUT,
        )  # fmt: skip
    except ApiException as exc:
        return args, f"refused: {message_of(exc)}", {name}
    return args, "cut loose (the binder must replace it)", {name}
