"""The leader's licence copier against the real API server (SPEC.md §10): the hoster's
token Secret reaches exactly the namespaces entitled to vGPU, follows their labels, the
Secret's rotation and the class, and a copy someone else changes is put back."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
from admission_env import helm_template
from binder_env import Corner
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.licensing import rules
from cozystack_gpu.licensing.copier import LicenseCopier
from cozystack_gpu_testkit import tenants
from cozystack_gpu_testkit.objects import Kube, unless, wait_for

pytestmark = pytest.mark.apiserver

ENTITLED = {keys.LABEL_VGPU_ENTITLEMENT: keys.VGPU_ENTITLEMENT_VALUE}
MARKED = {keys.LABEL_LICENSE_TOKEN: keys.LICENSE_TOKEN_MARK}
TOKEN = keys.LICENSE_TOKEN_KEY


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Licences:
    """One test's token Secret, licensed class and tenant namespaces, with a copier."""

    def __init__(self, kube: Kube, corner: Corner) -> None:
        self.kube, self.corner = kube, corner
        self.core = kube.core
        self.entitled = corner.name("lic-yes")
        self.plain = corner.name("lic-no")
        kube.namespace(self.entitled, ENTITLED)
        kube.namespace(self.plain)
        self.secret = corner.name("nls")
        self.core.create_namespaced_secret(
            corner.controller_ns,
            {
                "metadata": {"name": self.secret, "labels": MARKED},
                "data": {TOKEN: _b64("token-1"), "other": _b64("hoster only")},
            },
        )
        self.gpu_class = corner.gpu_class(
            "l40s",
            mode="vgpu",
            license={"secretRef": {"name": self.secret, "key": TOKEN}, "featureType": 4},
        )
        self.copy_name = keys.license_copy_name(self.gpu_class)
        self.copier = LicenseCopier(kube.api, corner.controller_ns)
        self.copier.start()
        assert self.copier.synced.wait(30), "the copier did not finish its first listing"

    def stop(self) -> None:
        self.copier.stop()
        for namespace in (self.entitled, self.plain):
            unless(404, lambda namespace=namespace: self.core.delete_namespace(namespace))

    def copy(self, namespace: str) -> dict[str, Any] | None:
        try:
            found = self.core.read_namespaced_secret(self.copy_name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        body: dict[str, Any] = self.kube.api.sanitize_for_serialization(found)
        return body

    def where(self) -> set[str]:
        """Every namespace holding this class's copy."""
        selector = f"{keys.LABEL_LICENSE_CLASS}={self.gpu_class}"
        found = self.core.list_secret_for_all_namespaces(label_selector=selector).items
        return {s.metadata.namespace for s in found}

    def token(self, namespace: str) -> str | None:
        copy = self.copy(namespace)
        if copy is None:
            return None
        return base64.b64decode(copy["data"][keys.LICENSE_TOKEN_KEY]).decode()

    def wait_token(self, namespace: str, token: str | None, what: str) -> None:
        wait_for(lambda: self.token(namespace) == token, 15, what)

    def wait_controllers_copy(self, namespace: str, what: str) -> None:
        """Until the namespace holds the copier's own copy: the hoster's token, the
        copier's labels and its hash annotation (``rules.copy_problem`` finds nothing)."""
        data = (
            (keys.LICENSE_FEATURE_TYPE_KEY, _b64("4")),
            (TOKEN, _b64("token-1")),
        )
        wanted = rules.Copy(namespace, self.copy_name, self.gpu_class, data)
        seen: list[str | None] = []

        def ours() -> bool:
            found = self.copy(namespace)
            seen[:] = [rules.copy_problem(wanted, found) if found else "no copy"]
            return seen[0] is None

        try:
            wait_for(ours, 15, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: the Secret {self.copy_name} left: {seen}") from None

    def condition(self, gpu_class: str) -> dict[str, Any] | None:
        """The class's LicenseReady condition, as the copier wrote it."""
        obj = self.kube.custom.get_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, gpu_class
        )
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("type") == keys.CONDITION_LICENSE_READY:
                found: dict[str, Any] = cond
                return found
        return None

    def wait_condition(self, gpu_class: str, reason: keys.LicenseReason) -> dict[str, Any]:
        found: dict[str, Any] = wait_for(
            lambda: (c := self.condition(gpu_class)) and c["reason"] == reason.value and c,
            15,
            f"class {gpu_class}'s {keys.CONDITION_LICENSE_READY} condition {reason.value}",
        )
        return found


@pytest.fixture
def licences(kube: Kube, corner: Corner) -> Iterator[Licences]:
    made = Licences(kube, corner)
    try:
        yield made
    finally:
        made.stop()
    assert made.copier.failure is None, f"the copier failed: {made.copier.failure}"


def _entitled_namespaces(kube: Kube) -> set[str]:
    return {
        ns.metadata.name
        for ns in kube.core.list_namespace(
            label_selector=f"{keys.LABEL_VGPU_ENTITLEMENT}={keys.VGPU_ENTITLEMENT_VALUE}"
        ).items
        if ns.metadata.deletion_timestamp is None
    }


def test_license_copy_exists_exactly_in_namespaces_entitled_to_vgpu(
    kube: Kube, licences: Licences
) -> None:
    licences.wait_token(licences.entitled, "token-1", "the copy in the entitled namespace")
    copy = licences.copy(licences.entitled)
    assert copy is not None
    assert copy["metadata"]["labels"][keys.LABEL_MANAGED_BY] == keys.MANAGED_BY_CONTROLLER
    # Only the named key travels, beside the class's FeatureType: nothing else of the
    # hoster's Secret reaches a tenant.
    assert set(copy["data"]) == {keys.LICENSE_TOKEN_KEY, keys.LICENSE_FEATURE_TYPE_KEY}
    assert base64.b64decode(copy["data"][keys.LICENSE_FEATURE_TYPE_KEY]) == b"4"
    assert licences.copy(licences.plain) is None
    assert licences.copy(licences.corner.tenant) is None
    wait_for(lambda: licences.where() == _entitled_namespaces(kube), 15, "copies in entitled only")


def test_license_copy_follows_the_entitlement_label(kube: Kube, licences: Licences) -> None:
    licences.wait_token(licences.entitled, "token-1", "the first copy")
    kube.core.patch_namespace(licences.plain, {"metadata": {"labels": ENTITLED}})
    licences.wait_token(licences.plain, "token-1", "a copy once the namespace is entitled")
    kube.core.patch_namespace(
        licences.entitled, {"metadata": {"labels": {keys.LABEL_VGPU_ENTITLEMENT: "false"}}}
    )
    licences.wait_token(licences.entitled, None, "the copy gone with the entitlement")
    kube.core.patch_namespace(
        licences.plain, {"metadata": {"labels": {keys.LABEL_VGPU_ENTITLEMENT: None}}}
    )
    licences.wait_token(licences.plain, None, "the copy gone with the label")


def test_license_copies_follow_the_rotation_of_the_hosters_secret(
    kube: Kube, licences: Licences
) -> None:
    licences.wait_token(licences.entitled, "token-1", "the first copy")
    kube.core.patch_namespaced_secret(
        licences.secret,
        licences.corner.controller_ns,
        {"data": {TOKEN: _b64("token-2")}},
    )
    licences.wait_token(licences.entitled, "token-2", "the rotated token copied")
    # The key gone from the hoster's Secret takes the copies with it.
    kube.core.patch_namespaced_secret(
        licences.secret, licences.corner.controller_ns, {"data": {TOKEN: None}}
    )
    licences.wait_token(licences.entitled, None, "the copy gone with the token")


def test_license_copies_go_when_the_class_loses_its_license_or_is_deleted(
    kube: Kube, licences: Licences
) -> None:
    licences.wait_token(licences.entitled, "token-1", "the first copy")
    kube.custom.patch_cluster_custom_object(
        keys.GROUP,
        keys.VERSION,
        keys.PLURAL_CLASSES,
        licences.gpu_class,
        {"spec": {"license": None}},
    )
    wait_for(lambda: not licences.where(), 15, "every copy gone with the licence")
    kube.custom.patch_cluster_custom_object(
        keys.GROUP,
        keys.VERSION,
        keys.PLURAL_CLASSES,
        licences.gpu_class,
        {"spec": {"license": {"secretRef": {"name": licences.secret, "key": TOKEN}}}},
    )
    licences.wait_token(licences.entitled, "token-1", "the copy back with the licence")
    kube.custom.delete_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, licences.gpu_class
    )
    wait_for(lambda: not licences.where(), 15, "every copy gone with the class")


