"""The plugin's pure parts: what a tenant's report says from what it could read, the
what-if through the model, the VM's launcher-pod state, and the command line itself."""

from __future__ import annotations

import http.server
import importlib
import io
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest

from cozystack_gpu import keys
from cozystack_gpu.cli import (
    explain_claim,
    explain_reservation,
    explain_vm,
    list_claims,
    list_reservations,
    main,
    text,
    whatif,
)
from cozystack_gpu.config import parse
from cozystack_gpu.keys import Mode, Phase
from cozystack_gpu.model import ClaimInfo, ClaimKey, ClassInfo, Device, NodeInfo, Snapshot
from cozystack_gpu.objects import translate
from cozystack_gpu.objects.translate import rfc3339

CONFIG = parse([])


def _claim(
    ns: str,
    name: str,
    cls: str,
    count: int,
    phase: str = "Pending",
    created: str = "2026-01-01T00:00:00Z",
    **status: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name, "creationTimestamp": created},
        "spec": {"class": cls, "count": count},
        "status": {"phase": phase, **status},
    }  # fmt: skip


def _class(name: str, free: int, per_node: int, mode: str = "passthrough") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"mode": mode},
        "status": {"free": free, "maxFreePerNode": per_node},
    }


WAITING = {
    "type": "Bound",
    "status": "False",
    "reason": "InsufficientCapacity",
    "message": "no node serving class h100 has 3 free units; the largest has 2",
}


def test_a_tenants_queue_counts_only_the_orders_it_listed() -> None:
    big = _claim("a", "big", "h100", 3, created="2026-01-01T00:00:05Z", conditions=[WAITING])
    readings = explain_claim.ClaimReadings(
        claim=big,
        classes=[_class("h100", 2, 2)],
        namespace=None,
        quotas={"a": []},
        claims=[big, _claim("a", "old", "h100", 1), _claim("a", "other", "t4", 1)],
        claims_namespace="a",
    )
    report = explain_claim.explain(readings, CONFIG, 0.0)
    assert report["queue"] == {"position": 2, "waiting": 2, "namespace": "a", "ahead": [
        {"claim": "a/old", "count": 1}]}  # fmt: skip
    # A tenant's text names no claim ahead (they could be another tenant's, were they listed).
    assert not any("ahead" in line for line in explain_claim.render(report))


def test_used_is_a_lower_bound_unless_the_model_counted_it() -> None:
    quota = {"spec": {"hard": {keys.quota_key("h100"): "4"}}}
    big = _claim("a", "big", "h100", 3, conditions=[WAITING])
    readings = explain_claim.ClaimReadings(
        claim=big,
        classes=[_class("h100", 2, 2)],
        namespace={"metadata": {"name": "a", "labels": {"tenant.cozystack.io/root": ""}}},
        quotas={"a": [quota], "root": None},
        claims=[big, _claim("a", "held", "h100", 1, phase="Bound")],
        claims_namespace="a",
    )
    levels = explain_claim.explain(readings, CONFIG, 0.0)["budget"]["levels"]
    assert levels[0]["keys"][0] == {
        "key": keys.quota_key("h100"), "used": 1, "usedExact": False, "limit": 4}  # fmt: skip
    assert levels[1] == {"tenant": "root", "self": False, "readable": False, "keys": []}


T4 = "another class with room: t4 (passthrough, 5 free, 4 on one node)"
WAIT = "wait: orders of the class bind oldest first as units are released"
ASK = "ask for a budget: the message above says which key and who can raise it"
FLAGS = (
    "-n NAMESPACE, --namespace NAMESPACE",
    "-A, --all-namespaces",
    "--as USER",
    "--context CONTEXT",
    "--kubeconfig KUBECONFIG",
    "-o {wide,yaml,json}",
)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("InsufficientCapacity", ["a smaller count: 2 units fit on one node now", T4, WAIT]),
        ("BudgetExceeded", ["a smaller count: at most 1 fits the budgets you can read", ASK, T4]),
        ("VMIStillRunning", ["wait: the claim rebinds once its VMI is final or gone"]),
    ],
)  # fmt: skip
def test_what_to_change_follows_the_binders_reason(reason: str, expected: list[str]) -> None:
    classes = [
        explain_claim.class_summary(c)
        for c in (_class("h100", 2, 2), _class("t4", 5, 4), _class("l40s", 9, 9, "vgpu"))
    ]
    levels = [{"keys": [{"limit": 4, "used": 3}]}]
    got = explain_claim.suggestions(reason, 3, classes[0], classes, levels, entitled=False)
    assert got == expected  # the vGPU class is left out: the namespace is not entitled


