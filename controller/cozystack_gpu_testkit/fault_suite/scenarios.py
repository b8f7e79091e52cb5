"""The fault suite's scenarios, each on a ``Run`` of its own: kube-apiserver restarted,
etcd restarted with watches expiring, the leader partitioned, SIGKILL at random moments, a
slow API server, the admission webhooks down; and the bursts they inject faults into."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit import faults
from cozystack_gpu_testkit.fault_suite.audit import ClaimWrite, claim_writes, most_at_once
from cozystack_gpu_testkit.fault_suite.run import LEASE_S, Result, Run
from cozystack_gpu_testkit.fault_suite.webhooks import Service, WebhookSetup
from cozystack_gpu_testkit.load import Load, LoadSettings
from cozystack_gpu_testkit.objects import wait_for
from cozystack_gpu_testkit.proxy import Proxy

log = logging.getLogger(__name__)

LATE_S = 5.0  # a partition's held requests reach the server within this of the heal


@contextmanager
def bursting(load: Load, orders: int) -> Iterator[threading.Thread]:
    """Sends a burst of orders in the background for the body of the ``with``."""
    thread = threading.Thread(target=load.burst, args=(orders,), name="burst", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        thread.join(300)


def mid_burst(load: Load, accepted_before: int, orders: int, timeout: float = 120.0) -> None:
    """Until a third of a burst has been accepted."""
    wait_for(
        lambda: load.counts.orders_accepted >= accepted_before + orders // 3,
        timeout,
        "a third of the burst accepted",
    )


def restarts_mid_burst(
    run: Run, component: str, restarts: int, down_s: float, burst: int, bound_s: float
) -> tuple[list[float], list[faults.Outage]]:
    """``component`` killed a third into each of ``restarts`` bursts and started again
    ``down_s`` later: the seconds until healthy after each, and each outage."""
    load = run.running_load
    healthy: list[float] = []
    outages: list[faults.Outage] = []
    for _restart in range(restarts):
        before = load.counts.orders_accepted
        with bursting(load, burst):
            mid_burst(load, before, burst)
            outages.append(faults.restart(run.plane, component, down_s=down_s))
            healthy.append(run.wait_healthy(time.monotonic(), 2 * bound_s))
    return healthy, outages


# --- 1. kube-apiserver restarted --------------------------------------------------------


def apiserver_restarts(
    workdir: Path, *, restarts: int = 1, down_s: float = 3.0, burst: int = 200
) -> Result:
    """kube-apiserver killed and started again (same etcd) in the middle of bursts."""
    bound_s = 45.0
    with Run("apiserver", workdir) as run:
        run.running_load.start()
        with run.checker.watching():
            healthy, outages = restarts_mid_burst(
                run, faults.APISERVER, restarts, down_s, burst, bound_s
            )
        down = max(o.down_s + o.ready_s for o in outages)
        return run.finish(
            "kube-apiserver restarted mid-burst",
            healthy,
            bound_s,
            faults_injected=restarts,
            figures={"API down s": round(down, 1)},
        )


# --- 2. etcd restarted; watches expire ----------------------------------------------------


@contextmanager
def compacting(run: Run, every: float = 0.2) -> Iterator[None]:
    """A write and a compaction of etcd every ``every`` seconds while the block runs: a
    watch that starts from a listing older than the last compaction gets 410 Gone."""
    done = threading.Event()
    namespace = f"compactor-{run.name}"
    core = client.CoreV1Api(run.api)
    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except ApiException as exc:
        if exc.status != 409:
            raise

    def churn() -> None:
        n = 0
        while not done.wait(every):
            n += 1
            try:
                core.create_namespaced_config_map(
                    namespace, {"metadata": {"name": f"tick-{n}"}}, _request_timeout=(5, 10)
                )
                faults.compact(run.plane)
            except Exception as exc:  # the plane is busy or away: next round
                log.debug("compaction round skipped: %s", exc)

    thread = threading.Thread(target=churn, name="compactor", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(30)


@contextmanager
def all_slowed(run: Run, delay: float) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for proxy in run.proxies.values():
            stack.enter_context(proxy.slowed(delay))
        yield


EXPIRED = "expired; listing again"
BROKEN = "broke; retrying"


def etcd_restarts(
    workdir: Path,
    *,
    restarts: int = 1,
    down_s: float = 3.0,
    burst: int = 200,
    expiries: int = 1,
) -> Result:
    """etcd killed and started again mid-burst; then the replicas' connections reset while
    etcd is compacted under them, so their watches start too old (410 Gone). The plane
    runs without a watch cache, so every watch is etcd's."""
    bound_s = 45.0
    with Run("etcd", workdir, proxied=True, apiserver_args=("--watch-cache=false",)) as run:
        load = run.running_load.start()
        with run.checker.watching():
            healthy, _outages = restarts_mid_burst(
                run, faults.ETCD, restarts, down_s, burst, bound_s
            )
            for _expiry in range(expiries):
                seen = run.log_lines(EXPIRED)
                # A watch starts a listing's round trip after it; compacting more often
                # than that makes it start too old.
                with bursting(load, burst // 2), compacting(run), all_slowed(run, 0.3):

                    def expired(seen: int = seen) -> bool:
                        return run.log_lines(EXPIRED) > seen

                    # A reset whose new watches happened to start in time expires nothing:
                    # reset again until one does.
                    deadline = time.monotonic() + 60
                    while True:
                        for proxy in run.proxies.values():
                            proxy.reset()
                        try:
                            wait_for(expired, 8, "a watch expired")
                            break
                        except AssertionError:
                            if time.monotonic() > deadline:
                                raise
                    reset_at = time.monotonic()
                healthy.append(run.wait_healthy(reset_at, 2 * bound_s))
        return run.finish(
            "etcd restarted mid-burst; watches expired (410)",
            healthy,
            bound_s,
            faults_injected=restarts + expiries,
            figures={"410s": run.log_lines(EXPIRED), "broken streams": run.log_lines(BROKEN)},
        )


# --- 3. the leader partitioned -------------------------------------------------------------


def partition(workdir: Path, *, cuts: int = 1, hold_s: float = 8.0, burst: int = 200) -> Result:
    """The leader's connection to the API server blocked (held, not closed) mid-burst: it
    stops binding before its Lease can move, the other replica takes over and binds, and
    when the partition heals the old leader's held writes arrive late: each must be refused,
    by its resourceVersion (409) on a claim written since, else by the claim fence (403)."""
    bound_s = LEASE_S + 17.0
    with Run("partition", workdir, proxied=True) as run:
        load = run.running_load.start()
        healthy: list[float] = []
        cuts_at: list[tuple[str, str, float, float]] = []  # old, new, cut, heal (epoch)
        takeovers: list[float] = []
        with run.checker.watching():
            for _cut in range(cuts):
                old = wait_for(run.holder, 30, "a leader")
                new = next(name for name in run.replicas if name != old)
                proxy = run.proxies[old]
                before = load.counts.orders_accepted
                with bursting(load, burst):
                    # Latency keeps the leader's writes on the wire: it is cut while some
                    # (several KiB of requests) are on their way.
                    with proxy.slowed(0.2):
                        mid_burst(load, before, burst)

                        def on_the_way(proxy: Proxy = proxy) -> bool:
                            return proxy.requests_waiting() > 4096

                        wait_for(on_the_way, 60, "writes on the way")
                        cut_at, cut_wall = time.monotonic(), time.time()
                        proxy.cut()

                    def leads(new: str = new) -> bool:
                        return run.holder() == new

                    wait_for(leads, LEASE_S + 15, f"{new} leading")
                    takeovers.append(time.monotonic() - cut_at)
                    healthy.append(run.wait_healthy(cut_at, 2 * bound_s))
                    time.sleep(max(0.0, cut_at + hold_s - time.monotonic()))
                    heal_wall = time.time()
                    proxy.heal()
                    cuts_at.append((old, new, cut_wall, heal_wall))
                time.sleep(3.0)  # the late writes land
        writes = claim_writes(run.audit_log)
        late, accepted = late_writes(run, writes, cuts_at)
        result = run.finish(
            "leader partitioned mid-burst",
            healthy,
            bound_s,
            faults_injected=cuts,
            figures={"take-over s": round(max(takeovers), 1), **late},
        )
        result.violations += accepted
        return result


def late_writes(
    run: Run, writes: Sequence[ClaimWrite], cuts: Sequence[tuple[str, str, float, float]]
) -> tuple[dict[str, int], list[str]]:
    """The old leaders' claim writes the API server received after their partition began
    (they were held until it healed): how many, how many were refused with 409 (the claim
    changed since), 403 (the claim fence: a term not the Lease's) and 404, and each that
    was accepted (must be none: the new leader had taken the Lease over by then)."""
    figures = {"late writes": 0, "refused 409": 0, "fenced 403": 0, "404 (claim gone)": 0}
    accepted: list[str] = []
    for old, new, cut_wall, heal_wall in cuts:
        old_ip = run.source_ip(old)
        # The audit log stamps requests when the server has read them: a held request is
        # read at the heal, seconds after the cut. Until the next cut the old leader is a
        # standby and sends no claim write of its own, so anything of it in this window
        # came late (or from a replica that does not lead, which is as wrong).
        for write in writes:
            if write.source != old_ip or not cut_wall + 0.5 <= write.received <= heal_wall + LATE_S:
                continue
            figures["late writes"] += 1
            figures["refused 409"] += write.code == 409
            figures["fenced 403"] += write.code == 403
            figures["404 (claim gone)"] += write.code == 404
            if 200 <= write.code < 300:
                accepted.append(
                    f"late write of {old} to claim {write.claim} accepted ({write.code}) after "
                    f"{new} had taken the Lease over"
                )
    return figures, accepted


# --- 4. SIGKILL at random moments --------------------------------------------------------


def kills(
    workdir: Path,
    *,
    count: int = 4,
    gap_s: tuple[float, float] = (1.0, 4.0),
    burst: int = 80,
    seed: int = 14,
) -> Result:
    """SIGKILL of a replica (the leader seven times in ten) at random moments of a long
    burst, each restarted after a random pause; the rules are checked right after every
    kill, and after every leader kill the time until a healthy leader binds is measured."""
    bound_s = LEASE_S + 22.0
    rng = random.Random(seed)
    with Run("kills", workdir) as run:
        load = run.running_load.start()
        healthy: list[float] = []
        killed_leaders = 0
        burster: threading.Thread | None = None
        with run.checker.watching():
            for _kill in range(count):
                idle = burster is None or not burster.is_alive()
                if idle and load.live_orders() < load.settings.max_live_orders:
                    burster = threading.Thread(target=load.burst, args=(burst,), daemon=True)
                    burster.start()
                time.sleep(rng.uniform(*gap_s))
                holder = run.holder()
                others = [name for name in run.replicas if name != holder]
                victim = holder if holder and rng.random() < 0.7 else rng.choice(others)
                run.replicas[victim].kill()
                killed_at = time.monotonic()
                try:
                    run.checker.check()  # every rule, right after the kill
                except Exception as exc:  # the background looks go on
                    log.warning("look after a kill failed: %s", exc)
                time.sleep(rng.uniform(0.0, 1.0))
                run.replicas[victim].restart()
                if victim == holder:
                    killed_leaders += 1
                    healthy.append(run.wait_healthy(killed_at, 2 * bound_s))
            if burster is not None:
                burster.join(300)
        return run.finish(
            "SIGKILL at random moments",
            healthy,
            bound_s,
            faults_injected=count,
            kills=count,
            figures={"leaders killed": killed_leaders},
        )


# --- 5. a slow API server ----------------------------------------------------------------


def slow_api(
    workdir: Path, *, delay: float = 0.15, span_s: float = 20.0, burst: int = 300
) -> Result:
    """Every chunk between the replicas and the API server delayed by ``delay`` seconds
    (each way) through a burst: the binder keeps deciding, with no more claim writes in
    flight than its write workers, and its memory stays flat."""
    bound_s = 30.0
    workers = 8
    with Run("slow", workdir, proxied=True, replica_args=("--write-workers", str(workers))) as run:
        load = run.running_load.start()
        leader = wait_for(run.holder, 30, "a leader")
        replica = run.replicas[leader]
        rss: list[int] = []
        healthy: list[float] = []
        with run.checker.watching(), all_slowed(run, delay):
            since_wall, since = time.time(), time.monotonic()
            before = load.counts.orders_accepted
            with bursting(load, burst):
                while time.monotonic() - since < span_s:
                    rss.append(replica.rss_bytes())
                    time.sleep(0.5)
                healthy.append(run.wait_healthy(time.monotonic(), 2 * bound_s))
            until_wall = time.time()
        slow_writes = [
            w
            for w in claim_writes(run.audit_log)
            if w.source == run.source_ip(leader) and since_wall <= w.received <= until_wall
        ]
        at_once = most_at_once(slow_writes)
        result = run.finish(
            "slow API server",
            healthy,
            bound_s,
            faults_injected=1,
            figures={
                "delay s": delay,
                "claim writes": len(slow_writes),
                "most in flight": at_once,
                "RSS MiB first/peak": f"{rss[0] / 2**20:.0f}/{max(rss) / 2**20:.0f}",
                "orders sent": load.counts.orders_accepted - before,
            },
        )
        if at_once > workers:
            result.violations.append(f"{at_once} claim writes in flight, above {workers} workers")
        if not slow_writes:
            result.violations.append("no claim write reached the server while it was slow")
        result.figures["RSS growth MiB"] = round((max(rss) - rss[0]) / 2**20, 1)
        return result


# --- 6. the admission webhooks down ------------------------------------------------------


def _vmi(name: str, claims: list[str] | None) -> dict[str, Any]:
    labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE} if claims is not None else {}
    notes = {keys.ANNOTATION_CLAIMS: json.dumps({"claims": claims})} if claims is not None else {}
    return {
        "apiVersion": keys.VMI.api_version,
        "kind": keys.VMI.kind,
        "metadata": {"name": name, "labels": labels, "annotations": notes},
        "spec": {"domain": {"devices": {}, "memory": {"guest": "1Gi"}}},
    }


