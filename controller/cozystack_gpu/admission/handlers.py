"""Every admission webhook of the controller, as kopf handlers; the work is elsewhere.

kopf serves handler ``id`` at URL path ``/<id>`` (CONTRACTS.md):

| path | object | operations |
|---|---|---|
| ``/validate-gpuclaim`` | GPUClaim | CREATE, UPDATE |
| ``/validate-gpureservation`` | GPUReservation | CREATE |
| ``/validate-gpuclass`` | GPUClass | CREATE, UPDATE |
| ``/mutate-gpuclaim`` | GPUClaim | CREATE (where no MutatingAdmissionPolicy serves) |
| ``/mutate-vmi`` | VirtualMachineInstance | CREATE |
| ``/mutate-pod`` | Pod | CREATE |

The webhook configurations (fail closed; the VMI and pod webhooks only for objects with the
reference label) are rendered by the chart, not managed by kopf. Importing this module
registers the handlers; ``start`` builds what they use and sets kopf's server.

Handlers are plain functions taking keyword arguments, so tests may call them directly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys, metrics
from cozystack_gpu.admission import pod_rules, vmi_dra, vmi_rules
from cozystack_gpu.admission.access import ApiAccess
from cozystack_gpu.admission.errors import Refused
from cozystack_gpu.admission.feed import SnapshotFeed
from cozystack_gpu.admission.handle_catalog import ClaimWebhook, ClassWebhook
from cozystack_gpu.admission.handle_pod import PodWebhook
from cozystack_gpu.admission.handle_vmi import VMIWebhook, admit_vm_template
from cozystack_gpu.admission.server import CertDirWebhookServer, NoWebhookServer
from cozystack_gpu.cluster.informer import SharedInformers
from cozystack_gpu.config import Config

log = logging.getLogger(__name__)

WEBHOOKS = (
    "validate-gpuclaim",
    "validate-gpureservation",
    "mutate-gpuclaim",
    "validate-gpuclass",
    "validate-vm",
    "mutate-vmi",
    "mutate-pod",
)
# Parallel API reads and writes of the webhooks (a VMI with four claims reads seven objects).
IO_WORKERS = 32


@dataclass
class Admission:
    """What the handlers use, kept in kopf's memo as ``memo.admission``."""

    feed: SnapshotFeed
    claims: ClaimWebhook
    classes: ClassWebhook
    vmis: VMIWebhook
    pods: PodWebhook
    pool: ThreadPoolExecutor
    # Set once the webhook server's port answers (``server.CertDirWebhookServer``).
    listening: threading.Event = field(default_factory=threading.Event)

    def stop(self) -> None:
        self.feed.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)


def build(
    api: client.ApiClient,
    config: Config,
    clock: Callable[[], float] = time.time,
    informers: SharedInformers | None = None,
    feed_after: Callable[[], bool] | None = None,
) -> Admission:
    feed = SnapshotFeed(api, config, clock=clock, informers=informers, build_after=feed_after)
    access = ApiAccess(api, config.namespace)
    pool = ThreadPoolExecutor(IO_WORKERS, thread_name_prefix="admission-io")
    return Admission(
        feed=feed,
        claims=ClaimWebhook(feed, access, clock, config.booking),
        classes=ClassWebhook(access, clock),
        vmis=VMIWebhook(access, pool, feed.largest_node, feed.gpu_names),
        pods=PodWebhook(access, pool),
        pool=pool,
    )


