"""What a driver judges with reads of its own, at its own pace (the lifecycle fuzz's driver:
every few operations and while the run settles), beside the checker's looks; each rule is
the product's, but needs what only a driver that starts VMs can tell (how long a refusal
stood, which claims were made for which VMI uid, the claims it listed last):

- ``look_stranded``: a pinned launcher pod that a Ready, schedulable node has refused for
  ``STRANDED_AFTER_S`` and that is still there, unscheduled (``STRANDED``; SPEC §6);
- ``look_surplus``: an ungated launcher pod of a live VMI asking, over all its containers,
  more units of the GPU resource than the claims attached to that VMI hold (``SURPLUS``;
  SPEC §6);
- ``orphans``, once settled: template claims whose VMI, by the uid they were made for, is
  gone (``ORPHANED``; SPEC §7).

The looks yield each new subject (one not in ``known``) with its violation's text; the
driver keeps them. A read the server does not answer is the next look's.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Collection, Container, Iterator, Mapping
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.objects import MutableObj, launcher, translate
from cozystack_gpu_testkit.invariants.reading import required_pins
from cozystack_gpu_testkit.invariants.state import (
    ORPHANED,
    STRANDED,
    SURPLUS,
    Violation,
    _meta,
)
from cozystack_gpu_testkit.objects import TIMEOUT, Kube

log = logging.getLogger(__name__)

# A refusal the controller has not acted on this long after the scheduler said it.
STRANDED_AFTER_S = 15.0


def look_stranded(kube: Kube, known: Container[str]) -> Iterator[tuple[str, str]]:
    """A pinned launcher pod that a Ready, schedulable node has refused for
    ``STRANDED_AFTER_S`` and that is still there, unscheduled: SPEC §6 says the
    controller deletes it and moves the set (for any resource the pod lacks there)."""
    try:
        nodes = {n.metadata.name: n for n in kube.core.list_node().items}
        pods = kube.core.list_pod_for_all_namespaces(label_selector="kubevirt.io=virt-launcher")
    except Exception as exc:  # the server away: the next look
        log.debug("stranded look: %s", exc)
        return
    now = datetime.datetime.now(datetime.UTC)
    for pod in pods.items:
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        if key in known or pod.spec.node_name or pod.metadata.deletion_timestamp:
            continue
        pins = required_pins(kube.api.sanitize_for_serialization(pod).get("spec") or {})
        node = nodes.get(pins[0]) if pins and pins[0] is not None else None
        refused = next(
            (
                c
                for c in pod.status.conditions or []
                if (c.type, c.status, c.reason) == ("PodScheduled", "False", "Unschedulable")
            ),
            None,
        )
        if node is None or refused is None or node.spec.unschedulable:
            continue
        since = refused.last_transition_time
        if since is None or (now - since).total_seconds() < STRANDED_AFTER_S:
            continue
        conditions = node.status.conditions or []
        if any(c.type == "Ready" and c.status == "True" for c in conditions):
            owner = next(iter(pod.metadata.owner_references or []), None)
            text = (
                f"{STRANDED}: {key}: VMI {owner.name if owner else '?'} pinned to "
                f"{pins[0]} (Ready, schedulable), refused since {since}: {refused.message}"
            )
            yield key, text


def look_surplus(kube: Kube, resource: str, known: Container[str]) -> Iterator[tuple[str, str]]:
    """An ungated launcher pod of a live VMI with claims asks, over all its containers,
    no more units of the GPU resource than the claims attached to that VMI hold: KubeVirt
    adds a request per network whose definition names a resource, and the gate must
    keep such a pod gated (SPEC §6)."""
    try:
        pods = kube.core.list_pod_for_all_namespaces(
            label_selector=f"kubevirt.io=virt-launcher,{keys.LABEL_CLAIMS_REF}"
        )
        # Read after the pods: a pod's claims exist before the gate lets it go.
        claims = _items(
            kube.custom.list_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_CLAIMS, _request_timeout=TIMEOUT
            )
        )
        vmis = _items(
            kube.custom.list_cluster_custom_object(
                keys.VMI.group, keys.VMI.version, keys.VMI.plural, _request_timeout=TIMEOUT
            )
        )
    except Exception as exc:  # the server away: the next look
        log.debug("surplus look: %s", exc)
        return
    live = {
        _meta(v).get("uid")
        for v in vmis
        if (v.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and not _meta(v).get("deletionTimestamp")
    }
    for pod in pods.items:
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        gates = [g.name for g in pod.spec.scheduling_gates or []]
        if key in known or keys.SCHEDULING_GATE_CLAIMS in gates:
            continue
        owner = next((o for o in pod.metadata.owner_references or [] if o.uid), None)
        if owner is None or pod.metadata.deletion_timestamp:
            continue
        if pod.status.phase in ("Succeeded", "Failed") or owner.uid not in live:
            continue  # a finishing pod: its claims let go when its VMI ended
        asked = launcher.extended_requests(kube.api.sanitize_for_serialization(pod)).get(
            resource, 0
        )
        # Its claims: held ones attached to it, and the template claims made for it
        # (attached by the leader a moment after the start).
        held = sum(
            int((c.get("spec") or {}).get("count") or 1)
            for c in claims
            if _meta(c)["namespace"] == pod.metadata.namespace
            and (
                (c.get("status") or {}).get("attachedToUID") == owner.uid
                or (translate.made_by_template(c) and translate.template_made_for(c) == owner.uid)
            )
        )
        if asked > held:
            text = (
                f"{SURPLUS}: {key} (VMI {owner.name}) asks {asked} x {resource}, its "
                f"claims hold {held}"
            )
            yield key, text


def orphans(
    kube: Kube, tenants: Collection[str], claims: Mapping[tuple[str, str], MutableObj]
) -> list[Violation]:
    """Template claims whose VMI, by the uid they were made for, is gone: SPEC §7 says
    the controller deletes them, whatever their metadata says (a cut owner must not
    leave an unbilled hold). Judged once settled: the binder sweeps them every few
    seconds, after a grace for a VMI watch that lags."""
    vmis = kube.custom.list_cluster_custom_object(
        keys.VMI.group, keys.VMI.version, keys.VMI.plural, _request_timeout=TIMEOUT
    )
    live = {(_meta(v)["namespace"], _meta(v).get("uid")) for v in vmis.get("items") or []}
    found = []
    for (namespace, name), claim in sorted(claims.items()):
        if namespace not in tenants or not translate.made_by_template(claim):
            continue
        uid = translate.template_made_for(claim)
        if (namespace, uid) not in live:
            found.append(
                Violation(
                    ORPHANED,
                    f"{namespace}/{name}",
                    f"made for VMI uid {uid}, which is gone; phase "
                    f"{(claim.get('status') or {}).get('phase')}, node "
                    f"{(claim.get('status') or {}).get('nodeName')}",
                )
            )
    return found


def _items(listing: Mapping[str, Any]) -> list[MutableObj]:
    return list(listing.get("items") or [])