def test_license_copy_changed_by_someone_else_is_put_back(kube: Kube, licences: Licences) -> None:
    ns = licences.entitled
    licences.wait_token(ns, "token-1", "the first copy")
    kube.core.patch_namespaced_secret(
        licences.copy_name, ns, {"data": {keys.LICENSE_TOKEN_KEY: _b64("mine")}}
    )
    licences.wait_token(ns, "token-1", "the edited copy put back")
    kube.core.delete_namespaced_secret(licences.copy_name, ns)
    licences.wait_token(ns, "token-1", "the deleted copy put back")
    # Without the managed label it falls out of the copier's watch: it is taken back.
    kube.core.patch_namespaced_secret(
        licences.copy_name,
        ns,
        {"metadata": {"labels": {keys.LABEL_MANAGED_BY: None}}, "data": {"x": _b64("y")}},
    )

    def restored() -> bool:
        copy = licences.copy(ns)
        labels = (copy or {}).get("metadata", {}).get("labels") or {}
        return bool(
            copy
            and labels.get(keys.LABEL_MANAGED_BY) == keys.MANAGED_BY_CONTROLLER
            and set(copy["data"]) == {keys.LICENSE_TOKEN_KEY, keys.LICENSE_FEATURE_TYPE_KEY}
        )

    wait_for(restored, 15, "the unlabelled copy taken back")