def start(
    api: client.ApiClient,
    config: Config,
    settings: kopf.OperatorSettings,
    memo: kopf.Memo,
    informers: SharedInformers | None = None,
    feed_after: Callable[[], bool] | None = None,
) -> Admission:
    """Start this replica's snapshot feed (on the process's cache, when given; its first
    build once ``feed_after`` says so) and give kopf its webhook server."""
    admission = build(api, config, informers=informers, feed_after=feed_after)
    metrics.start_at_zero(webhooks=WEBHOOKS)
    admission.feed.start()
    memo.admission = admission
    if config.webhook_port:
        settings.admission.server = CertDirWebhookServer(
            config.webhook_cert_dir,
            config.webhook_port,
            client_ca=config.webhook_client_ca or None,
            listening=admission.listening,
        )
    else:
        settings.admission.server = NoWebhookServer()
        admission.listening.set()  # no port to wait for
    # The chart renders the configurations: kopf must not create or patch them.
    settings.admission.managed = None
    # A line per admission request (aiohttp's access log, kopf's "succeeded") cost a tenth
    # of a VMI start's CPU in this process; refusals and failures are still logged.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    objects = logging.getLogger("kopf.objects")
    objects.setLevel(logging.WARNING)
    objects.addFilter(_refusals_are_not_errors)
    return admission


def _refusals_are_not_errors(record: logging.LogRecord) -> bool:
    """kopf logs a webhook's refusal ("failed permanently") at ERROR; a refused order over
    budget is the webhook working, not a fault a hoster should be paged for: INFO."""
    if record.levelno == logging.ERROR and "failed permanently" in record.getMessage():
        record.levelno, record.levelname = logging.INFO, "INFO"
    return True


@contextmanager
def _refusals(webhook: str) -> Iterator[None]:
    """``Refused`` and API failures become the admission answer; the webhooks fail closed,
    so an answer that could not be computed refuses, saying why. Each refusal is counted by
    its machine reason; an answer that could not be computed (5xx) also as an error, and so
    is a bug, which kopf answers as a 500."""
    try:
        yield
    except Refused as exc:
        metrics.ADMISSION_REFUSALS.labels(webhook, exc.reason).inc()
        if exc.code >= 500:
            metrics.ADMISSION_ERRORS.labels(webhook).inc()
            # kopf's own line of it is lowered to INFO with the tenants' refusals.
            log.warning("webhook %s could not answer: %s", webhook, exc.message)
        raise kopf.AdmissionError(exc.message, code=exc.code) from None
    except ApiException as exc:
        metrics.ADMISSION_ERRORS.labels(webhook).inc()
        log.warning(
            "webhook %s could not answer: the API server answered %s %s",
            webhook,
            exc.status,
            exc.reason,
        )
        raise kopf.AdmissionError(
            f"GPU admission could not complete: the API server answered {exc.status} "
            f"{exc.reason}; try again",
            code=500,
        ) from None
    except kopf.AdmissionError:
        raise
    except Exception:
        metrics.ADMISSION_ERRORS.labels(webhook).inc()
        raise


def _admission(memo: kopf.Memo) -> Admission:
    admission: Admission | None = memo.get("admission")
    if admission is None:
        raise kopf.AdmissionError("GPU admission is starting; try again", code=503)
    return admission


@kopf.on.validate(
    keys.GROUP, keys.VERSION, keys.PLURAL_CLAIMS, id="validate-gpuclaim",
    operations=["CREATE", "UPDATE"],
)  # fmt: skip
def validate_gpuclaim(
    body: kopf.Body,
    warnings: list[str],
    memo: kopf.Memo,
    operation: str | None = None,
    old: kopf.Body | None = None,
    **_: Any,
) -> None:
    """Budget and capacity at create time (dry runs alike: nothing is written); the spec
    never changes afterwards."""
    admission = _admission(memo)
    with _refusals("validate-gpuclaim"):
        if operation == "CREATE":
            warnings.extend(admission.claims.admit_create(body))
        elif operation == "UPDATE" and old is not None:
            admission.claims.admit_update(old, body)