def test_a_template_claim_is_judged_by_its_placed_condition() -> None:
    # The binder judges a template claim with its VM's set: the reason is on Placed, and
    # no Bound condition is written while it waits.
    placed = {
        "type": keys.CONDITION_PLACED,
        "status": "False",
        "reason": "BudgetExceeded",
        "message": "the VM's GPU set cannot start anywhere yet: budget ...",
    }
    claim = _claim("a", "vm-gpu", "h100", 1, conditions=[placed])
    claim["metadata"]["labels"] = {keys.LABEL_TEMPLATE_CLAIM: keys.LABEL_TEMPLATE_CLAIM_VALUE}
    quota = {"spec": {"hard": {keys.quota_key("h100"): "2"}}}
    held = _claim("a", "held", "h100", 2, phase="Bound")
    readings = explain_claim.ClaimReadings(
        claim=claim,
        classes=[_class("h100", 2, 2)],
        namespace=None,
        quotas={"a": [quota]},
        claims=[claim, held],
        claims_namespace="a",
    )
    assert explain_claim.explain(readings, CONFIG, 0.0)["toFit"] == [ASK]
    # Not yet judged (no Placed either): it says so.
    claim["status"]["conditions"] = []
    assert explain_claim.explain(readings, CONFIG, 0.0)["toFit"] == [
        "wait: the binder has not judged this order yet"
    ]


def _snapshot() -> Snapshot:
    res = "nvidia.com/H100"
    nodes = [
        NodeInfo(name, allocatable={res: 2}, devices=(Device(res, 2),)) for name in ("n0", "n1")
    ]
    return Snapshot.build(
        nodes=nodes,
        classes=[ClassInfo("h100", Mode.PASSTHROUGH, res, max_count=4)],
        claims=[
            ClaimInfo("b", "hold", "h100", 1, phase=Phase.BOUND, node="n0"),
            ClaimInfo("a", "hold", "h100", 1, phase=Phase.BOUND, node="n1"),
            ClaimInfo("a", "two", "h100", 2, created=5.0),
        ],
    )


def test_the_what_if_finds_the_moves_that_make_room_as_the_binder_would() -> None:
    snap = _snapshot()
    answer = whatif.what_if(snap, ClaimKey("a", "two"), 10.0)
    assert answer is not None and answer.verdict == "refused"
    assert answer.room_node is not None
    assert [m[0] for m in answer.moves] in (["b/hold"], ["a/hold"])
    assert answer.smaller == (1, "n0") or answer.smaller == (1, "n1")
    rows = whatif.node_rows(snap, snap.claim(ClaimKey("a", "two")), 10.0)  # type: ignore[arg-type]
    assert [(r.node, r.free, r.short) for r in rows] == [("n0", 1, 1), ("n1", 1, 1)]


def _pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "virt-launcher-vm"}, "spec": spec, "status": {}}


def test_a_launcher_pod_reads_gated_then_pinned_then_bound() -> None:
    gate = [{"name": keys.SCHEDULING_GATE_CLAIMS}]
    pin = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n0"]}]}]}}}  # fmt: skip
    states = [
        explain_vm.pod_state(_pod(schedulingGates=gate)),
        explain_vm.pod_state(_pod(affinity=pin)),
        explain_vm.pod_state(_pod(affinity=pin, nodeName="n0")),
    ]
    assert [s["state"] for s in states if s] == ["gated", "pinned", "bound"]


def test_a_vms_set_is_its_held_claims_then_its_template_claims() -> None:
    note = '{"claims": ["a"], "claimTemplates": [{"name": "gpu", "class": "h100", "count": 1}]}'
    vm = {"spec": {"template": {"metadata": {"annotations": {keys.ANNOTATION_CLAIMS: note}}}}}
    assert explain_vm.claim_names(vm, None, "vm") == [("a", "held"), ("vm-gpu", "template")]


