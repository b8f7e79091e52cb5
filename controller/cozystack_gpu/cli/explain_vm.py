"""``kubectl gpu explain vm``: a VM's set of claims, its node and its launcher pod.

Pure: the edge reads the VirtualMachine and its VMI, the claims their claims annotation
names (held claims and the claims made from claim templates), the VMI's launcher pods and
the Events of all of them, all in the VM's namespace; ``explain`` makes the report and
``render`` its lines. Node names come only from what the tenant reads anyway: the claims'
status, the VMI's and the launcher pod's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.cli import text
from cozystack_gpu.cli.explain_claim import condition_of, phase_of
from cozystack_gpu.objects import Obj, annotation, vmi_pods
from cozystack_gpu.objects.translate import meta, name_of

Report = dict[str, Any]
EVENTS_SHOWN = 8  # the last ones; -o wide shows every one


@dataclass(frozen=True)
class VMReadings:
    """What the user read for one VM: ``vm`` and ``vmi`` (None when absent), the claims by
    name (None: not found), the launcher pods of the VMI and the namespace's Events about
    them (None: not readable)."""

    namespace: str
    name: str
    vm: Obj | None
    vmi: Obj | None
    claims: Mapping[str, Obj | None]
    pods: Sequence[Obj] | None
    events: Sequence[Obj] | None


def claim_names(vm: Obj | None, vmi: Obj | None, name: str) -> list[tuple[str, str]]:
    """(claim name, "held" | "template") of the set, in annotation order: the VMI's when it
    exists (what this start asked for), else the VM template's."""
    source: Obj | None = vmi
    if source is None and vm is not None:
        template = (vm.get("spec") or {}).get("template") or {}
        source = {"metadata": {"name": name, **(template.get("metadata") or {})}}
    if source is None:
        return []
    ref = annotation.claims_ref_of({"metadata": {**meta(source), "name": name}})
    if ref is None:
        return []
    out = [(c, "held") for c in ref.claims]
    out += [(c, "template") for c in annotation.template_claim_names(name, ref)]
    return out


def launcher_of(pods: Sequence[Obj], vmi: Obj | None) -> Obj | None:
    """The VMI's launcher pod (the newest, if KubeVirt made several)."""
    if vmi is None:
        return None
    uid = str(meta(vmi).get("uid") or "")
    mine = [
        p
        for p in pods
        if vmi_pods.owning_vmi(p) == name_of(vmi)
        and (not uid or vmi_pods.owning_vmi_uid(p) == uid)
        and not (meta(p).get("annotations") or {}).get(keys.ANNOTATION_EPHEMERAL_PROVISIONING)
    ]
    mine.sort(key=lambda p: str(meta(p).get("creationTimestamp") or ""))
    return mine[-1] if mine else None


def pod_state(pod: Obj | None) -> dict[str, Any] | None:
    """gated (at the claims' scheduling gate), pinned (ungated, node affinity to the set's
    node, not scheduled yet) or bound (scheduled on a node)."""
    if pod is None:
        return None
    node = (pod.get("spec") or {}).get("nodeName")
    if vmi_pods.is_gated(pod):
        state = "gated"
    elif node:
        state = "bound"
    elif vmi_pods.pinned_node(pod):
        state = "pinned"
    else:
        state = "waiting for the scheduler"
    return {
        "pod": name_of(pod),
        "state": state,
        "pinnedTo": vmi_pods.pinned_node(pod),
        "node": node,
        "phase": (pod.get("status") or {}).get("phase"),
    }


def _event_time(event: Obj) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("series") or {}).get("lastObservedTime")
        or meta(event).get("creationTimestamp")
        or ""
    )


