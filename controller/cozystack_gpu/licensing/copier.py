"""The leader's licence copier: watches, calls ``rules``, writes the copies.

It runs beside the binder in the replica holding the Lease, on its own thread and watches:
its objects (a few classes, the namespaces, a few Secrets) share nothing with the binder's
decisions, and a slow Secret write must never hold up a bind. Four feeds: the classes, the
namespaces, the Secrets of the controller's namespace (the hoster's tokens) and, across the
cluster, the Secrets carrying the managed label (the copies, so a copy someone edits or
deletes is seen at once and one left over from before a restart is still deleted).

After every batch of changes, and every ``RESYNC_S`` besides (a write that failed is tried
again then), it decides the whole plan again from what it has seen and writes it; a write's
answer is taken as the copy's state at once, so the echo of its own write plans nothing.
A copy's name is the product's (``gpu-license-<class>``): a Secret of that name that is not
a copy (no managed label, a tenant's own) is taken over. Each licensed class's LicenseReady
condition says whether its token is copied, or why its Secret is refused.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import cached_property

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.cluster.informer import (
    WRITE_TIMEOUT_S,
    Event,
    EventType,
    SharedInformers,
    Source,
    WatchedThread,
    Watcher,
    list_function,
)
from cozystack_gpu.cluster.list_calls import kind_path, path_list
from cozystack_gpu.licensing import rules
from cozystack_gpu.objects import MutableObj
from cozystack_gpu.objects.translate import object_key, resource_version

log = logging.getLogger(__name__)

Key = tuple[str, str]

RESYNC_S = 30.0
TICK_S = 0.5
MAX_BATCH = 5000  # events taken into one turn at most

CLASSES = keys.GPU_CLASS.kind
NAMESPACES = keys.NAMESPACE.kind
SOURCES = "LicenseSource"
COPIES = "LicenseCopy"
MANAGED_SELECTOR = f"{keys.LABEL_MANAGED_BY}={keys.MANAGED_BY_CONTROLLER}"


class LicenseCopier(Watcher):
    """Keeps the licence copies as ``rules.plan_copies`` says while started."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        *,
        is_leader: Callable[[], bool] = lambda: True,
        informers: SharedInformers | None = None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.is_leader = is_leader
        self.custom = client.CustomObjectsApi(api)
        self.synced = threading.Event()
        self.writes = 0
        self._raw: dict[str, dict[Key, MutableObj]] = {
            k: {} for k in (CLASSES, NAMESPACES, SOURCES, COPIES)
        }
        self._listed: set[str] = set()
        feeds = [
            Source(CLASSES, list_function(api, keys.GPU_CLASS)),
            Source(NAMESPACES, list_function(api, keys.NAMESPACE)),
            Source(SOURCES, path_list(api, kind_path(keys.SECRET, namespace))),
            Source(
                COPIES,
                path_list(api, kind_path(keys.SECRET)),
                {"label_selector": MANAGED_SELECTOR},
            ),
        ]
        # On the process's cache the classes and namespaces are the feed's own watches.
        self._threads = WatchedThread(api, feeds, self._run, "license-copier", informers)
        self._stop = self._threads.stop_event

    @cached_property
    def core(self) -> client.CoreV1Api:
        """Typed calls for the Secret writes, made at the first write: importing them costs
        a new leader 0.4 s of CPU its first bind need not wait for (``list_calls``)."""
        return client.CoreV1Api(self.api)

    # --- the loop --------------------------------------------------------------------

    def _run(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            batch = self._threads.drain(TICK_S, MAX_BATCH)
            for event in batch:
                self._take(event)
            if len(self._listed) < len(self._raw):
                continue
            self.synced.set()
            now = time.monotonic()
            if not batch and now - last < RESYNC_S:
                continue
            last = now
            if self.is_leader():
                self._reconcile()

    def _take(self, event: Event) -> None:
        store = self._raw[event.kind]
        if event.type is EventType.LISTED:
            store.clear()
            store.update((object_key(obj), obj) for obj in event.objects)
            self._listed.add(event.kind)
            return
        obj = event.obj or {}
        key = object_key(obj)
        known = store.get(key)
        if known is not None and resource_version(obj) < resource_version(known):
            return  # older than what a write of ours already answered
        if event.type is EventType.DELETED:
            store.pop(key, None)
        else:
            store[key] = obj

    # --- decide and write --------------------------------------------------------------

    def inputs(self) -> tuple[list[MutableObj], dict[str, dict[str, str]], dict[str, MutableObj]]:
        """The rules' inputs from what the watches saw. A namespace being deleted takes no
        copy (the API server refuses new objects there); its copies go with it."""
        classes = list(self._raw[CLASSES].values())
        namespaces = {
            name: dict((ns.get("metadata") or {}).get("labels") or {})
            for (_ns, name), ns in self._raw[NAMESPACES].items()
            if not (ns.get("metadata") or {}).get("deletionTimestamp")
        }
        sources = {name: secret for (_ns, name), secret in self._raw[SOURCES].items()}
        return classes, namespaces, sources

    def _reconcile(self) -> None:
        classes, namespaces, sources = self.inputs()
        desired = rules.desired_copies(classes, namespaces, sources)
        plan = rules.plan_copies(desired, self._raw[COPIES])
        for copy in (*plan.creates, *plan.updates):
            if not self.is_leader():
                return
            self._write(copy, exists=copy in plan.updates)
        for namespace, name in plan.deletes:
            if not self.is_leader():
                return
            self._delete(namespace, name)
        now = time.time()
        for klass in classes:
            patch = rules.class_condition_patch(klass, sources, now)
            if patch is not None and self.is_leader():
                self._report(klass, patch)

    def _report(self, klass: MutableObj, patch: MutableObj) -> None:
        """Write a class's LicenseReady condition; a 409 (another writer's condition came
        meanwhile) is written again from the watch's next version of the class."""
        name = str((klass.get("metadata") or {}).get("name", ""))
        try:
            written = self.custom.patch_cluster_custom_object_status(
                keys.GROUP,
                keys.VERSION,
                keys.PLURAL_CLASSES,
                name,
                patch,
                _request_timeout=WRITE_TIMEOUT_S,
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                log.warning(
                    "licence condition of class %s not written: %s %s; trying again within %.0f s",
                    name,
                    exc.status,
                    exc.reason,
                    RESYNC_S,
                )
            return
        self.writes += 1
        self._raw[CLASSES][("", name)] = written

    def _write(self, copy: rules.Copy, *, exists: bool) -> None:
        body = rules.copy_body(copy)
        try:
            try:
                written = self._replace(copy, body) if exists else self._create(copy, body)
            except ApiException as exc:
                # Created meanwhile (or a Secret of the copy's name that is not one): put
                # ours in its place; replaced but gone meanwhile: create it.
                if exc.status == 409 and not exists:
                    written = self._replace(copy, body)
                elif exc.status == 404 and exists:
                    written = self._create(copy, body)
                else:
                    raise
        except ApiException as exc:
            log.warning(
                "licence copy %s/%s not written: %s %s; trying again within %.0f s",
                copy.namespace,
                copy.name,
                exc.status,
                exc.reason,
                RESYNC_S,
            )
            return
        self.writes += 1
        self._raw[COPIES][(copy.namespace, copy.name)] = written

    def _create(self, copy: rules.Copy, body: MutableObj) -> MutableObj:
        created = self.core.create_namespaced_secret(
            copy.namespace, body, _request_timeout=WRITE_TIMEOUT_S
        )
        result: MutableObj = self.api.sanitize_for_serialization(created)
        return result

    def _replace(self, copy: rules.Copy, body: MutableObj) -> MutableObj:
        # An unconditional replace: the copy is the controller's alone, so whatever changed
        # it since it was read is overwritten.
        replaced = self.core.replace_namespaced_secret(
            copy.name, copy.namespace, body, _request_timeout=WRITE_TIMEOUT_S
        )
        result: MutableObj = self.api.sanitize_for_serialization(replaced)
        return result

    def _delete(self, namespace: str, name: str) -> None:
        try:
            self.core.delete_namespaced_secret(name, namespace, _request_timeout=WRITE_TIMEOUT_S)
        except ApiException as exc:
            if exc.status != 404:
                log.warning(
                    "licence copy %s/%s not deleted: %s %s; trying again within %.0f s",
                    namespace,
                    name,
                    exc.status,
                    exc.reason,
                    RESYNC_S,
                )
                return
        self.writes += 1
        self._raw[COPIES].pop((namespace, name), None)
