"""Writes one node's GPUNode, and nothing else.

The binder writes ``status.conditions`` into the same status, so the agent sends merge
patches that name only the fields it owns (a merge patch leaves every key it does not name
alone). The node name is fixed at construction and every request goes to that name: the
agent has no way to write another node's object.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cozystack_gpu import keys

log = logging.getLogger(__name__)

# The status keys the agent owns; everything else in status (conditions) is the binder's.
OWNED_STATUS_FIELDS = (
    "devices",
    "resourceNames",
    "otherResourceNames",
    "updatedAt",
    "agentVersion",
)
_MERGE_PATCH = "application/merge-patch+json"


class NodeMissing(RuntimeError):
    """The Node does not exist (yet), so its GPUNode cannot be owned by it."""


class GPUNodeWriter:
    def __init__(self, api_client: Any, node_name: str) -> None:
        self.node_name = node_name
        # Typed as Any: the generated client's models are looser than its annotations.
        self._custom: Any = client.CustomObjectsApi(api_client)
        self._core: Any = client.CoreV1Api(api_client)
        self._exists = False

    def get(self) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self._custom.get_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_NODES, self.node_name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def ensure(self) -> None:
        """Create the GPUNode, owned by its Node so it goes with it, unless it exists."""
        if self._exists or self.get() is not None:
            self._exists = True
            return
        try:
            node = self._core.read_node(self.node_name)
        except ApiException as exc:
            if exc.status == 404:
                raise NodeMissing(f"node {self.node_name} does not exist") from exc
            raise
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND_NODE,
            "metadata": {
                "name": self.node_name,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.node_name,
                        "uid": node.metadata.uid,
                    }
                ],
            },
            "spec": {},
        }
        try:
            self._custom.create_cluster_custom_object(
                keys.GROUP,
                keys.VERSION,
                keys.PLURAL_NODES,
                body,
                field_manager=keys.FIELD_MANAGER_AGENT,
            )
            log.info("created GPUNode %s", self.node_name)
        except ApiException as exc:
            if exc.status != 409:
                raise
        self._exists = True

    def patch_status(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the owned status fields (and only those) of this node's GPUNode."""
        unknown = set(fields) - set(OWNED_STATUS_FIELDS)
        if unknown:
            raise ValueError(f"the agent does not own status fields {sorted(unknown)}")
        self.ensure()
        body = {"status": fields}
        try:
            return self._patch(body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._exists = False  # deleted under us: create it again, then patch
            self.ensure()
            return self._patch(body)

    def _patch(self, body: dict[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = self._custom.patch_cluster_custom_object_status(
            keys.GROUP,
            keys.VERSION,
            keys.PLURAL_NODES,
            self.node_name,
            body,
            field_manager=keys.FIELD_MANAGER_AGENT,
            _content_type=_MERGE_PATCH,
        )
        return obj


class PodPhases:
    """Phases of the pods on one node, read from the API server (kubelet's list has none)."""

    def __init__(self, api_client: Any, node_name: str) -> None:
        self.node_name = node_name
        self._core: Any = client.CoreV1Api(api_client)
        self._phases: dict[tuple[str, str], str] = {}

    def refresh(self) -> None:
        pods = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}", resource_version="0"
        )
        self._phases = {
            (p.metadata.namespace, p.metadata.name): (p.status.phase if p.status else None) or ""
            for p in pods.items
        }

    def phase_of(self, namespace: str, name: str) -> str | None:
        return self._phases.get((namespace, name))
