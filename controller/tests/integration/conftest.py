"""Fixtures of the binder tests (see binder_env.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from binder_env import GRACE_S, Env

from cozystack_gpu.binder.loop import Binder
from cozystack_gpu_testkit.objects import Kube, binder_config, install_extra_crds


@pytest.fixture(scope="session")
def kube(api_client: Any) -> Kube:
    install_extra_crds(api_client)
    return Kube(api_client)


@pytest.fixture
def env(api_client: Any, kube: Kube) -> Iterator[Env]:
    test_id = uuid.uuid4().hex[:8]
    controller_ns = f"ctl-{test_id}"
    tenant = f"tenant-{test_id}"
    kube.namespace(controller_ns)
    kube.namespace(tenant, {f"tenant.cozystack.io/{tenant}": ""})
    binder = Binder(api_client, binder_config(controller_ns, attachment_grace=GRACE_S))
    binder.start()
    assert binder.synced.wait(30), "the binder did not finish its first listing"
    env = Env(kube, binder, test_id, tenant, controller_ns)
    try:
        yield env
    finally:
        env.binder.stop()
        env.clean_up()
    # A binder loop that died would make every wait above time out for no visible reason.
    assert env.binder.failure is None, f"the binder loop failed: {env.binder.failure}"
