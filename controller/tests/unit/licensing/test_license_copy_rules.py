"""The licence copies as a pure decision: which token copies should exist where, and what
to create, update and delete to get there (SPEC.md §10)."""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cozystack_gpu import keys
from cozystack_gpu.licensing import rules

CLASSES = ["a", "b", "c"]
NAMESPACES = ["t1", "t2", "t3"]
SECRETS = ["s1", "s2"]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _class(name: str, mode: str, secret: str | None, feature_type: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {"mode": mode}
    if secret is not None:
        spec["license"] = {
            "secretRef": {"name": secret, "key": "token.tok"},
            "featureType": feature_type,
        }
    return {"metadata": {"name": name}, "spec": spec}


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
        st.just({}),  # the key is missing
        st.builds(
            lambda token: {"token.tok": _b64(token), "other": _b64("not for tenants")},
            st.text(min_size=1, max_size=8),
        ),
    ),
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
        and "token.tok" in sources.get(c["spec"]["license"]["secretRef"]["name"], {})
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
        source = sources[lic["secretRef"]["name"]]
        assert body["data"] == {
            keys.LICENSE_TOKEN_KEY: source["token.tok"],
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
    sources = {"s1": {"token.tok": _b64("tok")}}
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
        [deleting], {"t1": {keys.LABEL_VGPU_ENTITLEMENT: "true"}}, {"s1": {"token.tok": "dA=="}}
    )
    assert set(desired) == {("t1", "gpu-license-a")}


def test_class_license_is_read_only_from_vgpu_classes() -> None:
    assert rules.class_license(_class("a", "passthrough", "s1")) is None
    assert rules.class_license(_class("a", "vgpu", None)) is None
    found = rules.class_license(_class("a", "vgpu", "s1", 4))
    assert found == rules.License("a", "s1", "token.tok", 4)