def test_no_tenant_role_reads_the_hosters_token_secret(
    control_plane: Any, kube: Kube, licences: Licences
) -> None:
    """Tenants get the copy in their own namespace (that is what their VMs mount), never
    the hoster's Secret, whatever role they hold in their namespace."""
    licences.wait_token(licences.entitled, "token-1", "the first copy")
    rbac = client.RbacAuthorizationV1Api(kube.api)
    for role in ("admin", "edit", "view"):
        rbac.create_namespaced_role_binding(
            licences.entitled,
            {
                "metadata": {"name": f"tenant-{role}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": role}
                ],
            },
        )
    controller_ns = licences.corner.controller_ns
    for role in ("admin", "edit", "view"):
        # Bound for certain, so each 403 below is the role's answer, not a binding unseen.
        tenants.wait_granted(kube.api, role, "get", "pods", namespace=licences.entitled)
    for role in ("admin", "edit", "view"):
        api = control_plane.api_client()
        api.set_default_header("Impersonate-User", role)
        core = client.CoreV1Api(api)
        calls: list[tuple[Any, tuple[str, ...]]] = [
            (core.read_namespaced_secret, (licences.secret, controller_ns)),
            (core.list_namespaced_secret, (controller_ns,)),
            (core.list_secret_for_all_namespaces, ()),
        ]
        for call, args in calls:
            with pytest.raises(ApiException) as denied:
                call(*args)
            assert denied.value.status == 403, role
    admin = control_plane.api_client()
    admin.set_default_header("Impersonate-User", "admin")
    own = client.CoreV1Api(admin).read_namespaced_secret(licences.copy_name, licences.entitled)
    assert set(own.data) == {keys.LICENSE_TOKEN_KEY, keys.LICENSE_FEATURE_TYPE_KEY}


