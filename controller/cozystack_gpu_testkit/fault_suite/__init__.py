"""The fault suite's scenarios, shared by its short form (``tests/integration/test_faults*.py``
in ``make test``) and its long form (``benchmarks/fault_bench.py``); only the sizes differ.

Each scenario runs on a control plane of its own (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, with an audit log of claim status writes), so its faults never
reach another test. Two replicas (``python -m cozystack_gpu``, a short Lease) run under
load (``load.Load``: orders arriving, VMs starting and stopping), the fault is injected,
and ``invariants.Invariants`` judges what the API server holds: in a background thread
during the run, and once more when the cluster has settled. After every fault the run
measures how long until the controller is healthy again: the Lease holder's /healthz
answers 200 as a synced leader, and a canary order on a node kept free for it is Bound.

The package: ``scenarios`` (the six faults, and the bursts they are injected into), ``run``
(``Run``, one scenario's cluster, and its ``Result``), ``audit`` (what the API server's
audit log says of claim writes and of the binders' claim feeds), ``webhooks`` (the
webhooks' ``Service`` on loopback and the chart's ``WebhookSetup``; the lifecycle fuzz
uses both).
"""

from cozystack_gpu_testkit.fault_suite.run import LEASE_ARGS, LEASE_S, Result, Run
from cozystack_gpu_testkit.fault_suite.scenarios import (
    apiserver_restarts,
    etcd_restarts,
    kills,
    partition,
    slow_api,
    webhooks_down,
)
from cozystack_gpu_testkit.fault_suite.webhooks import Service, WebhookSetup

__all__ = [
    "LEASE_ARGS",
    "LEASE_S",
    "Result",
    "Run",
    "Service",
    "WebhookSetup",
    "apiserver_restarts",
    "etcd_restarts",
    "kills",
    "partition",
    "slow_api",
    "webhooks_down",
]
