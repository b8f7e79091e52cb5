"""Fixtures of the binder tests (see binder_env.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from binder_env import GRACE_S, Corner, Env

from cozystack_gpu.binder.loop import Binder
from cozystack_gpu_testkit.objects import Kube, binder_config, install_extra_crds


@pytest.fixture(scope="session")
def kube(api_client: Any) -> Kube:
    install_extra_crds(api_client)
    return Kube(api_client)


@pytest.fixture
def corner(kube: Kube) -> Iterator[Corner]:
    """This test's namespaces, nodes and classes, deleted after it; no binder."""
    made = Corner.make(kube)
    try:
        yield made
    finally:
        made.clean_up()


@pytest.fixture
def env(api_client: Any, kube: Kube) -> Iterator[Env]:
    made = Corner.make(kube)
    config = binder_config(made.controller_ns, attachment_grace=GRACE_S)
    binder = Binder(api_client, config)
    binder.start()
    assert binder.synced.wait(30), "the binder did not finish its first listing"
    env = Env(kube, made.id, made.tenant, made.controller_ns, binder)
    try:
        yield env
    finally:
        env.binder.stop()
        env.clean_up()
    # A binder loop that died would make every wait above time out for no visible reason.
    assert env.binder.failure is None, f"the binder loop failed: {env.binder.failure}"