@kopf.on.validate(
    keys.GROUP, keys.VERSION, keys.PLURAL_RESERVATIONS, id="validate-gpureservation",
    operations=["CREATE"],
)  # fmt: skip
def validate_gpureservation(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A window is booked at create time (dry runs alike: nothing is written): refused
    when capacity or a budget is short in it, naming the earliest window that fits. The
    spec never changes afterwards (the CRD's rules)."""
    admission = _admission(memo)
    with _refusals("validate-gpureservation"):
        admission.claims.admit_reservation(body)


@kopf.on.mutate(
    keys.GROUP, keys.VERSION, keys.PLURAL_CLAIMS, id="mutate-gpuclaim",
    operations=["CREATE"],
)  # fmt: skip
def mutate_gpuclaim(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """The claim-protection finalizer on a new claim, where the API server has no
    MutatingAdmissionPolicy to put it on (the chart renders one or the other). Reads
    nothing: it answers before the replica has synced."""
    current = list(body.get("metadata", {}).get("finalizers") or [])
    if keys.FINALIZER_CLAIM not in current:
        patch.metadata["finalizers"] = [*current, keys.FINALIZER_CLAIM]


@kopf.on.validate(
    keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, id="validate-gpuclass",
    operations=["CREATE", "UPDATE"],
)  # fmt: skip
def validate_gpuclass(body: kopf.Body, memo: kopf.Memo, dryrun: bool = False, **_: Any) -> None:
    """Two classes share a resource name only with node selectors that do not overlap."""
    admission = _admission(memo)
    with _refusals("validate-gpuclass"):
        admission.classes.admit(body, dry_run=dryrun)


@kopf.on.mutate(
    keys.VMI.group, keys.VMI.version, keys.VMI.plural, id="mutate-vmi",
    operations=["CREATE"],
)  # fmt: skip
def mutate_vmi(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Resolve the VMI's claims, add one gpus entry per unit and, for a licensed vGPU
    class, the licence disk. Nothing is written: the binder attaches the claims once the
    VMI is stored."""
    admission = _admission(memo)
    with _refusals("mutate-vmi"):
        admitted = admission.vmis.admit(dict(body))

    def mutate(raw: Any) -> None:
        vmi_rules.set_gpus(cast(dict[str, Any], raw), admitted.gpus)
        vmi_dra.set_resource_claims(cast(dict[str, Any], raw), admitted.resource_claims)
        vmi_rules.set_license(cast(dict[str, Any], raw), admitted.license_copy)

    patch.fns.append(mutate)


@kopf.on.validate(
    keys.VM.group, keys.VM.version, keys.VM.plural, id="validate-vm",
    operations=["CREATE", "UPDATE"],
)  # fmt: skip
def validate_vm(body: kopf.Body, **_: Any) -> None:
    """A VM whose template's claims annotation its VMIs' webhook would refuse is refused
    now, with that message. Reads nothing: it answers before the replica has synced."""
    with _refusals("validate-vm"):
        admit_vm_template(dict(body))


@kopf.on.mutate("", "v1", "pods", id="mutate-pod", operations=["CREATE"])
def mutate_pod(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """The scheduling gate and the classes' tolerations on a VMI's launcher pod."""
    admission = _admission(memo)
    with _refusals("mutate-pod"):
        change = admission.pods.admit(dict(body))
    if change:
        patch.fns.append(lambda raw: pod_rules.apply(cast(dict[str, Any], raw), change))


def not_ready(admission: Admission | None) -> str | None:
    """Why this replica must stay out of the webhook Service, or None once it can judge
    orders and VM starts (its readiness, served on ``/readyz``)."""
    if admission is None:
        return "the admission webhooks are starting"
    feed = admission.feed
    if feed.failure is not None:
        return f"the admission snapshot feed stopped ({feed.failure})"
    dead = feed.dead_threads()
    if dead:
        return f"admission snapshot feed stopped: {', '.join(dead)}"
    if not feed.synced.is_set():
        return "this replica has not finished reading the cluster (its first listing)"
    if not admission.listening.is_set():
        return (
            "the admission webhooks' server is not listening yet (starting, or waiting for "
            "its key pair in the webhook certificate directory)"
        )
    return None


@kopf.on.probe(id="admission")
def admission_probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Fails /healthz when this replica's snapshot feed died: its claim webhook would
    refuse every order."""
    admission: Admission | None = memo.get("admission")
    if admission is None:
        return {"synced": False}
    dead = admission.feed.dead_threads()
    if dead:
        raise kopf.PermanentError(f"admission snapshot feed stopped: {', '.join(dead)}")
    return {"synced": admission.feed.synced.is_set()}
