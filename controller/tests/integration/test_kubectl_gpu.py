"""``kubectl gpu`` against the real API server, as a tenant (impersonated, so the API
server judges its rights) and as a hoster (the admin identity), with a binder running:
every line printed is checked.

The tenant's user reads what a tenant's roles give it: in its namespace claims, quotas,
pods, Events and KubeVirt objects, and it books reservations there; GPUClass cluster-wide.
It cannot read Namespaces, nodes, GPUNodes, or anything of another tenant.
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from binder_env import Env, condition
from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.cli import main as cli
from cozystack_gpu.objects import translate
from cozystack_gpu_testkit import tenants
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, unless, wait_for

pytestmark = pytest.mark.apiserver

READ = ["get", "list", "watch"]


def _grant_tenant(kube: Kube, namespace: str, user: str) -> None:
    rbac = client.RbacAuthorizationV1Api(kube.api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "tenant"},
            "rules": [
                {"apiGroups": [keys.GROUP], "resources": ["gpuclaims"], "verbs": READ},
                {"apiGroups": [keys.GROUP], "resources": ["gpureservations"],
                 "verbs": [*READ, "create"]},
                {"apiGroups": [""], "resources": ["events", "pods", "resourcequotas"],
                 "verbs": READ},
                {"apiGroups": [keys.KUBEVIRT_GROUP], "resources": ["*"], "verbs": READ},
            ],
        },
    )  # fmt: skip
    subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
    ref = {"apiGroup": "rbac.authorization.k8s.io"}
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "tenant"},
            "roleRef": {**ref, "kind": "Role", "name": "tenant"},
            "subjects": [subject],
        },
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": f"catalog-{user}"},
            "roleRef": {**ref, "kind": "ClusterRole", "name": f"catalog-{user}"},
            "subjects": [subject],
        }
    )
    rbac.create_cluster_role(
        {
            "metadata": {"name": f"catalog-{user}"},
            "rules": [{"apiGroups": [keys.GROUP], "resources": ["gpuclasses"], "verbs": READ}],
        }
    )
    tenants.wait_granted(kube.api, user, "get", "gpuclaims", namespace=namespace, group=keys.GROUP)
    tenants.wait_granted(kube.api, user, "get", "gpuclasses", group=keys.GROUP)


@pytest.fixture
def tenant_user(env: Env) -> Iterator[str]:
    user = f"alice-{env.id}"
    _grant_tenant(env.kube, env.tenant, user)
    try:
        yield user
    finally:
        rbac = client.RbacAuthorizationV1Api(env.kube.api)
        unless(404, lambda: rbac.delete_cluster_role_binding(f"catalog-{user}"))
        unless(404, lambda: rbac.delete_cluster_role(f"catalog-{user}"))


@pytest.fixture
def other_tenant(env: Env) -> Iterator[str]:
    name = f"{env.tenant}-bravo"
    env.kube.namespace(name, {f"tenant.cozystack.io/{name}": ""})
    try:
        yield name
    finally:
        unless(
            404,
            lambda: env.kube.custom.delete_collection_namespaced_custom_object(
                keys.GROUP, keys.VERSION, name, keys.PLURAL_CLAIMS
            ),
        )
        unless(404, lambda: env.kube.core.delete_namespace(name))


def run(plane: ControlPlane, *argv: str) -> tuple[int, list[str]]:
    out = io.StringIO()
    code = cli.main(["--kubeconfig", str(plane.kubeconfig), *argv], out)
    return code, out.getvalue().splitlines()


def _class_settled(env: Env, name: str, free: int) -> None:
    def settled() -> bool:
        obj = env.kube.custom.get_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name
        )
        return (obj.get("status") or {}).get("free") == free

    wait_for(settled, 15, f"class {name} free {free}")


def _waiting(env: Env, name: str, namespace: str | None = None) -> dict[str, Any]:
    def judged() -> dict[str, Any] | None:
        obj = env.kube.get_claim(namespace or env.tenant, name)
        return obj if condition(obj).get("status") == "False" else None

    result: dict[str, Any] = wait_for(judged, 15, f"claim {name} judged")
    return result


def scene(env: Env, bravo: str) -> dict[str, str]:
    """Two 2-GPU nodes of class h100 and a 4-GPU node of class t4; tenant bravo holds one
    unit and waits for 3; tenant A holds one (both on n0) and then waits for 3."""
    n0, n1 = env.node("n0", 2), env.node("n1", 2)
    h100 = env.gpu_class("h100", maxCount=4)
    n2 = env.node("n2", 4, resource=f"nvidia.com/T4_{env.id}")
    t4 = env.gpu_class("t4", resource=f"nvidia.com/T4_{env.id}")
    env.kube.quota(env.tenant, {keys.quota_key(h100): 4})
    env.kube.claim(bravo, "bravo-hold", h100, 1)
    env.wait_phase("bravo-hold", "Bound", namespace=bravo)
    env.kube.claim(env.tenant, "a0", h100, 1)
    assert env.wait_phase("a0", "Bound")["status"]["nodeName"] == n0
    waits = env.kube.claim(bravo, "bravo-wait", h100, 3)
    _waiting(env, "bravo-wait", bravo)
    # Arrival is by creationTimestamp (whole seconds): A's order comes a second later.
    made = translate.timestamp(waits["metadata"]["creationTimestamp"]) or 0.0
    wait_for(lambda: time.time() >= made + 1.1, 3, "the next second")
    env.kube.claim(env.tenant, "big", h100, 3)
    _waiting(env, "big")
    _class_settled(env, h100, 2)
    _class_settled(env, t4, 4)
    return {"n0": n0, "n1": n1, "n2": n2, "h100": h100, "t4": t4}


def test_a_tenants_explain_names_no_other_tenant_and_no_node(
    env: Env, control_plane: ControlPlane, tenant_user: str, other_tenant: str
) -> None:
    n = scene(env, other_tenant)
    t, h100, t4 = env.tenant, n["h100"], n["t4"]
    code, lines = run(control_plane, "explain", "claim", "big", "-n", t, "--as", tenant_user)
    assert code == 0
    lines = _this_tests(lines, env.id)
    level = f"{t} (this namespace)"
    width = len(level)
    key = keys.quota_key(h100)
    assert lines == [
        f"Claim:      {t}/big (class {h100}, 3 units)",
        "Phase:      Pending",
        f"Bound:      False InsufficientCapacity: no node serving class {h100} has 3 free "
        "units; the largest has 2",
        f"Class:      {h100} (passthrough): 2 free, 2 on one node, maxCount 4",
        "Budget:",
        f"  {'LEVEL':<{width}}   {'KEY':<{len(key)}}   USED   LIMIT",
        f"  {level}   {key}   >=1    4",
        f"  {level}   {keys.QUOTA_KEY_TOTAL:<{len(key)}}   >=1    -",
        "  levels above: not readable (the namespace's tenant labels)",
        "  >=: counts this namespace's claims only (others under a level are not readable)",
        f"Queue:      1st of 1 waiting orders of class {h100} in namespace {t} (the namespace "
        "you can list)",
        "To fit:",
        "  - a smaller count: 2 units fit on one node now",
        f"  - another class with room: {t4} (passthrough, 4 free, 4 on one node)",
        "  - wait: orders of the class bind oldest first as units are released",
    ]
    printed = "\n".join(lines)
    for secret in (other_tenant, "bravo", n["n0"], n["n1"], n["n2"]):
        assert secret not in printed
    # The same report as data names nothing more.
    code, lines = run(control_plane, "explain", "claim", "big", "-n", t, "--as", tenant_user,
                      "-o", "json")  # fmt: skip
    assert code == 0
    for secret in (other_tenant, "bravo", n["n0"], n["n1"], n["n2"]):
        assert secret not in "\n".join(lines)


def test_a_hosters_explain_shows_the_queue_the_nodes_and_the_models_what_if(
    env: Env, control_plane: ControlPlane, other_tenant: str
) -> None:
    n = scene(env, other_tenant)
    t, h100, t4 = env.tenant, n["h100"], n["t4"]
    code, lines = run(control_plane, "explain", "claim", "big", "-n", t)
    assert code == 0
    lines = _this_tests(lines, env.id)
    level = f"{t} (this namespace)"
    key = keys.quota_key(h100)
    node = len(n["n0"])
    assert lines == [
        f"Claim:      {t}/big (class {h100}, 3 units)",
        "Phase:      Pending",
        f"Bound:      False InsufficientCapacity: no node serving class {h100} has 3 free "
        "units; the largest has 2",
        f"Class:      {h100} (passthrough): 2 free, 2 on one node, maxCount 4",
        "Budget:",
        f"  {'LEVEL':<{len(level)}}   {'KEY':<{len(key)}}   USED   LIMIT",
        f"  {level}   {key}   1      4",
        f"  {level}   {keys.QUOTA_KEY_TOTAL:<{len(key)}}   1      -",
        f"Queue:      2nd of 2 waiting orders of class {h100} in every namespace",
        f"  ahead: {other_tenant}/bravo-wait (3 units)",
        "To fit:",
        "  - a smaller count: 2 units fit on one node now",
        f"  - another class with room: {t4} (passthrough, 4 free, 4 on one node)",
        "  - wait: orders of the class bind oldest first as units are released",
        "Nodes (closest first):",
        f"  {'NODE':<{node}}   ALLOCATABLE   HELD   RAW   FREE   SHORT   TAKES THE CLASS",
        f"  {n['n1']}   2             0      0     2      1       serves",
        f"  {n['n0']}   2             2      0     0      3       serves",
        f"What-if:    refused now: InsufficientCapacity: no node serving class {h100} has 3 "
        "free units; the largest has 2",
        f"  a count of 2 fits now on node {n['n1']}",
        f"  class {t4} fits now on node {n['n2']}",
    ]


def _this_tests(lines: list[str], test_id: str) -> list[str]:
    """The report without the suggestions of other tests' classes: the cluster is shared,
    and a real one has other classes with room too."""
    suggestions = ("  - another class with room: ", "  class ")
    return [ln for ln in lines if not ln.startswith(suggestions) or test_id in ln]


def _ageless(lines: list[str]) -> list[str]:
    return [re.sub(r"\b\d+s$", "<age>", line) for line in lines]


def test_top_shows_each_nodes_and_classes_units_by_phase(
    env: Env, control_plane: ControlPlane, other_tenant: str
) -> None:
    n = scene(env, other_tenant)
    code, lines = run(control_plane, "top", "nodes")
    assert code == 0
    # Columns are as wide as the widest row of the whole (shared) cluster: by fields.
    mine = [ln.split() for ln in _ageless(lines) if env.id in ln]
    h100, t4 = n["h100"], n["t4"]
    assert mine == [
        [n["n0"], h100, "2", "2", "0", "0", "0", "0", "Serving", "-", "<age>"],
        [n["n1"], h100, "2", "0", "0", "0", "2", "0", "Serving", "-", "<age>"],
        [n["n2"], t4, "4", "0", "0", "0", "4", "0", "Serving", "-", "<age>"],
    ]
    assert lines[0].split() == [
        "NODE", "CLASS", "ALLOCATABLE", "HELD", "ATTACHED", "LOST", "FREE", "RAW", "READY",
        "LAYOUT", "INVENTORY",
    ]  # fmt: skip
    code, lines = run(control_plane, "top", "classes")
    assert code == 0
    assert lines[0].split() == [
        "CLASS", "MODE", "NODES", "ALLOCATABLE", "HELD", "ATTACHED", "LOST", "FREE", "MAXFREE",
        "PENDING", "RAW", "BOOKED24H",
    ]  # fmt: skip
    rows = [ln.split() for ln in lines if env.id in ln]
    assert rows == [
        [h100, "passthrough", "2", "4", "2", "0", "0", "2", "2", "6", "0", "0"],
        [t4, "passthrough", "1", "4", "0", "0", "0", "4", "4", "0", "0", "0"],
    ]


def test_list_claims_filters_by_class_phase_tenant_and_node_within_the_users_rights(
    env: Env,
    control_plane: ControlPlane,
    tenant_user: str,
    other_tenant: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    names = scene(env, other_tenant)
    h100 = names["h100"]

    # The tenant: its namespace only, and only what it may list.
    code, lines = run(control_plane, "list", "claims", "-n", env.tenant, "--as", tenant_user)
    assert code == 0, lines
    assert lines[0].split()[:7] == ["NAMESPACE", "NAME", "CLASS", "COUNT", "PHASE", "NODE", "WHY"]
    assert [ln.split()[:7] for ln in lines[1:]] == [
        [env.tenant, "a0", h100, "1", "Bound", names["n0"], "-"],
        [env.tenant, "big", h100, "3", "Pending", "-", "InsufficientCapacity"],
    ]
    assert other_tenant not in "\n".join(lines)
    code, lines = run(control_plane, "list", "claims", "-A", "--as", tenant_user)
    assert (code, lines) == (1, [])
    assert "may not list gpuclaims in every namespace" in capsys.readouterr().err
    code, lines = run(control_plane, "list", "claims", "--tenant", env.tenant, "--as", tenant_user)
    assert (code, lines) == (1, [])
    assert "--tenant needs to list namespaces" in capsys.readouterr().err

    # The hoster: a node's claims (a field selector), a tenant's subtree, a phase.
    code, lines = run(control_plane, "list", "claims", "-A", "--node", names["n0"])
    assert code == 0
    assert {(ln.split()[0], ln.split()[1]) for ln in lines[1:]} == {
        (other_tenant, "bravo-hold"),
        (env.tenant, "a0"),
    }
    code, lines = run(
        control_plane, "list", "claims", "--tenant", other_tenant, "--phase", "Pending"
    )
    assert [ln.split()[:5] for ln in lines[1:]] == [
        [other_tenant, "bravo-wait", h100, "3", "Pending"]
    ]
    code, lines = run(control_plane, "list", "claims", "-A", "--class", names["t4"])
    assert (code, lines) == (0, ["No GPU claims found."])


def test_top_as_a_tenant_fails_with_one_line_and_status_1(
    env: Env, control_plane: ControlPlane, tenant_user: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = run(control_plane, "top", "nodes", "--as", tenant_user)
    assert (code, lines) == (1, [])
    assert capsys.readouterr().err.splitlines() == [
        "error: top needs to list nodes, GPU nodes, classes, claims, namespaces, quotas, pods "
        "and VMs in every namespace (a hoster's rights); this user may not"
    ]


def test_as_group_is_kubectls_each_flag_one_group_never_split_or_joined(
    env: Env, control_plane: ControlPlane, tenant_user: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """kubectl's --as-group is repeatable and each one names one group (a string array: a
    comma is part of the name). The tenant's rights are given to a group here: a user
    impersonated with --as-group other --as-group readers reads its claim; one group named
    "other,readers" is not that group."""
    readers, other, user = f"readers-{env.id}", f"other-{env.id}", f"bob-{env.id}"
    rbac = client.RbacAuthorizationV1Api(env.kube.api)
    group = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": readers}
    ref = {"apiGroup": "rbac.authorization.k8s.io"}
    rbac.create_namespaced_role_binding(
        env.tenant,
        {
            "metadata": {"name": "tenant-group"},
            "roleRef": {**ref, "kind": "Role", "name": "tenant"},
            "subjects": [group],
        },
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": f"catalog-{readers}"},
            "roleRef": {**ref, "kind": "ClusterRole", "name": f"catalog-{tenant_user}"},
            "subjects": [group],
        }
    )
    try:
        gpu_class = env.gpu_class()
        env.kube.claim(env.tenant, "mine", gpu_class, 1)
        as_groups = ("--as", user, "--as-group", other, "--as-group", readers)
        code, lines = run(control_plane, "explain", "claim", "mine", "-n", env.tenant, *as_groups)
        err = capsys.readouterr().err
        assert code == 0, f"groups {other} and {readers} were sent as one: {err}"
        assert lines[0].startswith(f"Claim:      {env.tenant}/mine "), lines
        joined = ("--as", user, "--as-group", f"{other},{readers}")
        code, lines = run(control_plane, "explain", "claim", "mine", "-n", env.tenant, *joined)
        err = capsys.readouterr().err
        assert (code, lines) == (1, []), "a comma split one group into two, unlike kubectl"
        assert "forbidden" in err, err
    finally:
        unless(404, lambda: rbac.delete_cluster_role_binding(f"catalog-{readers}"))


def test_explain_of_a_missing_claim_names_it_and_exits_1(
    env: Env, control_plane: ControlPlane, tenant_user: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out = run(
        control_plane, "explain", "claim", "nope", "-n", env.tenant, "--as", tenant_user
    )
    assert code == 1
    assert capsys.readouterr().err.splitlines() == [
        f'error: gpuclaims.gpu.cozystack.io "nope" not found in namespace "{env.tenant}"'
    ]


def _timeless(lines: list[str]) -> list[str]:
    return [re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "<time>", line) for line in lines]


def test_explain_vm_shows_its_set_node_and_launcher_pod_gated_or_bound(
    env: Env, full_control_plane: ControlPlane, tenant_user: str
) -> None:
    n0 = env.node("n0", 2)
    h100 = env.gpu_class("h100", maxCount=4)
    env.kube.claim(env.tenant, "g", h100, 1)
    env.wait_phase("g", "Bound")
    env.gated_vmi("vm", '{"claims": ["g"]}', units=1)
    # The VMI webhook's attachment (no webhook runs here): the gate pins the launcher pod once
    # its held claim is attached to the VMI and protected.
    env.kube.attach(env.tenant, "g", "vm")

    def bound_to_node() -> str | None:
        pod = env.kube.core.read_namespaced_pod("virt-launcher-vm", env.tenant)
        return str(pod.spec.node_name) if pod.spec.node_name else None

    wait_for(bound_to_node, 30, "pod bound")
    code, lines = run(full_control_plane, "explain", "vm", "vm", "-n", env.tenant,
                      "--as", tenant_user)  # fmt: skip
    assert code == 0
    assert _timeless(lines) == [
        f"VM:         {env.tenant}/vm (no VirtualMachine)",
        "VMI:        Pending",
        f"Set node:   {n0}",
        "Claims:",
        "  CLAIM   FROM   CLASS" + " " * (len(h100) - 2) + "COUNT   PHASE      NODE"
        + " " * (len(n0) - 1) + "ATTACHED TO",
        f"  g       held   {h100}   1       Attached   {n0}   vm",
        f"  g Placed=True Pinned: launcher pod virt-launcher-vm pinned to node {n0}",
        f"Launcher:   virt-launcher-vm bound to node {n0}",
        "Events:",
        "  TIME" + " " * 19 + "TYPE     REASON   OBJECT       MESSAGE",
        f"  <time>   Normal   Bound    GPUClaim/g   holds 1 unit(s) of class {h100} on node {n0}",
    ]  # fmt: skip
    # A set that fits nowhere: its launcher pod stays at the gate, and the claim says why.
    env.kube.claim(env.tenant, "p", h100, 3)
    _waiting(env, "p")
    env.gated_vmi("vm2", '{"claims": ["p"]}', units=3)

    def placed_false() -> bool:
        return (
            condition(env.kube.get_claim(env.tenant, "p"), keys.CONDITION_PLACED).get("status")
            == "False"
        )

    wait_for(placed_false, 15, "claim p not placed")
    code, lines = run(full_control_plane, "explain", "vm", "vm2", "-n", env.tenant,
                      "--as", tenant_user)  # fmt: skip
    assert code == 0
    text = _timeless(lines)
    assert text[:3] == [
        f"VM:         {env.tenant}/vm2 (no VirtualMachine)",
        "VMI:        Pending",
        "Set node:   not bound yet",
    ]
    assert f"  p       held   {h100}   3       Pending   -      -" in text
    assert (
        f"Launcher:   virt-launcher-vm2 gated (scheduling gate {keys.SCHEDULING_GATE_CLAIMS})"
        in text
    )
    assert any(line.startswith("  p Bound=False InsufficientCapacity: ") for line in text)
    assert any(line.startswith("  p Placed=False ") for line in text)


def test_explain_vm_of_no_vm_names_it_and_exits_1(
    env: Env, control_plane: ControlPlane, tenant_user: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out = run(control_plane, "explain", "vm", "nope", "-n", env.tenant, "--as", tenant_user)
    assert code == 1
    assert capsys.readouterr().err.splitlines() == [
        f'error: virtualmachines.kubevirt.io "nope" not found in namespace "{env.tenant}"'
    ]


def test_a_tenants_reservation_lists_and_explains_and_a_hoster_sees_the_models_booking(
    env: Env,
    control_plane: ControlPlane,
    tenant_user: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    n0 = env.node("n0", 2)
    h100 = env.gpu_class("h100", maxCount=4)
    _class_settled(env, h100, 2)
    # A window of 2h starting on the hour after next (whole minutes, as the CRD asks).
    start = (int(time.time()) // 3600 + 2) * 3600
    begin, end = translate.rfc3339(start), translate.rfc3339(start + 2 * 3600)
    after = translate.rfc3339(start + 4 * 3600)
    tenant = tenants.impersonating(control_plane.api_client(), tenant_user)

    def reserve(name: str, count: int) -> None:
        tenant.custom.create_namespaced_custom_object(
            keys.GROUP, keys.VERSION, env.tenant, keys.PLURAL_RESERVATIONS,
            {"apiVersion": keys.API_VERSION, "kind": keys.KIND_RESERVATION,
             "metadata": {"name": name},
             "spec": {"class": h100, "count": count, "start": begin, "end": end}},
        )  # fmt: skip

    def phase(name: str, wanted: str) -> bool:
        obj = env.kube.custom.get_namespaced_custom_object(
            keys.GROUP, keys.VERSION, env.tenant, keys.PLURAL_RESERVATIONS, name
        )
        status = obj.get("status") or {}
        return status.get("phase") == wanted and bool(status.get("conditions"))

    # One window the binder books on the class's only node; one that no longer fits there.
    reserve("train", 1)
    wait_for(lambda: phase("train", "Booked"), 30, "train booked")
    reserve("more", 2)
    wait_for(lambda: phase("more", "Pending"), 30, "more waiting, saying why")

    # The tenant: its namespace's reservations, with kubectl get's columns; the node a
    # booking holds is its own object's.
    code, lines = run(control_plane, "list", "reservations", "-n", env.tenant,
                      "--as", tenant_user)  # fmt: skip
    assert code == 0, lines
    assert sorted(ln.split()[:8] for ln in lines[1:]) == [
        [env.tenant, "more", h100, "2", begin, end, "Pending", "-"],
        [env.tenant, "train", h100, "1", begin, end, "Booked", n0],
    ]
    code, lines = run(control_plane, "list", "reservations", "-A", "--as", tenant_user)
    assert (code, lines) == (1, [])
    assert "may not list gpureservations in every namespace" in capsys.readouterr().err

    # Its explain says what it books and why it waits, and no model's judgement: the
    # tenant cannot read the nodes and windows the model judges with.
    code, lines = run(control_plane, "explain", "reservation", "more", "-n", env.tenant,
                      "--as", tenant_user)  # fmt: skip
    assert code == 0, lines
    assert lines[0] == f"Reservation: {env.tenant}/more (class {h100}, 2 units)"
    assert lines[1].startswith(f"Window:      {begin} to {end} (2h; starts in ")
    assert lines[2] == "Phase:       Pending"
    waiting = [ln for ln in lines if ln.startswith("Waiting:")]
    assert waiting == [
        f"Waiting:     InsufficientCapacity: no node serving class {h100} has 2 units free "
        f"from {begin} to {end}; the largest has 1 then; the earliest window of 2h that fits "
        f"starts at {end}"
    ], lines
    assert not [ln for ln in lines if ln.startswith("Booking:")]
    assert n0 not in "\n".join(lines)

    # The hoster: the booking model's answer on the binder's view of the cluster.
    code, lines = run(control_plane, "explain", "reservation", "more", "-n", env.tenant)
    assert code == 0, lines
    assert lines[-2].startswith("Booking:     refused now: InsufficientCapacity: "), lines
    assert lines[-1] == f"  earliest window of 2h that fits: {end} to {after}"
    code, lines = run(control_plane, "list", "reservations", "-A", "--class", h100)
    assert sorted(ln.split()[:2] for ln in lines[1:]) == [
        [env.tenant, "more"],
        [env.tenant, "train"],
    ]