def test_rejected_nodes_are_printed_with_their_expiry() -> None:
    claim = _claim("a", "c", "h100", 1, phase="Bound", nodeName="n0",
                   rejectedNodes=[{"node": "n1", "until": "2026-01-01T00:10:00Z"}])  # fmt: skip
    vmi = {"metadata": {"name": "vm", "annotations": {keys.ANNOTATION_CLAIMS: '{"claims": ["c"]}'}}}
    report = explain_vm.explain(explain_vm.VMReadings("a", "vm", None, vmi, {"c": claim}, [], []))
    assert "  c skips node n1 until 2026-01-01T00:10:00Z" in explain_vm.render(report)


def test_ages_read_like_kubectls() -> None:
    ages = [text.age(s) for s in (5, 150, 700, 4000, 200_000)]
    assert ages == ["5s", "2m30s", "11m", "66m", "2d"]


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["explain", "--help"], ["explain", "claim", "--help"], ["explain", "vm", "--help"],
     ["top", "--help"], ["top", "nodes", "--help"], ["top", "classes", "--help"],
     ["explain", "reservation", "--help"], ["list", "reservations", "--help"]],
)  # fmt: skip
def test_every_verb_has_help_and_exits_0(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(argv, io.StringIO()) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("usage: kubectl gpu")
    for flag in FLAGS:
        assert flag in printed


@pytest.mark.parametrize(
    "argv",
    [[], ["explain"], ["explain", "claim"], ["top", "pods"], ["top", "nodes", "-o", "x"],
     ["explain", "reservation"], ["list", "reservations", "--phase", "Bound"]],
)  # fmt: skip
def test_a_usage_error_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(argv, io.StringIO()) == 2
    assert "usage: kubectl gpu" in capsys.readouterr().err


def test_a_bad_kubeconfig_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "none")
    assert main.main(["top", "nodes", "--kubeconfig", missing], io.StringIO()) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: kubeconfig: ")


@pytest.mark.parametrize(
    ("flags", "groups"),
    [
        (["--as-group", "a", "--as-group", "b"], ["a", "b"]),
        (["--as-group", "a,b"], ["a,b"]),
    ],
)
def test_each_as_group_is_one_impersonate_group_header_as_kubectl_sends(
    tmp_path: Path, flags: list[str], groups: list[str]
) -> None:
    """kubectl's --as-group is a repeatable string array: one Impersonate-Group header per
    flag, a comma part of the name (the API server reads each header value as one group)."""
    seen: list[list[str]] = []

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get_all("Impersonate-Group") or [])
            body = b'{"kind": "Status", "code": 404, "message": "not here"}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        config = tmp_path / "kubeconfig"
        config.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{server.server_port}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: c, context: {cluster: c, user: u, namespace: t}}]\n"
        )
        argv = ["explain", "claim", "x", "--kubeconfig", str(config), "--as", "bob", *flags]
        assert main.main(argv, io.StringIO()) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert seen and all(sent == groups for sent in seen), seen


def test_the_console_script_kubectl_gpu_resolves_to_main() -> None:
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    module, _colon, attr = project["project"]["scripts"]["kubectl-gpu"].partition(":")
    assert getattr(importlib.import_module(module), attr) is main.console


