"""Bad input, fuzzed (hypothesis) through the real API server, with a binder running.

Whatever a user or an agent writes that the API server takes (CRD schemas and CEL judge
first), the binder must not die, must say why an order waits, and must go on serving the
other objects: after each batch a normal order on a normal class is still Bound, and the
fault suite's invariants hold. What the API server refuses must say what is wrong: its
message names the field.
"""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from binder_env import Env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.binder.parts import publisher
from cozystack_gpu_testkit.invariants import Invariants, Scope
from cozystack_gpu_testkit.objects import wait_for

pytestmark = pytest.mark.apiserver

EXAMPLES = 40
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    # One cluster serves every example: that is the point (the binder lives through all).
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

texts = st.text(alphabet=string.printable + "é漢\u200b", max_size=40)
label_values = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?", fullmatch=True)
resource_names = st.one_of(
    st.from_regex(r"[a-z]{1,8}\.(com|io)/[A-Za-z0-9_.-]{1,20}", fullmatch=True), texts
)


def refusal(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body).get("message", ""))
    except (TypeError, ValueError):
        return str(exc.body)


def assert_clear(exc: ApiException) -> None:
    """The API server refused, for a reason it names: a field of the object."""
    message = refusal(exc)
    assert exc.status in (400, 403, 422), (exc.status, message)
    assert any(part in message for part in ("spec", "status", "metadata")), message


def assert_still_serving(env: Env, tag: str) -> None:
    """The binder lives, a normal order is Bound, and every rule holds."""
    assert env.binder.failure is None, env.binder.failure
    assert not env.binder.dead_threads()
    name = f"canary-{tag}"
    env.kube.claim(env.tenant, name, env.name("ok"), 1)
    env.wait_phase(name, "Bound", timeout=30)
    checker = Invariants(env.kube.api, Scope(frozenset({env.tenant}), env.selector))
    found = checker.wait_settled(60)
    assert not found, "\n".join(str(v) for v in found)


def ok_resource(env: Env) -> str:
    return f"nvidia.com/OK_{env.id}"


@pytest.fixture
def serving(env: Env) -> Env:
    """A node and a class nothing fuzzed touches, for the canary orders."""
    env.node("ok", 64, resource=ok_resource(env), labels={"fuzz": "no"})
    env.gpu_class("ok", resource=ok_resource(env))
    return env


