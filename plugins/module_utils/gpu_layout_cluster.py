# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A node layout change as the cluster sees it: what it does to claims, and the drain.

The host part (``gpu_layout.py``) knows the GPUs; this part knows the claims. It runs on the
Ansible controller, in the ``gpu_node_layout`` action plugin, where the kubeconfig is (the
``node_labels`` role and the GPUClass modules talk to the API from there too).

**One model.** The consequences come from the controller's own code, not a copy of its
rules: ``cozystack_gpu.layout_preview`` judges a change with the binder's cluster view, its
placement model and its settings' defaults. It is pure Python and ships in this collection's
``controller/`` directory, which :func:`_controller_package` puts on ``sys.path`` before it
is imported; the model needs Python 3.11, as the controller does, which is why it is not
linked into ``module_utils`` for the GPU hosts (whose Python may be older, and which hold no
kubeconfig). The names this part shares with the controller (labels, the claims' API) come
from ``gpu_keys``, the controller's ``keys.py`` linked here.

:func:`consequences` takes every object the binder watches, the host part's report of each
function before and after, and the labels the host will earn; it answers which classes lose
or gain units on the node, which holds the change pushes off it, where the drain moves the
node's unattached sets (the binder's own pass over the cluster with the node pending), which
go ``Lost`` for lack of room, and which claims are attached to a running VMI.
:func:`wait_for_drain` and :func:`set_layout_state` are the drain's two API parts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gpu_keys
    import gpu_node_labels
else:
    from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_keys, gpu_node_labels

__all__ = [
    "CONTROLLER_DIR",
    "DrainTimeout",
    "Unavailable",
    "after_labels",
    "attached_on",
    "consequences",
    "read_cluster",
    "render",
    "set_layout_state",
    "unattached_on",
    "wait_for_drain",
]

# The collection ships the controller package beside plugins/ (see galaxy.yml).
CONTROLLER_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "controller"
)

Obj = dict[str, Any]


class Unavailable(Exception):
    """The cluster part cannot run here; the message says why and what would fix it."""


class DrainTimeout(Exception):
    """The binder did not move the node's unattached claims away in time."""

    def __init__(self, message: str, left: Sequence[str]) -> None:
        super().__init__(message)
        self.left = list(left)


@contextmanager
def _controller_package() -> Iterator[None]:
    """Imports of ``cozystack_gpu`` inside the block come from this collection's controller/
    (the version the module was written against); a ``cozystack_gpu`` already imported in
    this process is used as it is. A failed import is :class:`Unavailable`, saying why.

    Imported here, by name, never at the top: the host part of the module never needs them,
    and ansible-test imports module_utils with nothing beside the collection.
    """
    if "cozystack_gpu" not in sys.modules and os.path.isdir(
        os.path.join(CONTROLLER_DIR, "cozystack_gpu")
    ):
        sys.path.insert(0, CONTROLLER_DIR)
    try:
        yield
    except (ImportError, SyntaxError) as exc:
        raise Unavailable(
            f"the controller's placement model cannot be imported ({exc}); it needs Python"
            " 3.11 and the kubernetes client on the Ansible controller, and this"
            f" collection's controller/ directory ({CONTROLLER_DIR})"
        ) from None


# --- reading -------------------------------------------------------------------------------


def read_cluster(api_client: Any) -> dict[str, list[Obj]]:
    """Every object the binder watches, by kind, as the API returns them (a kind whose CRD
    is not installed, such as KubeVirt's on a cluster without it, is empty)."""
    with _controller_package():
        # The listing needs the kubernetes client: without it, this is Unavailable too.
        import cozystack_gpu.cluster.informer  # noqa: F401
        from cozystack_gpu import layout_preview
    return layout_preview.read_cluster(api_client)