@pytest.mark.parametrize(
    ("t4_quota", "vgpu_count", "suggested"),
    [
        ("10", 1, {"t4", "l40s"}),  # room under every key: both are offered
        ("3", 1, {"l40s"}),  # the tenant's own t4 claims use its t4 budget up
        ("10", 2, {"t4"}),  # a vGPU class takes one unit per VM (maxCount unset)
    ],
)  # fmt: skip
def test_another_class_is_offered_only_when_an_order_of_it_would_pass_the_order_checks(
    t4_quota: str, vgpu_count: int, suggested: set[str]
) -> None:
    """A hint the tenant follows must not meet a second refusal: another class is offered
    only when the order passes its budget keys, its maxCount, the entitlement and capacity
    (as far as the tenant can read them)."""
    waiting = {**WAITING, "message": "no node serving class h100 has the units"}
    claim = _claim("a", "c", "h100", vgpu_count, conditions=[waiting])
    used = _claim("a", "t4-held", "t4", 3, phase="Bound")
    quota = {"spec": {"hard": {keys.quota_key("t4"): t4_quota, keys.QUOTA_KEY_TOTAL: "20"}}}
    namespace = {
        "metadata": {"name": "a", "labels": {keys.LABEL_VGPU_ENTITLEMENT: "true"}},
    }
    readings = explain_claim.ClaimReadings(
        claim=claim,
        classes=[_class("h100", 0, 0), _class("t4", 5, 4), _class("l40s", 9, 9, "vgpu")],
        namespace=namespace,
        quotas={"a": [quota]},
        claims=[claim, used],
        claims_namespace="a",
    )
    hints = explain_claim.explain(readings, CONFIG, 0.0)["toFit"]
    offered = {h.split(": ", 1)[1].split(" ")[0] for h in hints if h.startswith("another class")}
    assert offered == suggested, hints


def test_list_claims_keeps_what_every_filter_allows_and_says_why_a_claim_waits() -> None:
    ns = {
        "root": {},
        "acme": {"tenant.cozystack.io/root": "", "tenant.cozystack.io/acme": ""},
        "research": {
            "tenant.cozystack.io/root": "",
            "tenant.cozystack.io/acme": "",
            "tenant.cozystack.io/research": "",
        },
        "other": {"tenant.cozystack.io/other": ""},
    }
    namespaces = [{"metadata": {"name": n, "labels": labels}} for n, labels in ns.items()]
    claims = [
        _claim("acme", "a", "h100", 2, phase="Bound", nodeName="n1"),
        _claim("research", "r", "h100", 1, conditions=[WAITING]),
        _claim("research", "l", "l40s", 1, phase="Attached", nodeName="n2", attachedTo="vm"),
        _claim("other", "o", "h100", 1, phase="Bound", nodeName="n1"),
    ]
    subtree = list_claims.subtree("acme", namespaces)
    assert subtree == {"acme", "research"}

    def names(filters: list_claims.Filters, tenants: frozenset[str] | None = None) -> list[str]:
        return [
            f"{r['namespace']}/{r['name']}" for r in list_claims.rows(claims, filters, 0, tenants)
        ]

    assert names(list_claims.Filters()) == ["acme/a", "other/o", "research/l", "research/r"]
    assert names(list_claims.Filters(gpu_class="h100", phase="Bound")) == ["acme/a", "other/o"]
    assert names(list_claims.Filters(node="n1"), subtree) == ["acme/a"]
    assert names(list_claims.Filters(phase="Pending")) == ["research/r"]
    (waiting,) = list_claims.rows(claims, list_claims.Filters(phase="Pending"), 0, None)
    assert waiting["why"] == "InsufficientCapacity"
    lines = list_claims.render({"items": [waiting]}, wide=True)
    assert lines[0].split() == [
        "NAMESPACE", "NAME", "CLASS", "COUNT", "PHASE", "NODE", "ATTACHED", "TEMPLATE", "WHY", "AGE"
    ]  # fmt: skip
    assert lines[1].split()[:9] == [
        "research", "r", "h100", "1", "Pending", "-", "-", "-", "InsufficientCapacity"
    ]  # fmt: skip
    assert list_claims.Filters(node="n1").field_selector() == "status.nodeName=n1"
    assert list_claims.render({"items": [], "scope": " in namespace x"}) == [
        "No GPU claims found in namespace x."
    ]