def class_specs(env: Env) -> st.SearchStrategy[dict[str, Any]]:
    """Mostly specs the CRD takes, with every value the schema allows fuzzed (selectors,
    tolerations, counts, quantities, names); a quarter anything-goes."""
    words = st.text(alphabet=string.ascii_letters + string.digits + " -_é", min_size=1, max_size=63)
    keys_ = st.from_regex(
        r"([a-z0-9]{1,10}\.[a-z]{2,5}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,8}[A-Za-z0-9])?",
        fullmatch=True,
    )
    toleration = st.one_of(
        st.fixed_dictionaries(
            {"key": keys_, "operator": st.just("Equal"), "value": label_values},
            optional={"effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])},
        ),
        st.fixed_dictionaries(
            {"operator": st.just("Exists")},
            optional={"key": keys_, "effect": st.sampled_from(["NoSchedule", "NoExecute"])},
        ),
    )
    selector = st.one_of(
        st.just(env.selector),
        st.dictionaries(keys_, label_values, max_size=3),
        st.dictionaries(keys_, label_values, max_size=2).map(lambda d: {**d, **env.selector}),
    )
    resource = st.one_of(
        st.just(env.resource),
        st.from_regex(
            r"[a-z]{1,8}\.(com|io)/[A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?", fullmatch=True
        ),
    )

    def valid(mode: str, profile: str) -> st.SearchStrategy[dict[str, Any]]:
        return st.fixed_dictionaries(
            {
                "vendor": words,
                "model": words,
                "mode": st.just(mode),
                "source": st.builds(lambda r: {"devicePlugin": {"resourceName": r}}, resource),
                **({"profile": st.just(profile)} if mode == "vgpu" else {}),
            },
            optional={
                "maxCount": st.integers(1, 2**31 - 1),
                "nodeSelector": selector,
                "onCordon": st.sampled_from(["Move", "Stay"]),
                "tolerations": st.lists(toleration, max_size=4),
                "memory": st.from_regex(
                    r"[0-9]{1,6}(\.[0-9]{1,2})?(Ki|Mi|Gi|Ti|k|M|G|m)?", fullmatch=True
                ),
                "displayName": st.text(max_size=256),
            },
        )

    return st.one_of(
        valid("passthrough", ""),
        valid("passthrough", ""),
        words.flatmap(lambda profile: valid("vgpu", profile)),
        wild_class_specs(env),
    )


def wild_class_specs(env: Env) -> st.SearchStrategy[dict[str, Any]]:
    toleration = st.fixed_dictionaries(
        {},
        optional={
            "key": st.one_of(label_values, texts),
            "operator": st.sampled_from(["Exists", "Equal", "In", "", "exists"]),
            "value": texts,
            "effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule", "", "x"]),
        },
    )
    source = st.one_of(
        st.fixed_dictionaries(
            {"devicePlugin": st.fixed_dictionaries({"resourceName": resource_names})}
        ),
        st.just({}),
        st.just({"dra": {}}),
    )
    return st.fixed_dictionaries(
        {
            "vendor": st.sampled_from(["nvidia", "amd", ""]),
            "model": texts,
            "mode": st.sampled_from(["passthrough", "vgpu", "mig"]),
            "source": source,
        },
        optional={
            "profile": texts,
            "maxCount": st.integers(-2, 2**40),
            "nodeSelector": st.dictionaries(label_values, label_values, max_size=3),
            "onCordon": st.sampled_from(["Move", "Stay", "Drop"]),
            "tolerations": st.lists(toleration, max_size=3),
            "memory": texts,
            "displayName": st.text(max_size=300),
        },
    )


def test_class_and_claim_specs_the_api_takes_never_stop_the_binder(serving: Env) -> None:
    env = serving
    env.node("fz", 8)  # GPUs of the resource name most fuzzed classes offer
    seq = iter(range(10**6))
    created: list[str] = []

    @FUZZ
    @given(spec=class_specs(env), count=st.one_of(st.integers(1, 9), st.integers(-1, 70)))
    def send(spec: dict[str, Any], count: int) -> None:
        n = next(seq)
        name = f"fz{n}-{env.id}"
        body = {"apiVersion": keys.API_VERSION, "kind": keys.KIND_CLASS, "metadata": {"name": name}}
        try:
            env.kube.custom.create_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, {**body, "spec": spec}
            )
        except ApiException as exc:
            assert_clear(exc)
            return
        created.append(name)
        try:
            env.kube.claim(env.tenant, f"fz{n}", name, count)
        except ApiException as exc:
            assert_clear(exc)

    try:
        send()
        assert_still_serving(env, "classes")
    finally:
        for name in created:
            env.kube.custom.delete_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name
            )


def device_reports(env: Env) -> st.SearchStrategy[dict[str, Any]]:
    address = st.builds(
        "0000:{:02x}:{:02x}.{}".format, st.integers(0, 255), st.integers(0, 31), st.integers(0, 7)
    )
    device = st.fixed_dictionaries(
        {"pciAddress": st.one_of(address, texts)},
        optional={
            "resourceName": st.one_of(st.just(env.resource), resource_names),
            "allocatable": st.one_of(st.integers(-3, 2**31), texts),
            "iommuGroup": st.integers(-1, 2**31 - 1),
            "numaNode": st.integers(-1, 8),
            "model": texts,
            "driver": st.sampled_from(["vfio-pci", "nvidia", "", "x" * 70]),
            "pods": st.lists(
                st.fixed_dictionaries({"namespace": label_values, "name": label_values}),
                max_size=2,
            ),
            "error": texts,
        },
    )
    return st.fixed_dictionaries(
        {
            "devices": st.lists(device, max_size=4),
            "resourceNames": st.lists(resource_names, max_size=3),
        },
        optional={"updatedAt": st.sampled_from(["2026-01-01T00:00:00Z", "yesterday", ""])},
    )


