"""The list (and watch) call of a kind, by its path, through the client's public request
methods.

The kubernetes client's typed ``CoreV1Api`` is a 63,000-line module that costs about 0.4 s
of CPU to import, and a new process would import it only to list nodes, pods and the other
core kinds before its first bind (BENCHMARKS.md, issue 30). A list is one GET of the kind's
path with a few query parameters, so the informers send it themselves; ``CoreV1Api`` is
imported later, by the first write that needs it. The calls take the keyword arguments of the
typed ones (``resource_version``, ``watch``, ``_preload_content=False``...), so the client's
``watch.Watch`` streams them alike, and a status that is not 2xx raises ``ApiException`` as
theirs do (the watch's 410 Gone included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu.keys import ApiKind

# The query parameters the informers send, by the typed calls' keyword names.
_QUERY = {
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
    "resource_version": "resourceVersion",
    "resource_version_match": "resourceVersionMatch",
    "timeout_seconds": "timeoutSeconds",
    "watch": "watch",
}


def kind_path(kind: ApiKind, namespace: str | None = None) -> str:
    """The collection path of ``kind``: across all namespaces, or in ``namespace``."""
    prefix = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
    if namespace:
        prefix += f"/namespaces/{namespace}"
    return f"{prefix}/{kind.plural}"


def path_list(api: client.ApiClient, path: str) -> Callable[..., Any]:
    """A list (or, with ``watch=True``, watch) call of ``path`` that answers the unread
    response (the callers read it as JSON or as a stream of watch events)."""

    def list_path(
        *, _preload_content: bool = False, _request_timeout: Any = None, **params: Any
    ) -> Any:
        if _preload_content:
            raise ValueError("path lists answer the raw response only")
        unknown = params.keys() - _QUERY.keys()
        if unknown:
            raise TypeError(f"{path}: unknown list parameters {sorted(unknown)}")
        query = [(_QUERY[name], value) for name, value in params.items() if value is not None]
        request = api.param_serialize(
            "GET",
            path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = api.call_api(*request, _request_timeout=_request_timeout)
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response.response

    return list_path
