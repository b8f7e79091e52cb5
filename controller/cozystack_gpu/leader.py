"""Leader election on a coordination.k8s.io Lease, so exactly one replica binds.

kopf's peering is not leader election (replicas of equal priority all pause), so the binder
uses a Lease like client-go's leaderelection: a holder renews it every ``retry_period``; a
candidate takes it over only when it has seen no change of the record for a whole
``lease_duration`` (measured on its own monotonic clock, so clocks need not agree). The
holder counts itself leader only until ``renew_deadline`` after its last successful renew,
which is shorter than ``lease_duration``: it stops binding before anyone else may start.

A leader that cannot do its work must not keep the Lease: while it leads, the elector asks
``check`` every round, and an answer (a reason) makes it stop leading, hand the Lease back at
once and campaign no more; the reason stays in ``failure`` for the health probe. The same
happens when the election's own thread ends by an exception: a replica whose renewals
stopped must not go on binding until its deadline, nor leave the Lease to expire.

Each holding of the Lease is a term, named by its holder and ``leaseTransitions`` (counted up
at every change of holder, a release and a takeover of one's own included): ``term()`` is the
one this replica holds, the fencing token its writes carry (``Term``).
"""

from __future__ import annotations

import copy
import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseTiming:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "lease timing needs retry_period < renew_deadline < lease_duration, got "
                f"{self.retry_period} / {self.renew_deadline} / {self.lease_duration}"
            )


@dataclass(frozen=True)
class Term:
    """One holding of the Lease: who held it and the Lease's ``leaseTransitions`` then. No
    two terms share both: a takeover counts the transitions up, even back to the holder of
    an earlier term."""

    holder: str
    transitions: int


def _without_retries(api: client.ApiClient) -> client.ApiClient:
    """A client like ``api`` whose connection pool repeats no request: by default it
    repeats a GET whose read timed out three times, which would stretch a renewal to four
    times its timeout. A failed round is simply the next round's to try again."""
    configuration = copy.copy(api.configuration)
    configuration.retries = 0
    clone = client.ApiClient(configuration)
    clone.user_agent = api.user_agent
    return clone


