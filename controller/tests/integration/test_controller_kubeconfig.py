"""A replica started with ``--kubeconfig`` alone, as a hoster runs one off the cluster (no
``KUBECONFIG`` in its environment), runs: its binder binds and kopf's part serves the
health probe.

Found by the start benchmark: kopf logs in through the kubernetes client, which takes the
kubeconfig's path from the environment as it was when the client was imported, before the
flag was read; with no ``KUBECONFIG`` kopf found no credentials and the process stopped a
second after its start.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from binder_env import Corner

from cozystack_gpu import keys
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.controller_process import ControllerProcess
from cozystack_gpu_testkit.objects import wait_for

pytestmark = pytest.mark.apiserver


def test_a_replica_given_only_the_kubeconfig_flag_binds_and_answers_its_probe(
    control_plane: ControlPlane, corner: Corner, tmp_path: Path
) -> None:
    corner.nodes(1, 2)
    gpu_class = corner.gpu_class()
    replica = ControllerProcess(
        control_plane, corner.controller_ns, "flag-only", tmp_path,
        "--workload-records", "false", "--webhook-port", "0",
        kubeconfig_in_env=False,
    )  # fmt: skip
    try:
        corner.kube.claim(corner.tenant, "order", gpu_class, finalizers=[keys.FINALIZER_CLAIM])
        corner.wait_phase("order", "Bound", timeout=60)

        def healthy() -> bool:
            assert replica.proc.poll() is None, f"the replica stopped:\n{replica.log_tail()}"
            return replica.health()[0] == 200

        wait_for(healthy, 60, "the replica's health probe")
        assert replica.proc.poll() is None, replica.log_tail()
    finally:
        replica.stop()
