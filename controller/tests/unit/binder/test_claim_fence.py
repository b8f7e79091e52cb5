"""The fencing token of the binder's claim status writes: each names the term of the Lease
it was decided in, and is new on the claim it is written to, so the claim-fence policy can
refuse a late write of an overtaken leader and let a write that leaves the token alone pass.
(The policy itself, on the real API server: tests/integration/test_takeover_holds.py.)"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.claims import fenced
from cozystack_gpu.leader import LeaderElector, LeaseTiming, Term


def test_a_write_carries_its_term_and_the_version_it_was_built_on() -> None:
    body = {"metadata": {"resourceVersion": "41"}, "status": {"phase": "Bound"}}
    written = fenced(body, Term("r2", 7))
    assert written["status"][keys.CLAIM_STATUS_WRITER] == {
        "holder": "r2",
        "term": 7,
        "basedOn": "41",
    }
    assert written["status"]["phase"] == "Bound"
    assert keys.CLAIM_STATUS_WRITER not in body["status"], "the queued body is not changed"


def test_a_writer_with_no_term_stamps_nothing() -> None:
    body = {"metadata": {"resourceVersion": "41"}, "status": {"phase": "Bound"}}
    assert fenced(body, None) == body


@given(versions=st.lists(st.integers(min_value=1, max_value=10**9), min_size=2, unique=True))
def test_no_two_writes_of_one_term_on_distinct_versions_carry_the_same_token(
    versions: list[int],
) -> None:
    """A write is built on the claim's current version and the token there came from an
    earlier one: a write of an old term can never leave the token as it found it."""
    tokens = [
        repr(fenced({"metadata": {"resourceVersion": str(v)}}, Term("r1", 3))["status"])
        for v in versions
    ]
    assert len(set(tokens)) == len(tokens)


def test_unversioned_writes_still_carry_new_tokens() -> None:
    first = fenced({"status": {}}, Term("r1", 3))["status"][keys.CLAIM_STATUS_WRITER]
    second = fenced({"status": {}}, Term("r1", 3))["status"][keys.CLAIM_STATUS_WRITER]
    assert first != second


class _Leases:
    """The coordination API as the elector uses it, over one Lease in memory."""

    def __init__(self) -> None:
        self.spec: dict[str, Any] | None = None
        self.version = 0

    def read_namespaced_lease(self, name: str, namespace: str, **_kw: Any) -> client.V1Lease:
        if self.spec is None:
            raise ApiException(status=404)
        spec = client.V1LeaseSpec(
            holder_identity=self.spec.get("holderIdentity"),
            lease_duration_seconds=self.spec.get("leaseDurationSeconds"),
            renew_time=self.spec.get("renewTime"),
            lease_transitions=self.spec.get("leaseTransitions"),
        )
        meta = client.V1ObjectMeta(name=name, resource_version=str(self.version))
        return client.V1Lease(metadata=meta, spec=spec)

    def create_namespaced_lease(self, namespace: str, body: Any, **_kw: Any) -> None:
        self.spec = dict(body["spec"])
        self.version += 1

    def patch_namespaced_lease(self, name: str, namespace: str, body: Any, **_kw: Any) -> None:
        if body["metadata"]["resourceVersion"] != str(self.version):
            raise ApiException(status=409)
        assert self.spec is not None
        self.spec.update(body["spec"])
        self.version += 1


def _elector(leases: _Leases, identity: str, now: list[float]) -> LeaderElector:
    elector = LeaderElector(
        client.ApiClient(),
        namespace="ctl",
        name=keys.LEASE_NAME_BINDER,
        identity=identity,
        timing=LeaseTiming(lease_duration=3.0, renew_deadline=2.0, retry_period=0.5),
        clock=lambda: now[0],
    )
    elector._coordination = leases  # type: ignore[assignment]
    return elector


def test_each_holding_of_the_lease_is_a_term_of_its_own_and_a_renewal_keeps_it() -> None:
    leases, now = _Leases(), [100.0]
    r1, r2 = _elector(leases, "r1", now), _elector(leases, "r2", now)
    assert r1.term() is None, "a replica that never led has no term"
    r1._try_acquire_or_renew()
    assert r1.term() == Term("r1", 0)
    now[0] += 1.0
    r1._try_acquire_or_renew()  # renewed: the same term
    assert r1.term() == Term("r1", 0)
    r2._try_acquire_or_renew()  # sees a live lease: stands by
    assert r2.term() is None
    now[0] += 10.0  # r1 renews no more; r2 takes over once a whole lease passed unchanged
    r2._try_acquire_or_renew()
    now[0] += 4.0
    r2._try_acquire_or_renew()
    assert r2.term() == Term("r2", 1)
    assert leases.spec is not None and leases.spec["leaseTransitions"] == 1
    # r1 comes back and takes it over again: a new term, not its old one.
    now[0] += 10.0
    r1._try_acquire_or_renew()
    now[0] += 4.0
    r1._try_acquire_or_renew()
    assert r1.term() == Term("r1", 2)


def test_a_released_lease_taken_back_by_its_holder_is_a_new_term() -> None:
    leases, now = _Leases(), [100.0]
    r1 = _elector(leases, "r1", now)
    r1._try_acquire_or_renew()
    r1._leading = True
    r1._release()
    assert leases.spec is not None and leases.spec["holderIdentity"] == ""
    now[0] += 1.0
    r1._try_acquire_or_renew()
    assert r1.term() == Term("r1", 1)
