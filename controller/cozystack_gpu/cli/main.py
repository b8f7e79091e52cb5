"""``kubectl gpu``: argument parsing, reads through ``kube.Session``, and printing.

Exit status as kubectl's: 0 done, 1 an error (one line on stderr naming what is wrong),
2 a usage error (argparse's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import yaml

from cozystack_gpu import config as settings
from cozystack_gpu import keys
from cozystack_gpu.cli import (
    explain_claim,
    explain_reservation,
    explain_vm,
    list_claims,
    list_reservations,
    top,
)
from cozystack_gpu.cli.kube import EVENT, CliError, Session

OUTPUTS = ("wide", "yaml", "json")


def _common() -> argparse.ArgumentParser:
    """kubectl's flags, accepted before and after the verb (hence no defaults here)."""
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("-n", "--namespace", help="the namespace (default: the context's)")
    common.add_argument(
        "-A", "--all-namespaces", action="store_true", help="look the name up in every namespace"
    )
    common.add_argument("-o", "--output", choices=OUTPUTS, help="wide, yaml or json")
    common.add_argument("--as", dest="as_user", metavar="USER", help="impersonate this user")
    common.add_argument(
        "--as-group",
        dest="as_groups",
        action="append",
        metavar="GROUP",
        help="impersonate this group; repeat for more (as kubectl: a comma is part of the name)",
    )
    common.add_argument("--context", help="the kubeconfig context to use")
    common.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG)")
    return common


def parser() -> argparse.ArgumentParser:
    common = _common()
    top_parser = argparse.ArgumentParser(
        prog="kubectl gpu",
        parents=[common],
        description="Explain GPU claims and VMs, and show GPU usage (cozystack.gpu).",
    )
    verbs = top_parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    explain = verbs.add_parser(
        "explain",
        parents=[common],
        help="why a claim, a VM's GPUs or a reservation stand where they do",
    )
    what = explain.add_subparsers(dest="what", metavar="{claim,vm,reservation}", required=True)
    claim = what.add_parser(
        "claim",
        parents=[common],
        help="a claim's phase, why, and what would make it fit",
        description="A claim's phase and the binder's reason, its budget chain, its class's "
        "free units, its place among waiting orders, and what to change. A hoster (who "
        "can list everything) also sees the nodes and the model's what-if.",
    )
    claim.add_argument("name", metavar="NAME", help="the GPUClaim")
    vm = what.add_parser(
        "vm",
        parents=[common],
        help="a VM's claims, node, launcher pod and events",
        description="A VM's set: its claims and their phases, the node, whether the "
        "launcher pod is gated, pinned or bound, the nodes its claims skip, and the last "
        "events.",
    )
    vm.add_argument("name", metavar="NAME", help="the VirtualMachine (or VMI)")
    reservation = what.add_parser(
        "reservation",
        parents=[common],
        help="a reservation's window, phase, node and why it waits",
        description="A GPUReservation's class, count, window (RFC 3339, its length), phase, "
        "node and bookedAt, its conditions, and why a Pending one waits. A hoster (who can "
        "list everything, reservations included) also gets the booking model's judgement of "
        "one not yet booked: the node it would be booked on, or why not and the earliest "
        "window of its length that fits.",
    )
    reservation.add_argument("name", metavar="NAME", help="the GPUReservation")
    _add_list(verbs, common)
    top_verb = verbs.add_parser("top", parents=[common], help="GPU units per node or class")
    show = top_verb.add_subparsers(dest="what", metavar="{nodes,classes}", required=True)
    show.add_parser(
        "nodes",
        parents=[common],
        help="units per node and class (hosters)",
        description="Per node and class: units allocatable, held, attached, lost, free, "
        "raw use, with the node's Ready reason, layout state and inventory age.",
    )
    show.add_parser(
        "classes",
        parents=[common],
        help="units per class (hosters)",
        description="Per class: serving nodes, units allocatable, held, attached, lost, "
        "free, the most free on one node, units waiting, raw use, and the most units "
        "reservations book at any moment of the next 24 hours (unknown, with a note, to a "
        "user who may not list every GPUReservation).",
    )
    return top_parser