def events_of(events: Sequence[Obj], names: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """Events about the VM, its VMI and its claims, oldest first."""
    kinds = {"VirtualMachine", keys.VMI.kind, keys.KIND_CLAIM}
    out = []
    for e in events:
        involved = e.get("involvedObject") or e.get("regarding") or {}
        if (
            involved.get("kind") not in kinds
            or (involved["kind"], involved.get("name")) not in names
        ):
            continue
        out.append(
            {
                "time": _event_time(e),
                "type": e.get("type"),
                "reason": e.get("reason"),
                "object": f"{involved['kind']}/{involved.get('name')}",
                "message": e.get("message") or e.get("note"),
                "count": e.get("count") or 1,
            }
        )
    out.sort(key=lambda e: (e["time"], e["object"], str(e["reason"])))
    return out


def _claim_entry(name: str, source: str, claim: Obj | None) -> dict[str, Any]:
    if claim is None:
        return {"name": name, "source": source, "exists": False}
    spec = claim.get("spec") or {}
    status = claim.get("status") or {}
    return {
        "name": name,
        "source": source,
        "exists": True,
        "class": spec.get("class"),
        "count": int(spec.get("count") or 1),
        "phase": phase_of(claim),
        "node": status.get("nodeName"),
        "attachedTo": status.get("attachedTo"),
        "rejectedNodes": [
            {"node": r.get("node"), "until": r.get("until")}
            for r in status.get("rejectedNodes") or []
        ],
        "conditions": [
            c
            for t in (keys.CONDITION_BOUND, keys.CONDITION_PLACED)
            if (c := condition_of(claim, t)) is not None
        ],
    }


def explain(readings: VMReadings) -> Report:
    names = claim_names(readings.vm, readings.vmi, readings.name)
    claims = [_claim_entry(n, s, readings.claims.get(n)) for n, s in names]
    vmi = readings.vmi
    vmi_status = (vmi or {}).get("status") or {}
    nodes = sorted({c["node"] for c in claims if c.get("node")})
    pod = pod_state(launcher_of(readings.pods or (), vmi))
    involved = {("VirtualMachine", readings.name), (keys.VMI.kind, readings.name)}
    involved |= {(keys.KIND_CLAIM, n) for n, _s in names}
    vm_status = (readings.vm or {}).get("status") or {}
    return {
        "namespace": readings.namespace,
        "name": readings.name,
        "vm": None
        if readings.vm is None
        else {"status": vm_status.get("printableStatus"), "ready": vm_status.get("ready")},
        "vmi": None
        if vmi is None
        else {
            "phase": vmi_status.get("phase"),
            "node": vmi_status.get("nodeName"),
            "uid": meta(vmi).get("uid"),
            "usesClaims": keys.uses_claims(meta(vmi).get("labels")),
        },
        "claims": claims,
        "setNodes": nodes,
        "launcher": pod,
        "launcherReadable": readings.pods is not None,
        "events": None if readings.events is None else events_of(readings.events, involved),
    }


def render(report: Report, *, wide: bool = False) -> list[str]:
    ns, name = report["namespace"], report["name"]
    vm, vmi = report["vm"], report["vmi"]
    lines = [f"VM:         {ns}/{name}" + ("" if vm is not None else " (no VirtualMachine)")]
    if vm is not None:
        lines[-1] += f" ({vm['status'] or 'status unknown'})"
    if vmi is None:
        lines.append("VMI:        none (the VM is not running)")
    else:
        where = f" on node {vmi['node']}" if vmi["node"] else ""
        lines.append(f"VMI:        {vmi['phase'] or 'Pending'}{where}")
    lines += _claim_lines(report)
    launcher = report["launcher"]
    if launcher is not None:
        state = launcher["state"]
        if state == "bound":
            state += f" to node {launcher['node']}"
        elif state == "pinned":
            state += f" to node {launcher['pinnedTo']}"
        elif state == "gated":
            state += f" (scheduling gate {keys.SCHEDULING_GATE_CLAIMS})"
        lines.append(f"Launcher:   {launcher['pod']} {state}")
    elif vmi is not None:
        lines.append(
            "Launcher:   none yet"
            if report["launcherReadable"]
            else "Launcher:   pods not readable"
        )
    events = report["events"]
    if events is None:
        lines.append("Events:     not readable")
    elif not events:
        lines.append("Events:     none")
    else:
        shown = events if wide else events[-EVENTS_SHOWN:]
        lines.append("Events:")
        lines += text.table(
            ["TIME", "TYPE", "REASON", "OBJECT", "MESSAGE"],
            [[e["time"], e["type"], e["reason"], e["object"], e["message"]] for e in shown],
            "  ",
        )
    return lines


def _claim_lines(report: Report) -> list[str]:
    """The set's node and its claims: a table, then each claim's conditions worth telling
    (any not True, and Placed) and the nodes it skips."""
    lines: list[str] = []
    nodes = report["setNodes"]
    if not report["claims"]:
        lines.append("Claims:     none (no gpu.cozystack.io/claims annotation naming claims)")
    else:
        set_node = (
            "not bound yet"
            if not nodes
            else nodes[0]
            if len(nodes) == 1
            else f"split over {', '.join(nodes)}"
        )
        lines.append(f"Set node:   {set_node}")
        rows = []
        for c in report["claims"]:
            if not c["exists"]:
                rows.append([c["name"], c["source"], "-", "-", "not found", "-", "-"])
                continue
            rows.append(
                [
                    c["name"],
                    c["source"],
                    c["class"],
                    c["count"],
                    c["phase"],
                    c["node"] or "-",
                    c["attachedTo"] or "-",
                ]
            )
        lines.append("Claims:")
        lines += text.table(
            ["CLAIM", "FROM", "CLASS", "COUNT", "PHASE", "NODE", "ATTACHED TO"], rows, "  "
        )
        for c in report["claims"]:
            for cond in c.get("conditions", []):
                if cond["status"] != "True" or cond["type"] == keys.CONDITION_PLACED:
                    lines.append(
                        f"  {c['name']} {cond['type']}={cond['status']} {cond['reason']}: "
                        f"{cond['message']}"
                    )
            for r in c.get("rejectedNodes", []):
                lines.append(f"  {c['name']} skips node {r['node']} until {r['until']}")
    return lines