@pytest.mark.parametrize(
    ("verb", "kinds"),
    [
        ("list", "{claims,reservations}"),
        ("top", "{nodes,classes}"),
        ("explain", "{claim,vm,reservation}"),
    ],
)
def test_a_verb_without_a_kind_names_the_kinds_it_takes(
    verb: str, kinds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A newcomer's first try ("kubectl gpu list") was told only that KIND is required.
    assert main.main([verb]) == 2
    assert f"the following arguments are required: {kinds}" in capsys.readouterr().err


# --- reservations ------------------------------------------------------------------------

NOW = 1_800_000_000 - 1_800_000_000 % 60  # a whole minute: windows are whole minutes
HOUR = 3600


def _reservation(
    ns: str, name: str, count: int, start: float, end: float, cls: str = "h100", **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}",
                     "creationTimestamp": rfc3339(NOW - 600)},
        "spec": {"class": cls, "count": count, "start": rfc3339(start), "end": rfc3339(end)},
        "status": status,
    }  # fmt: skip


REFUSED = {
    "type": "Booked",
    "status": "False",
    "reason": "InsufficientCapacity",
    "message": "no node serving class h100 has 2 units free from ... to ...",
}


def test_list_reservations_prints_the_crds_columns_and_filters_as_list_claims_does() -> None:
    start, end = NOW + 2 * HOUR, NOW + 10 * HOUR
    reservations = [
        _reservation(
            "b", "train", 2, start, end, phase="Booked", nodeName="n1", bookedAt=rfc3339(NOW - 300)
        ),
        _reservation("a", "late", 1, end, end + HOUR, conditions=[REFUSED]),
        _reservation("a", "early", 1, start, end, cls="t4", phase="Active", nodeName="n2"),
    ]

    def names(filters: list_claims.Filters) -> list[str]:
        rows = list_reservations.rows(reservations, filters, NOW, None)
        return [f"{r['namespace']}/{r['name']}" for r in rows]

    # By namespace, then start: a tenant's windows read in time order.
    assert names(list_claims.Filters()) == ["a/early", "a/late", "b/train"]
    assert names(list_claims.Filters(gpu_class="h100", phase="Pending")) == ["a/late"]
    assert names(list_claims.Filters(node="n1")) == ["b/train"]
    rows = list_reservations.rows(reservations, list_claims.Filters(), NOW, frozenset({"b"}))
    lines = list_reservations.render({"items": rows})
    assert [ln.split() for ln in lines] == [
        ["NAMESPACE", "NAME", "CLASS", "COUNT", "START", "END", "PHASE", "NODE", "AGE"],
        ["b", "train", "h100", "2", rfc3339(start), rfc3339(end), "Booked", "n1", "10m"],
    ]
    rows = list_reservations.rows(reservations, list_claims.Filters(phase="Pending"), NOW, None)
    wide = list_reservations.render({"items": rows}, wide=True)
    assert [ln.split() for ln in wide] == [
        ["NAMESPACE", "NAME", "CLASS", "COUNT", "START", "END", "PHASE", "NODE", "LENGTH",
         "BOOKED", "WHY", "AGE"],
        ["a", "late", "h100", "1", rfc3339(end), rfc3339(end + HOUR), "Pending", "-", "1h", "-",
         "InsufficientCapacity", "10m"],
    ]  # fmt: skip
    assert list_reservations.render({"items": [], "scope": " in namespace x"}) == [
        "No GPU reservations found in namespace x."
    ]


def test_explain_reservation_says_its_window_phase_node_and_conditions_in_words() -> None:
    booked = {"type": "Booked", "status": "True", "reason": "Booked",
              "message": "2 units of class h100 on node n1", "lastTransitionTime": "T"}  # fmt: skip
    obj = _reservation("a", "train", 2, NOW + 90 * 60, NOW + 9 * HOUR + 90 * 60,
                       phase="Booked", nodeName="n1", bookedAt=rfc3339(NOW - 300),
                       conditions=[booked])  # fmt: skip
    readings = explain_reservation.ReservationReadings(
        reservation=obj, classes=[_class("h100", 2, 2)]
    )
    report = explain_reservation.explain(readings, CONFIG, NOW)
    assert "booking" not in report  # booked: nothing for the model to judge
    assert explain_reservation.render(report) == [
        "Reservation: a/train (class h100, 2 units)",
        f"Window:      {rfc3339(NOW + 5400)} to {rfc3339(NOW + 37800)} (9h; starts in 1h30m)",
        f"Phase:       Booked (on node n1, booked at {rfc3339(NOW - 300)})",
        "Class:       h100 (passthrough): 2 free, 2 on one node",
        "Conditions:",
        "  Booked: yes (Booked): 2 units of class h100 on node n1",
    ]
    assert explain_reservation.render(report, wide=True)[-1].endswith(", since T")
    # While the window lasts, and after it.
    open_now = explain_reservation.explain(readings, CONFIG, NOW + 2 * HOUR)
    assert explain_reservation.render(open_now)[1].endswith("; open, ends in 8h30m)")
    ended = explain_reservation.explain(readings, CONFIG, NOW + 12 * HOUR)
    assert explain_reservation.render(ended)[1].endswith("; ended 1h30m ago)")