# --- the consequences ----------------------------------------------------------------------


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _key(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def after_labels(
    current: Mapping[str, str], gpu_labels: Mapping[str, str], layout_name: str | None
) -> dict[str, str]:
    """The Node's labels once the layout is applied: the GPU labels the host then earns,
    its layout name and state ``applied``; other labels as they are."""
    labels = {k: v for k, v in current.items() if not gpu_node_labels.is_gpu_label(k)}
    labels.update(gpu_labels)
    labels[gpu_keys.LABEL_NODE_LAYOUT_STATE] = gpu_keys.LayoutState.APPLIED.value
    if layout_name:
        labels[gpu_keys.LABEL_NODE_LAYOUT] = gpu_keys.node_label_name(layout_name)
    return labels


def consequences(
    objects: Mapping[str, Sequence[Obj]],
    node_name: str,
    functions: Sequence[Mapping[str, Any]],
    gpu_labels: Mapping[str, str],
    layout_name: str | None,
    now: float,
    unforeseen: Sequence[str] = (),
) -> dict[str, Any]:
    """What applying the layout does to the claims of the cluster ``objects`` describe.

    ``functions`` and ``gpu_labels`` are the host part's report (``gpu_node_layout``'s
    ``functions`` and ``node_labels``); the answer is the module's ``holds``, as
    ``cozystack_gpu.layout_preview.consequences`` documents it. Raises :class:`Unavailable`
    when the controller's model cannot be imported here or the cluster has no such Node.
    """
    with _controller_package():
        from cozystack_gpu import layout_preview
    nodes = {_name(n): n for n in objects.get("Node", ())}
    node = nodes.get(node_name)
    if node is None:
        raise Unavailable(
            f"there is no Node named {node_name} in the cluster; set node_name to the name"
            " kubelet registered for this host"
        )
    labels = after_labels(_labels(node), gpu_labels, layout_name)
    return layout_preview.consequences(objects, node_name, functions, labels, now, unforeseen)


# --- rendering -----------------------------------------------------------------------------


def _devices_text(devices: Mapping[str, int]) -> str:
    if not devices:
        return "nothing"
    return ", ".join(f"{n} x{u}" if u != 1 else n for n, u in sorted(devices.items()))


def render(holds: Mapping[str, Any]) -> str:
    """``holds`` as lines a person reads in a diff."""
    if not holds.get("known"):
        return f"claims: consequences unknown ({holds.get('why', 'no cluster access')})\n"
    lines = [f"node {holds['node']}:"]
    for f in holds.get("functions") or []:
        lines.append(
            f"  {f['address']}: {_devices_text(f['before'])} -> {_devices_text(f['after'])}"
            + (f" (in use by {', '.join(f['users'])})" if f.get("users") else "")
        )
    for c in holds.get("classes") or []:
        if c["before"] != c["after"]:
            change = c["after"] - c["before"]
            lines.append(f"  class {c['class']}: {c['before']} -> {c['after']} units ({change:+d})")
    if not holds.get("drain"):
        lines.append("  no held unit is affected: applied without draining the node")
    else:
        lines.append("  drains: the node is marked pending while its unattached claims move")
    for entry in holds.get("affected") or []:
        lines.append(f"  loses its units: {', '.join(entry['claims'])}")
    for entry in holds.get("moves") or []:
        lines.append(f"  move {', '.join(entry['claims'])} -> {entry['to']}")
    for entry in holds.get("lost") or []:
        back = "; fits here again after the change" if entry.get("fits_after") else ""
        lines.append(f"  Lost {', '.join(entry['claims'])}: {entry.get('why', 'no room')}{back}")
    for entry in holds.get("attached") or []:
        effect = "its units go: refused without force" if entry["affected"] else "unaffected"
        lines.append(f"  attached {entry['claim']} -> VMI {entry['vmi']} ({effect})")
    for vmi in holds.get("breaks") or []:
        lines.append(f"  breaks VMI {vmi} (force)")
    return "\n".join(lines) + "\n"


# --- the drain's API parts -----------------------------------------------------------------


def set_layout_state(
    api_client: Any,
    node: str,
    state: str,
    labels: Mapping[str, str] | None = None,
    dry_run: bool = False,
) -> bool:
    """Merge-patch the Node's layout state (and ``labels``, GPU labels no longer earned
    removed when they are given); False when the Node already reads so."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    current = _labels(api_client.sanitize_for_serialization(core.read_node(node)))
    wanted: dict[str, str | None] = {gpu_keys.LABEL_NODE_LAYOUT_STATE: state}
    if labels is not None:
        wanted.update(labels)
        for key in current:
            if gpu_node_labels.is_gpu_label(key) and key not in labels:
                wanted[key] = None
    patch = {k: v for k, v in wanted.items() if current.get(k) != v}
    if not patch:
        return False
    core.patch_node(node, {"metadata": {"labels": patch}}, dry_run="All" if dry_run else None)
    return True


def _claims_of_node(api_client: Any, node: str) -> list[Obj]:
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    response = custom.list_cluster_custom_object(
        gpu_keys.GROUP,
        gpu_keys.VERSION,
        gpu_keys.PLURAL_CLAIMS,
        field_selector=f"status.nodeName={node}",
        _preload_content=False,
        _request_timeout=60,
    )
    return list(json.loads(response.data).get("items") or [])


def unattached_on(api_client: Any, node: str) -> list[str]:
    """Claims bound to ``node`` that no VMI holds: what the drain waits for to leave."""
    return sorted(
        _key(c)
        for c in _claims_of_node(api_client, node)
        if (c.get("status") or {}).get("phase") == "Bound"
        and not (c.get("status") or {}).get("attachedTo")
    )


def attached_on(api_client: Any, node: str, classes: Iterable[str]) -> list[dict[str, str]]:
    """Claims of ``classes`` on ``node`` attached to a VMI (running or starting)."""
    wanted = set(classes)
    found = []
    for claim in _claims_of_node(api_client, node):
        status = claim.get("status") or {}
        klass = str((claim.get("spec") or {}).get("class", ""))
        if (
            klass in wanted
            and status.get("attachedTo")
            and status.get("phase")
            in (
                "Attached",
                "Bound",
            )
        ):
            namespace = (claim.get("metadata") or {}).get("namespace", "")
            found.append({"claim": _key(claim), "vmi": f"{namespace}/{status['attachedTo']}"})
    return found


def wait_for_drain(
    api_client: Any,
    node: str,
    timeout: float,
    poll: float,
    progress: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    before: Iterable[str] = (),
) -> list[str]:
    """Wait until no unattached claim is bound to ``node``; the claims that left.

    ``before`` are those bound there before the Node was marked pending: the binder may move
    them all before the first look here, and the log counts them as moved. ``progress``
    hears each change of what is left (and at least every 30 s). Raises
    :class:`DrainTimeout` naming what is still there after ``timeout`` seconds.
    """
    deadline = clock() + timeout
    first = unattached_on(api_client, node)
    left = list(first)
    told: tuple[list[str], float] | None = None
    while left:
        now = clock()
        if told is None or told[0] != left or now - told[1] >= 30:
            progress(
                f"node {node}: waiting for the binder to move {len(left)} unattached"
                f" claim(s) away ({', '.join(left)}); {max(deadline - now, 0):.0f} s left"
            )
            told = (left, now)
        if now >= deadline:
            raise DrainTimeout(
                f"the binder did not move {', '.join(left)} off node {node} within"
                f" {timeout:g} s; the Node stays {node} layout-state=pending (it serves no"
                " class). Check that the cozystack-gpu controller runs and what the claims'"
                " Bound condition says, then run again",
                left,
            )
        sleep(poll)
        left = unattached_on(api_client, node)
    moved = set(before) | set(first)
    progress(f"node {node}: drained ({len(moved)} claim(s) moved away or Lost)")
    return first