def test_gpunode_reports_the_api_takes_never_stop_the_binder(serving: Env) -> None:
    env = serving
    node = env.node("fz", 4)
    gpu_class = env.gpu_class()

    @FUZZ
    @given(report=device_reports(env))
    def send(report: dict[str, Any]) -> None:
        try:
            env.kube.custom.patch_cluster_custom_object_status(
                keys.GROUP, keys.VERSION, keys.PLURAL_NODES, node, {"status": report}
            )
        except ApiException as exc:
            assert_clear(exc)

    send()
    env.kube.claim(env.tenant, "after-reports", gpu_class, 1)
    assert_still_serving(env, "reports")


annotations = st.one_of(
    texts,
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=8,
    ).map(json.dumps),
    st.builds(
        lambda claims, templates: json.dumps({"claims": claims, "claimTemplates": templates}),
        st.lists(st.one_of(label_values, texts, st.integers()), max_size=3),
        st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "name": st.one_of(label_values, texts),
                    "class": st.one_of(label_values, texts),
                    "count": st.one_of(st.integers(-2, 100), texts),
                },
            ),
            max_size=2,
        ),
    ),
)


def test_vmis_with_any_claims_annotation_never_stop_the_binder(serving: Env) -> None:
    """VMIs stored without the webhook (the label and annotation as a user wrote them), each
    with a gated launcher pod: the gate must neither die nor pin anything it cannot read."""
    env = serving
    env.node("vm", 4)
    seq = iter(range(10**6))

    @FUZZ
    @given(annotation=annotations, labelled=st.booleans())
    def send(annotation: str, labelled: bool) -> None:
        env.gated_vmi(f"fz{next(seq)}", annotation, labelled=labelled)

    send()
    assert_still_serving(env, "vmis")


def test_the_settings_configmap_edited_by_hand_is_written_back(
    serving: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller owns gpu-settings (the raw-name policy reads it as its parameter):
    whatever someone writes there by hand, or if they delete it, it comes back (every
    SETTINGS_REFRESH_S, shortened here)."""
    monkeypatch.setattr(publisher, "SETTINGS_REFRESH_S", 1.0)
    env = serving
    core = env.kube.core

    def settings_data() -> dict[str, str] | None:
        try:
            found = core.read_namespaced_config_map(keys.SETTINGS_CONFIGMAP, env.controller_ns)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(found.data or {})

    def current() -> dict[str, str] | None:
        data = settings_data()
        names = (data or {}).get(keys.SETTINGS_KEY_RESOURCE_NAMES, "")
        return data if ok_resource(env) in keys.parse_resource_names(names) else None

    wanted = wait_for(current, 30, "the settings ConfigMap naming the GPUs")

    def written_back() -> bool:
        # The names other tests' nodes advertise may change meanwhile (their inventories
        # going stale): the policy and the keys must be back, and this test's GPU named.
        data = current()
        raw = keys.SETTINGS_KEY_RAW_RESOURCE_NAMES
        return data is not None and set(data) == set(wanted) and data.get(raw) == wanted.get(raw)

    @settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        data=st.one_of(
            st.dictionaries(st.sampled_from([*wanted, "other"]), texts, max_size=3),
            st.none(),
        )
    )
    def edit(data: dict[str, str] | None) -> None:
        if data is None:
            core.delete_namespaced_config_map(keys.SETTINGS_CONFIGMAP, env.controller_ns)
        else:
            core.replace_namespaced_config_map(
                keys.SETTINGS_CONFIGMAP,
                env.controller_ns,
                {"metadata": {"name": keys.SETTINGS_CONFIGMAP}, "data": data},
            )
        wait_for(written_back, 15, "gpu-settings written back")

    edit()
    assert_still_serving(env, "settings")
