"""What the API server serves, asked once at the process's start: whether the DRA objects
a ``dra`` class is served from are there (``resource.k8s.io/v1``, GA since Kubernetes 1.34;
the chart admits 1.32, where they are not)."""

from __future__ import annotations

import logging
from dataclasses import replace

from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.config import Config

log = logging.getLogger(__name__)


def serves(api: client.ApiClient, group: str, version: str) -> bool:
    """Whether the API server serves ``group/version`` (discovery, one call)."""
    groups = client.ApisApi(api).get_api_versions().groups or []
    return any(
        g.name == group and any(v.version == version for v in g.versions or []) for g in groups
    )


def resolve_dra(api: client.ApiClient, config: Config) -> Config:
    """``config`` with its dra setting true or false: auto asks the API server."""
    if config.dra != "auto":
        return config
    served = serves(api, keys.RESOURCE_GROUP, keys.RESOURCE_SLICE.version)
    log.info(
        "dra auto: %s/%s is %s; dra classes %s",
        keys.RESOURCE_GROUP,
        keys.RESOURCE_SLICE.version,
        "served" if served else "not served",
        "are read" if served else "get no units",
    )
    return replace(config, dra="true" if served else "false")