def _pod(name: str, labelled: bool) -> dict[str, Any]:
    labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE} if labelled else {}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]},
    }


def outage_answers(run: Run, n: int) -> list[str]:
    """With no webhook endpoint: VMIs and pods that use claims are refused, and plain ones
    admitted (then removed). Returns what broke that rule (empty when it held)."""
    custom, core = client.CustomObjectsApi(run.api), client.CoreV1Api(run.api)
    tenant = run.world.tenants[-1]
    wrong: list[str] = []

    def vmi(body: dict[str, Any]) -> Any:
        return custom.create_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, tenant, keys.VMI.plural, body
        )

    def pod(body: dict[str, Any]) -> Any:
        return core.create_namespaced_pod(tenant, body)

    for what, create, body, admitted in (
        ("VMI with claims", vmi, _vmi(f"down-{n}", ["o00001"]), False),
        ("pod with claims", pod, _pod(f"down-{n}", True), False),
        ("plain VMI", vmi, _vmi(f"plain-{n}", None), True),
        ("plain pod", pod, _pod(f"plain-{n}", False), True),
    ):
        try:
            create(body)
        except ApiException as exc:
            message = str(json.loads(exc.body or "{}").get("message", ""))
            if admitted or "failed calling webhook" not in message:
                wrong.append(f"{what}: {exc.status} {message}")
            continue
        if not admitted:
            wrong.append(f"{what} admitted with no webhook endpoint")
    core.delete_namespaced_pod(f"plain-{n}", tenant, grace_period_seconds=0)
    custom.delete_namespaced_custom_object(
        keys.VMI.group, keys.VMI.version, tenant, keys.VMI.plural, f"plain-{n}"
    )
    return wrong