def test_a_class_naming_a_secret_not_marked_as_a_licence_token_gets_no_copy_and_says_why(
    kube: Kube, licences: Licences
) -> None:
    """The controller's namespace holds the webhook's TLS key too: a class naming it (by
    mistake, or by a hoster operator misled) must not hand it to every entitled tenant."""
    corner = licences.corner
    values = {"webhook": {"certificates": {"source": "generated"}}}
    (tls,) = [
        obj
        for obj in helm_template("certificates.yaml", corner.controller_ns, values)
        if obj["kind"] == "Secret"
    ]
    kube.core.create_namespaced_secret(corner.controller_ns, tls)
    careless = corner.gpu_class(
        "l40s-tls",
        mode="vgpu",
        resource=f"{corner.resource}_TLS",
        license={"secretRef": {"name": tls["metadata"]["name"], "key": "tls.key"}},
    )
    selector = f"{keys.LABEL_LICENSE_CLASS}={careless}"

    def taken() -> list[str]:
        found = kube.core.list_secret_for_all_namespaces(label_selector=selector).items
        return sorted(s.metadata.namespace for s in found)

    # The copier's answer to the class, whichever it is: a copy, or the condition. It writes
    # the condition after the copies of the same pass, so none comes later.
    wait_for(lambda: taken() or licences.condition(careless), 15, "the copier judging the class")
    assert not taken(), f"the chart's TLS key was copied to tenant namespaces {taken()}"
    cond = licences.wait_condition(careless, keys.LicenseReason.SECRET_NOT_MARKED)
    assert cond["status"] == "False"
    name = tls["metadata"]["name"]
    assert f"Secret {name} in the controller's namespace is not marked" in cond["message"]

    # The hoster's own token Secret, once unmarked, takes its copies away and says why.
    licences.wait_controllers_copy(licences.entitled, "the first copy")
    assert licences.wait_condition(licences.gpu_class, keys.LicenseReason.COPIED)["status"] == (
        "True"
    )
    secret_patch = {"metadata": {"labels": {keys.LABEL_LICENSE_TOKEN: None}}}
    kube.core.patch_namespaced_secret(licences.secret, corner.controller_ns, secret_patch)
    licences.wait_token(licences.entitled, None, "the copy gone with the mark")
    licences.wait_condition(licences.gpu_class, keys.LicenseReason.SECRET_NOT_MARKED)
    kube.core.patch_namespaced_secret(
        licences.secret, corner.controller_ns, {"metadata": {"labels": MARKED}}
    )
    licences.wait_controllers_copy(licences.entitled, "the copy back with the mark")
    licences.wait_condition(licences.gpu_class, keys.LicenseReason.COPIED)


def test_a_tenant_admins_own_secret_of_the_copys_name_is_replaced_by_the_controllers(
    kube: Kube, licences: Licences
) -> None:
    name = licences.copy_name
    # Made before the namespace is entitled, without the copier's labels: the copier does
    # not see it until it writes its own copy there, and then takes the name over.
    tenant = tenants.as_tenant_admin(kube.api, "tenant-b", [licences.plain]).core
    tenant.create_namespaced_secret(
        licences.plain, {"metadata": {"name": name}, "data": {TOKEN: _b64("mine")}}
    )
    kube.core.patch_namespace(licences.plain, {"metadata": {"labels": ENTITLED}})
    licences.wait_controllers_copy(licences.plain, "the tenant's own Secret replaced")

    # Over the controller's copy, with the copier's labels and a hash right for its data.
    licences.wait_controllers_copy(licences.entitled, "the first copy")
    owner = tenants.as_tenant_admin(kube.api, "tenant-a", [licences.entitled]).core
    fake = ((keys.LICENSE_FEATURE_TYPE_KEY, _b64("4")), (TOKEN, _b64("mine")))
    forged = rules.copy_body(rules.Copy(licences.entitled, name, licences.gpu_class, fake))
    owner.replace_namespaced_secret(name, licences.entitled, forged)
    licences.wait_controllers_copy(licences.entitled, "the tenant's forged copy replaced")


def test_a_tenant_admin_cannot_read_another_tenants_licence_copy(
    kube: Kube, licences: Licences
) -> None:
    licences.wait_controllers_copy(licences.entitled, "the copy")
    # The admin of a namespace with no entitlement, reaching for an entitled tenant's token.
    other = tenants.as_tenant_admin(kube.api, "tenant-b", [licences.plain]).core
    calls: list[tuple[Any, tuple[str, ...]]] = [
        (other.read_namespaced_secret, (licences.copy_name, licences.entitled)),
        (other.list_namespaced_secret, (licences.entitled,)),
        (other.list_secret_for_all_namespaces, ()),
    ]
    for call, args in calls:
        try:
            call(*args)
        except ApiException as exc:
            assert exc.status == 403, f"{call.__name__}{args}: {exc.status}"
            continue
        raise AssertionError(f"tenant-b read {call.__name__}{args}: another tenant's token")
