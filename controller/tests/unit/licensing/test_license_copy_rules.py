"""The licence copies as a pure decision: which token copies should exist where, and what
to create, update and delete to get there (SPEC.md §10)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cozystack_gpu import keys
from cozystack_gpu.licensing import rules

CLASSES = ["a", "b", "c"]
NAMESPACES = ["t1", "t2", "t3"]
SECRETS = ["s1", "s2"]
NOW = 1_800_000_000.0


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


TOKEN = keys.LICENSE_TOKEN_KEY
MARKED = {keys.LABEL_LICENSE_TOKEN: keys.LICENSE_TOKEN_MARK}


def _class(
    name: str, mode: str, secret: str | None, feature_type: int = 1, key: str = TOKEN
) -> dict[str, Any]:
    spec: dict[str, Any] = {"mode": mode}
    if secret is not None:
        spec["license"] = {
            "secretRef": {"name": secret, "key": key},
            "featureType": feature_type,
        }
    return {"metadata": {"name": name, "resourceVersion": "7"}, "spec": spec}


def _secret(
    data: dict[str, str], labels: dict[str, str] | None = None, type_: str | None = "Opaque"
) -> dict[str, Any]:
    """A Secret of the controller's namespace as the copier's watch sees it."""
    body: dict[str, Any] = {"metadata": {"labels": MARKED if labels is None else labels}}
    if type_ is not None:
        body["type"] = type_
    body["data"] = data
    return body


classes_st = st.lists(
    st.tuples(
        st.sampled_from(CLASSES),
        st.sampled_from(["vgpu", "passthrough"]),
        st.one_of(st.none(), st.sampled_from(SECRETS)),
        st.sampled_from([1, 2, 4]),
    ),
    unique_by=lambda t: t[0],
).map(lambda items: [_class(*item) for item in items])

namespaces_st = st.dictionaries(
    st.sampled_from(NAMESPACES),
    st.sampled_from(
        [{}, {keys.LABEL_VGPU_ENTITLEMENT: "true"}, {keys.LABEL_VGPU_ENTITLEMENT: "false"}]
    ),
)

sources_st = st.dictionaries(
    st.sampled_from(SECRETS),
    st.one_of(
        st.just(_secret({})),  # the key is missing
        st.builds(
            lambda token, labels, type_: _secret(
                {TOKEN: _b64(token), "other": _b64("not for tenants")}, labels, type_
            ),
            st.text(min_size=1, max_size=8),
            # Marked, unmarked, marked otherwise; Opaque (or no type: Opaque), or a type
            # that is no licence token whatever its label says.
            st.sampled_from([MARKED, {}, {keys.LABEL_LICENSE_TOKEN: "false"}]),
            st.sampled_from(["Opaque", None, "kubernetes.io/tls"]),
        ),
    ),
)


def _copied(source: dict[str, Any] | None) -> bool:
    """What the SPEC lets travel: a marked Opaque Secret holding the token key."""
    return bool(
        source
        and source["metadata"]["labels"].get(keys.LABEL_LICENSE_TOKEN) == "true"
        and source.get("type", "Opaque") == "Opaque"
        and source["data"].get(TOKEN)
    )


def _existing_copy(namespace: str, class_name: str, token: str, tampered: bool) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": namespace,
            "name": keys.license_copy_name(class_name),
            "labels": {keys.LABEL_MANAGED_BY: keys.MANAGED_BY_CONTROLLER},
        },
        "type": "Opaque",
        "data": {keys.LICENSE_TOKEN_KEY: _b64(token + ("x" if tampered else ""))},
    }


existing_st = st.lists(
    st.builds(
        _existing_copy,
        st.sampled_from(NAMESPACES),
        st.sampled_from(CLASSES),
        st.text(max_size=4),
        st.booleans(),
    ),
    unique_by=lambda c: (c["metadata"]["namespace"], c["metadata"]["name"]),
).map(lambda copies: {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in copies})


def _apply(existing: dict[Any, Any], plan: rules.CopyPlan) -> dict[Any, Any]:
    """What the managed copies are once the plan is written."""
    after = dict(existing)
    for key in plan.deletes:
        after.pop(key)
    for copy in (*plan.creates, *plan.updates):
        after[(copy.namespace, copy.name)] = rules.copy_body(copy)
    return after


@given(classes_st, namespaces_st, sources_st, existing_st)
def test_copies_exist_exactly_in_entitled_namespaces_of_licensed_vgpu_classes(
    classes: list[dict[str, Any]],
    namespaces: dict[str, dict[str, str]],
    sources: dict[str, dict[str, str]],
    existing: dict[Any, Any],
) -> None:
    desired = rules.desired_copies(classes, namespaces, sources)
    after = _apply(existing, rules.plan_copies(desired, existing))
    expected = {
        (ns, keys.license_copy_name(c["metadata"]["name"]))
        for c in classes
        if c["spec"]["mode"] == "vgpu"
        and "license" in c["spec"]
        and _copied(sources.get(c["spec"]["license"]["secretRef"]["name"]))
        for ns, labels in namespaces.items()
        if labels.get(keys.LABEL_VGPU_ENTITLEMENT) == "true"
    }
    assert set(after) == expected


@given(classes_st, namespaces_st, sources_st, existing_st)
def test_every_copy_holds_its_class_token_and_feature_type_and_nothing_else(
    classes: list[dict[str, Any]],
    namespaces: dict[str, dict[str, str]],
    sources: dict[str, dict[str, str]],
    existing: dict[Any, Any],
) -> None:
    desired = rules.desired_copies(classes, namespaces, sources)
    after = _apply(existing, rules.plan_copies(desired, existing))
    by_copy = {keys.license_copy_name(c["metadata"]["name"]): c for c in classes}
    for (_ns, name), body in after.items():
        lic = by_copy[name]["spec"]["license"]
        source = sources[lic["secretRef"]["name"]]["data"]
        assert body["data"] == {
            keys.LICENSE_TOKEN_KEY: source[TOKEN],
            keys.LICENSE_FEATURE_TYPE_KEY: _b64(str(lic["featureType"])),
        }
        labels = body["metadata"]["labels"]
        assert labels[keys.LABEL_MANAGED_BY] == keys.MANAGED_BY_CONTROLLER
        assert labels[keys.LABEL_LICENSE_CLASS] == by_copy[name]["metadata"]["name"]


@given(classes_st, namespaces_st, sources_st, existing_st)
def test_a_written_plan_leaves_nothing_to_do(
    classes: list[dict[str, Any]],
    namespaces: dict[str, dict[str, str]],
    sources: dict[str, dict[str, str]],
    existing: dict[Any, Any],
) -> None:
    desired = rules.desired_copies(classes, namespaces, sources)
    after = _apply(existing, rules.plan_copies(desired, existing))
    again = rules.plan_copies(desired, after)
    assert again == rules.CopyPlan((), (), ())


def test_a_tampered_copy_is_put_back_and_an_untouched_one_left_alone() -> None:
    classes = [_class("a", "vgpu", "s1")]
    namespaces = {"t1": {keys.LABEL_VGPU_ENTITLEMENT: "true"}}
    sources = {"s1": _secret({TOKEN: _b64("tok")})}
    desired = rules.desired_copies(classes, namespaces, sources)
    good = rules.copy_body(desired[("t1", "gpu-license-a")])
    assert rules.plan_copies(desired, {("t1", "gpu-license-a"): good}).updates == ()
    edited = {**good, "data": {keys.LICENSE_TOKEN_KEY: _b64("mine")}}
    plan = rules.plan_copies(desired, {("t1", "gpu-license-a"): edited})
    assert [c.name for c in plan.updates] == ["gpu-license-a"]
    relabelled = {**good, "metadata": {**good["metadata"], "labels": {}}}
    plan = rules.plan_copies(desired, {("t1", "gpu-license-a"): relabelled})
    assert [c.name for c in plan.updates] == ["gpu-license-a"]


def test_a_class_being_deleted_keeps_its_copies_for_the_claims_it_still_serves() -> None:
    deleting = _class("a", "vgpu", "s1")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    desired = rules.desired_copies(
        [deleting], {"t1": {keys.LABEL_VGPU_ENTITLEMENT: "true"}}, {"s1": _secret({TOKEN: "dA=="})}
    )
    assert set(desired) == {("t1", "gpu-license-a")}


def test_class_license_is_read_only_from_vgpu_classes() -> None:
    assert rules.class_license(_class("a", "passthrough", "s1")) is None
    assert rules.class_license(_class("a", "vgpu", None)) is None
    found = rules.class_license(_class("a", "vgpu", "s1", 4))
    assert found == rules.License("a", "s1", TOKEN, 4)


ENTITLED = {"t1": {keys.LABEL_VGPU_ENTITLEMENT: "true"}}
# The Secrets a controller namespace holds besides the hoster's token, named by a careless
# (or misled) class: none may travel to a tenant.
NOT_A_TOKEN = {
    "the webhook's TLS key (unmarked)": (
        _secret({"tls.crt": "Yw==", "tls.key": "aw=="}, {}, "kubernetes.io/tls"),
        keys.LicenseReason.SECRET_NOT_MARKED,
    ),
    "a TLS Secret someone marked": (
        _secret({TOKEN: "aw==", "tls.key": "aw=="}, None, "kubernetes.io/tls"),
        keys.LicenseReason.SECRET_WRONG_TYPE,
    ),
    "a ServiceAccount token someone marked": (
        _secret({TOKEN: "aw==", "token": "aw=="}, None, "kubernetes.io/service-account-token"),
        keys.LicenseReason.SECRET_WRONG_TYPE,
    ),
    "an unmarked Opaque Secret with a token key": (
        _secret({TOKEN: "aw=="}, {}),
        keys.LicenseReason.SECRET_NOT_MARKED,
    ),
    "a marked Secret without the token": (
        _secret({"other": "aw=="}),
        keys.LicenseReason.TOKEN_MISSING,
    ),
}


@pytest.mark.parametrize("what", sorted(NOT_A_TOKEN))
def test_only_a_marked_opaque_token_secret_is_copied_and_the_class_says_why_not(
    what: str,
) -> None:
    secret, reason = NOT_A_TOKEN[what]
    classes = [_class("a", "vgpu", "s1")]
    assert rules.desired_copies(classes, ENTITLED, {"s1": secret}) == {}, f"{what} was copied"
    patch = rules.class_condition_patch(classes[0], {"s1": secret}, NOW)
    assert patch is not None
    (cond,) = patch["status"]["conditions"]
    assert cond["type"] == keys.CONDITION_LICENSE_READY and cond["status"] == "False"
    assert cond["reason"] == reason.value
    assert "Secret s1" in cond["message"]
    assert patch["metadata"]["resourceVersion"] == "7"


def test_a_class_naming_a_key_other_than_the_token_key_is_refused() -> None:
    classes = [_class("a", "vgpu", "s1", key="tls.key")]
    secret = _secret({TOKEN: "dA==", "tls.key": "aw=="})
    assert rules.desired_copies(classes, ENTITLED, {"s1": secret}) == {}
    cond = rules.license_condition(classes[0], {"s1": secret}, NOW)
    assert cond is not None and cond["reason"] == keys.LicenseReason.KEY_NOT_TOKEN.value
    assert f"under the key {TOKEN}" in cond["message"]


def test_a_missing_secret_is_said_on_the_class() -> None:
    cond = rules.license_condition(_class("a", "vgpu", "s1"), {}, NOW)
    assert cond is not None and cond["reason"] == keys.LicenseReason.SECRET_MISSING.value


def test_an_accepted_token_says_so_once_and_a_class_without_licence_loses_the_condition() -> None:
    klass = _class("a", "vgpu", "s1")
    sources = {"s1": _secret({TOKEN: "dA=="})}
    patch = rules.class_condition_patch(klass, sources, NOW)
    assert patch is not None
    (cond,) = patch["status"]["conditions"]
    assert (cond["status"], cond["reason"]) == ("True", keys.LicenseReason.COPIED.value)
    available = {"type": keys.CONDITION_AVAILABLE, "status": "True", "reason": "Free"}
    klass["status"] = {"conditions": [available, cond]}
    assert rules.class_condition_patch(klass, sources, NOW + 5) is None
    klass["spec"].pop("license")
    patch = rules.class_condition_patch(klass, sources, NOW)
    assert patch is not None
    # The binder's condition stays; only the copier's own goes.
    assert patch["status"]["conditions"] == [available]


def test_a_copy_the_rotation_left_behind_or_a_tenant_forged_is_not_the_controllers() -> None:
    desired = rules.desired_copies(
        [_class("a", "vgpu", "s1")], ENTITLED, {"s1": _secret({TOKEN: _b64("real")})}
    )
    wanted = desired[("t1", "gpu-license-a")]
    good = rules.copy_body(wanted)
    assert rules.copy_problem(wanted, good) is None
    # A tenant's own Secret of the copy's name, with the copier's labels and a hash that is
    # right for the data it carries: the data is not the hoster's token.
    fake = ((keys.LICENSE_FEATURE_TYPE_KEY, _b64("1")), (keys.LICENSE_TOKEN_KEY, _b64("mine")))
    forged = rules.copy_body(rules.Copy("t1", wanted.name, "a", fake))
    assert rules.copy_problem(wanted, forged) == "its data is not the hoster's current token"
    plan = rules.plan_copies(desired, {("t1", wanted.name): forged})
    assert plan.updates == (wanted,)
    # A copy from before the hash annotation is written again.
    unhashed = {**good, "metadata": {**good["metadata"], "annotations": {}}}
    assert rules.copy_problem(wanted, unhashed) is not None
    assert rules.plan_copies(desired, {("t1", wanted.name): unhashed}).updates == (wanted,)