def webhooks_down(
    workdir: Path, setup: WebhookSetup, *, outages: int = 1, down_s: float = 8.0
) -> Result:
    """The webhooks' endpoint gone (its Service has no endpoint: connections refused) under
    load: VMIs, launcher pods and orders that use claims are refused (fail closed), plain
    VMIs and pods admitted; once the endpoint returns, VM starts resume by themselves
    (the load retries as KubeVirt would, nobody steps in). Time to healthy: from the return
    until a VM started after it runs and a canary order is Bound."""
    bound_s = 30.0
    settings = LoadSettings(webhooks=True)
    with Run("webhooks", workdir, load=settings, webhooks=True) as run:
        wait_for(lambda: run.webhook_serving("r1"), 60, "r1's webhook server")
        service = Service(run, "r1")
        objects = setup.configurations(service)
        setup.install(run.api, objects)
        try:
            load = run.running_load.start()
            load.wait_running(4, 90)
            healthy: list[float] = []
            wrong: list[str] = []
            with run.checker.watching():
                for n in range(outages):
                    service.down()
                    time.sleep(down_s / 2)
                    wrong += outage_answers(run, n)
                    time.sleep(down_s / 2)
                    started = load.counts.vms_started
                    service.up()
                    back = time.monotonic()
                    load.wait_running(started + 1, 2 * bound_s)
                    healthy.append(max(time.monotonic() - back, run.wait_healthy(back, bound_s)))
                    load.wait_running(started + 2, 2 * bound_s)
            result = run.finish(
                "admission webhooks down",
                healthy,
                bound_s,
                faults_injected=outages,
                figures={
                    "VM starts": load.counts.vms_started,
                    "orders refused at create": load.counts.orders_refused,
                },
            )
            result.violations += wrong
            result.violations += [
                f"a refusal without a message: {m!r}" for m in load.refusal_messages if not m
            ]
            return result
        finally:
            setup.remove(run.api, objects)
            service.down()