def test_explain_reservation_says_why_a_pending_one_waits_from_its_conditions() -> None:
    obj = _reservation("a", "train", 2, NOW + HOUR, NOW + 2 * HOUR, conditions=[REFUSED])
    readings = explain_reservation.ReservationReadings(reservation=obj, classes=[])
    lines = explain_reservation.render(explain_reservation.explain(readings, CONFIG, NOW))
    assert lines[2:] == [
        "Phase:       Pending",
        "Class:       h100 does not exist",
        "Conditions:",
        "  Booked: no (InsufficientCapacity)",  # its message is the Waiting line's
        f"Waiting:     InsufficientCapacity: {REFUSED['message']}",
    ]
    obj["status"] = {}
    lines = explain_reservation.render(explain_reservation.explain(readings, CONFIG, NOW))
    assert lines[-1] == "Waiting:     to be judged: no condition says why yet"


def test_explain_reservation_for_a_tenant_has_no_model_judgement_and_no_other_node() -> None:
    """A tenant cannot list the nodes and the other reservations the model judges with: its
    report says what its own object says, and names no node its object does not."""
    obj = _reservation("a", "train", 1, NOW + HOUR, NOW + 2 * HOUR)
    readings = explain_reservation.ReservationReadings(
        reservation=obj, classes=[_class("h100", 2, 2)], cluster=None, reservations=None
    )
    report = explain_reservation.explain(readings, CONFIG, NOW)
    assert "booking" not in report
    assert report["reservation"]["node"] is None
    assert not any("node n" in line for line in explain_reservation.render(report))


def test_the_models_booking_judgement_names_the_node_or_the_earliest_window_that_fits() -> None:
    snap = _snapshot()  # n0 and n1: one h100 unit free each, held from now on
    others = [
        _reservation("b", f"b{i}", 1, NOW + HOUR, NOW + 3 * HOUR, phase="Booked", nodeName=node)
        for i, node in enumerate(("n0", "n1"))
    ]

    def judged(obj: dict[str, Any]) -> dict[str, Any]:
        info = translate.reservation_info(obj)
        assert info is not None
        # Its own object among those listed is left out (a Lost one would count twice).
        return explain_reservation.judge(info, snap, [*others, obj], NOW)

    after = _reservation("a", "after", 1, NOW + 3 * HOUR, NOW + 4 * HOUR)
    assert judged(after) == {"verdict": "fits", "node": "n0", "reason": None,
                             "message": None, "earliest": rfc3339(NOW + 3 * HOUR)}  # fmt: skip
    overlapping = _reservation("a", "overlap", 1, NOW + 2 * HOUR, NOW + 4 * HOUR)
    answer = judged(overlapping)
    assert (answer["verdict"], answer["reason"]) == ("refused", "InsufficientCapacity")
    assert answer["earliest"] == rfc3339(NOW + 3 * HOUR)
    readings = explain_reservation.ReservationReadings(overlapping, [])
    window = explain_reservation.explain(readings, CONFIG, NOW)["reservation"]
    assert explain_reservation.render_booking(answer, window)[-1] == (
        f"  earliest window of 2h that fits: {rfc3339(NOW + 3 * HOUR)} to {rfc3339(NOW + 5 * HOUR)}"
    )
    # A window asked too late: the earliest of its length from now on.
    past = _reservation("a", "past", 1, NOW - HOUR, NOW + HOUR)
    answer = judged(past)
    assert (answer["reason"], answer["earliest"]) == ("WindowInPast", rfc3339(NOW + 3 * HOUR))