def _micro_time(now: datetime.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Runs the election in its own thread; ``is_leader()`` is safe to call from any."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming = LeaseTiming(),
        on_started: Callable[[], None] = lambda: None,
        on_stopped: Callable[[], None] = lambda: None,
        check: Callable[[], str | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._coordination = client.CoordinationV1Api(_without_retries(api))
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._check = check
        self._clock = clock
        # A renewal that outlives the renew deadline is worthless: each request ends there.
        # It is not cut to the time left: a leader whose start took part of its validity
        # would fail every renewal. What it sends after the deadline is the binder's to
        # hold back (it asks is_leader() before every write).
        self._timeout = timing.renew_deadline
        # Why this elector gave up leading for good (None while it works).
        self.failure: str | None = None
        self._start_failure: str | None = None
        self.rounds = 0  # rounds of acquire-or-renew tried, whatever their answer
        self._valid_until = 0.0
        self._leading = False
        self._term: Term | None = None  # the holding of the Lease last acquired or renewed
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)

    # --- queries ---------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self._leading and self._clock() < self._valid_until

    def term(self) -> Term | None:
        """The term this replica holds or last held (None before it first led): a write
        decided in it carries it even when sent as leading ends, and is refused then."""
        return self._term

    def problem(self) -> str | None:
        """Why this elector no longer works although nobody stopped it (None while it does)."""
        if self.failure is not None:
            return self.failure
        started = self._thread.ident is not None
        if started and not self._thread.is_alive() and not self._stop.is_set():
            return "the leader election thread is not running"
        return None

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timing.renew_deadline)
        if self._leading:
            self._set_leading(False)
            if release:
                self._release()

    def _run(self) -> None:
        try:
            self._campaign()
        except BaseException as exc:  # the thread ends here: never while still leading
            self.failure = f"leader election thread died: {type(exc).__name__}: {exc}"
            log.critical("lease %s/%s: %s", self.namespace, self.name, self.failure, exc_info=True)
            self._resign()

    def _campaign(self) -> None:
        while not self._stop.is_set():
            if self._leading:
                reason = self._start_failure or self._checked()
                if reason is not None:
                    self.failure = reason
                    log.error(
                        "lease %s/%s: %s; stop leading, release the lease and campaign no more",
                        self.namespace,
                        self.name,
                        reason,
                    )
                    self._resign()
                    return
            valid_until = self._valid_until
            try:
                self._try_acquire_or_renew()
            except Exception:  # the election must survive API hiccups
                log.exception("lease %s/%s: acquire or renew failed", self.namespace, self.name)
            self.rounds += 1
            renewed = self._valid_until != valid_until
            expired = self._leading and self._clock() >= self._valid_until
            if expired and not renewed:
                log.warning(
                    "lease %s/%s: renew deadline passed; stop leading", self.namespace, self.name
                )
                self._set_leading(False)
            # A round that renewed but ended past the deadline (starting to lead took that
            # long: it runs in this thread) is followed by another at once; is_leader() says
            # no until then, so nothing is decided on the lapsed validity.
            self._stop.wait(0.0 if expired and renewed else self.timing.retry_period)

    def _checked(self) -> str | None:
        try:
            return self._check()
        except Exception as exc:  # a check that cannot tell counts as a failed one
            return f"health check raised {type(exc).__name__}: {exc}"

    def _resign(self) -> None:
        """Stop leading (the work stops first) and hand the lease back for a standby."""
        if self._leading:
            self._set_leading(False)
            self._release()

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        log.info(
            "lease %s/%s: %s", self.namespace, self.name, "leading" if leading else "not leading"
        )
        try:
            (self._on_started if leading else self._on_stopped)()
        except Exception as exc:
            log.exception(
                "lease %s/%s: %s failed", self.namespace, self.name, "start" if leading else "stop"
            )
            if leading:  # the next round resigns: a leader that could not start does no work
                self._start_failure = f"could not start leading: {type(exc).__name__}: {exc}"

    # --- the protocol ----------------------------------------------------------------

    def _try_acquire_or_renew(self) -> None:
        started = self._clock()
        now = datetime.datetime.now(datetime.UTC)
        try:
            lease = self._coordination.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._create(now, started)
            return
        spec = lease.spec
        record = (spec.holder_identity or "", str(spec.renew_time or ""))
        if record != self._observed:
            self._observed = record
            self._observed_at = started
        duration = float(spec.lease_duration_seconds or self.timing.lease_duration)
        held_by_other = bool(spec.holder_identity) and spec.holder_identity != self.identity
        if held_by_other and started < self._observed_at + duration:
            return  # someone else holds a live lease
        transitions = int(spec.lease_transitions or 0)
        body: dict[str, Any] = {
            "metadata": {"resourceVersion": lease.metadata.resource_version},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.timing.lease_duration),
                "renewTime": _micro_time(now),
            },
        }
        if spec.holder_identity != self.identity:
            transitions += 1
            body["spec"]["acquireTime"] = _micro_time(now)
            body["spec"]["leaseTransitions"] = transitions
        try:
            # A merge patch carrying resourceVersion is a compare-and-swap: of two
            # candidates taking over one expired lease, one gets 409.
            self._coordination.patch_namespaced_lease(
                self.name, self.namespace, body, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status == 409:
                return
            raise
        self._renewed(started, Term(self.identity, transitions))

    def _create(self, now: datetime.datetime, started: float) -> None:
        body = {
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.timing.lease_duration),
                "acquireTime": _micro_time(now),
                "renewTime": _micro_time(now),
                "leaseTransitions": 0,
            },
        }
        try:
            self._coordination.create_namespaced_lease(
                self.namespace, body, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status == 409:
                return
            raise
        self._renewed(started, Term(self.identity, 0))

    def _renewed(self, started: float, term: Term) -> None:
        # Counted from before the request was sent: the lease may have been written at once.
        self._term = term
        self._valid_until = started + self.timing.renew_deadline
        self._set_leading(True)

    def _release(self) -> None:
        """Hands the lease back so a standby takes over within one retry."""
        try:
            lease = self._coordination.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout
            )
            if lease.spec.holder_identity != self.identity:
                return
            self._coordination.patch_namespaced_lease(
                self.name,
                self.namespace,
                {
                    "metadata": {"resourceVersion": lease.metadata.resource_version},
                    "spec": {"holderIdentity": "", "leaseDurationSeconds": 1},
                },
                _request_timeout=self._timeout,
            )
            log.info("lease %s/%s: released", self.namespace, self.name)
        except ApiException as exc:
            log.warning("lease %s/%s: release failed: %s", self.namespace, self.name, exc.reason)
        except Exception as exc:  # unreachable server: the lease expires on its own
            log.warning("lease %s/%s: release failed: %s", self.namespace, self.name, exc)