def _add_list(
    verbs: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """``list claims`` and ``list reservations``: the same filters, each kind's phases."""
    list_verb = verbs.add_parser(
        "list", parents=[common], help="GPU claims or reservations, filtered"
    )
    listed = list_verb.add_subparsers(dest="what", metavar="{claims,reservations}", required=True)
    claims = listed.add_parser(
        "claims",
        parents=[common],
        help="claims by class, phase, tenant or node, and why a waiting one waits",
        description="The claims you can list (in the namespace, or every namespace with "
        "-A), one line each: class, count, phase, node and the reason a waiting claim "
        "gives. Filters combine.",
    )
    claims.add_argument("--class", dest="gpu_class", metavar="CLASS", help="only this class")
    claims.add_argument("--phase", choices=list_claims.PHASES, help="only claims in this phase")
    claims.add_argument(
        "--tenant",
        metavar="NAMESPACE",
        help="only the claims of this tenant's namespace and the tenants below it (needs to "
        "list namespaces)",
    )
    claims.add_argument("--node", metavar="NODE", help="only claims held on this node")
    reservations = listed.add_parser(
        "reservations",
        parents=[common],
        help="reservations by class, phase, tenant or node, with their windows",
        description="The reservations you can list (in the namespace, or every namespace "
        "with -A), one line each: class, count, start, end, phase, node and age, as kubectl "
        "get prints them; -o wide adds the window's length, bookedAt and why a waiting one "
        "waits. Filters combine.",
    )
    reservations.add_argument("--class", dest="gpu_class", metavar="CLASS", help="only this class")
    reservations.add_argument(
        "--phase", choices=list_reservations.PHASES, help="only reservations in this phase"
    )
    reservations.add_argument(
        "--tenant",
        metavar="NAMESPACE",
        help="only the reservations of this tenant's namespace and the tenants below it "
        "(needs to list namespaces)",
    )
    reservations.add_argument(
        "--node", metavar="NODE", help="only reservations booked on this node"
    )


def _opt(args: argparse.Namespace, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


def _find_namespace(session: Session, kind: keys.ApiKind, name: str) -> str:
    """-A: the one namespace where an object of that name exists."""
    found = session.list_of(kind, field_selector=f"metadata.name={name}")
    if found is None:
        raise CliError(f"-A: you may not list {kind.plural} in every namespace; name one with -n")
    spaces = sorted({str(o["metadata"].get("namespace")) for o in found})
    if not spaces:
        raise CliError(f'{kind.plural}.{kind.group} "{name}" not found in any namespace')
    if len(spaces) > 1:
        raise CliError(f"{name} exists in namespaces {', '.join(spaces)}: name one with -n")
    return spaces[0]


def _claim(session: Session, args: argparse.Namespace, now: float) -> Any:
    ns = _namespace(session, args, keys.GPU_CLAIM)
    claim = session.get_required(keys.GPU_CLAIM, args.name, ns)
    cluster = session.listing()
    if cluster is not None:
        namespace = next(
            (n for n in cluster[keys.NAMESPACE.kind] if n["metadata"]["name"] == ns), None
        )
        claims, scope = cluster[keys.GPU_CLAIM.kind], None
    else:
        namespace = session.get(keys.NAMESPACE, ns)
        every = session.list_of(keys.GPU_CLAIM)
        claims, scope = (
            (every, None)
            if every is not None
            else (
                session.list_of(keys.GPU_CLAIM, ns) or [],
                ns,
            )
        )
    chain = explain_claim.chain_of(ns, namespace)
    readings = explain_claim.ClaimReadings(
        claim=claim,
        classes=session.list_of(keys.GPU_CLASS) or [],
        namespace=namespace,
        quotas={t: session.list_of(keys.RESOURCE_QUOTA, t) for t in chain},
        claims=claims,
        claims_namespace=scope,
        cluster=cluster,
    )
    report = explain_claim.explain(readings, settings.parse([]), now)
    return report, explain_claim.render


def _vm(session: Session, args: argparse.Namespace, now: float) -> Any:
    ns = _namespace(session, args, keys.VM)
    vm = session.get(keys.VM, args.name, ns)
    vmi = session.get(keys.VMI, args.name, ns)
    if vm is None and vmi is None:
        # Not found, or not readable: say which, as the API server does.
        session.get_required(keys.VM, args.name, ns)
    names = explain_vm.claim_names(vm, vmi, args.name)
    readings = explain_vm.VMReadings(
        namespace=ns,
        name=args.name,
        vm=vm,
        vmi=vmi,
        claims={n: session.get(keys.GPU_CLAIM, n, ns) for n, _s in names},
        pods=session.list_of(keys.POD, ns),
        events=session.list_of(EVENT, ns),
    )
    del now
    return explain_vm.explain(readings), explain_vm.render


def _list(session: Session, args: argparse.Namespace, now: float) -> Any:
    filters = list_claims.Filters(
        gpu_class=_opt(args, "gpu_class"),
        phase=_opt(args, "phase"),
        tenant=_opt(args, "tenant"),
        node=_opt(args, "node"),
    )
    tenants = None
    if filters.tenant is not None:
        namespaces = session.list_of(keys.NAMESPACE)
        if namespaces is None:
            raise CliError(
                "--tenant needs to list namespaces (their tenant labels say which are below "
                "it); this user may not: use -n with each namespace instead"
            )
        tenants = list_claims.subtree(filters.tenant, namespaces)
    every = _opt(args, "all_namespaces", False) or filters.tenant is not None
    namespace = None if every else str(_opt(args, "namespace") or session.default_namespace)
    kind, listed = (
        (keys.GPU_RESERVATION, list_reservations)
        if args.what == "reservations"
        else (keys.GPU_CLAIM, list_claims)
    )
    objects = session.list_of(kind, namespace, field_selector=filters.field_selector())
    if objects is None:
        where = "in every namespace" if namespace is None else f"in namespace {namespace}"
        raise CliError(f"this user may not list {kind.plural} {where}")
    scope = "" if namespace is None else f" in namespace {namespace}"
    report = {"items": listed.rows(objects, filters, now, tenants), "scope": scope}
    return report, listed.render


def _reservation(session: Session, args: argparse.Namespace, now: float) -> Any:
    ns = _namespace(session, args, keys.GPU_RESERVATION)
    reservation = session.get_required(keys.GPU_RESERVATION, args.name, ns)
    cluster = session.listing()
    readings = explain_reservation.ReservationReadings(
        reservation=reservation,
        classes=session.list_of(keys.GPU_CLASS) or [],
        cluster=cluster,
        # Only a hoster's judgement reads them: other windows hold units too.
        reservations=session.list_of(keys.GPU_RESERVATION) if cluster is not None else None,
    )
    report = explain_reservation.explain(readings, settings.parse([]), now)
    return report, explain_reservation.render


def _top(session: Session, args: argparse.Namespace, now: float) -> Any:
    # Reservations only add the classes' booked units (and what free leaves for them): a
    # user who may list the rest but not them still gets the tables, the rows saying so.
    listing = session.listing(optional=(keys.GPU_RESERVATION,))
    if listing is None:
        raise CliError(
            "top needs to list nodes, GPU nodes, classes, claims, namespaces, quotas, pods and "
            "VMs in every namespace (a hoster's rights); this user may not"
        )
    config = settings.parse([])
    if args.what == "nodes":
        return {"items": top.node_rows(listing, config, now)}, _items(top.render_nodes)
    known = keys.GPU_RESERVATION.kind in listing
    report = {
        "items": top.class_rows(listing, config, now, reservations_known=known),
        "notes": top.class_notes(reservations_known=known),
    }
    return report, top.render_class_report


def _items(render: Callable[..., list[str]]) -> Callable[..., list[str]]:
    def wrapped(report: dict[str, Any], *, wide: bool = False) -> list[str]:
        return render(report["items"], wide=wide)

    return wrapped


def _namespace(session: Session, args: argparse.Namespace, kind: keys.ApiKind) -> str:
    if _opt(args, "all_namespaces", False):
        return _find_namespace(session, kind, args.name)
    return str(_opt(args, "namespace") or session.default_namespace)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) and usage errors (2)
        return int(exc.code or 0)
    try:
        session = Session(
            _opt(args, "kubeconfig"),
            _opt(args, "context"),
            _opt(args, "as_user"),
            _opt(args, "as_groups", []) or [],
        )
        run = _claim if args.verb == "explain" and args.what == "claim" else _vm
        if args.verb == "explain" and args.what == "reservation":
            run = _reservation
        elif args.verb == "top":
            run = _top
        elif args.verb == "list":
            run = _list
        report, render = run(session, args, time.time())
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    output = _opt(args, "output")
    if output == "json":
        out.write(json.dumps(report, indent=2) + "\n")
    elif output == "yaml":
        out.write(yaml.safe_dump(report, sort_keys=False))
    else:
        for line in render(report, wide=output == "wide"):
            out.write(line + "\n")
    return 0


def console() -> None:
    """The ``kubectl-gpu`` console script."""
    sys.exit(main())
