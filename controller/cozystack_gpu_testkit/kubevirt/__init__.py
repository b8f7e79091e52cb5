"""KubeVirt's own virt-controller and virt-api on the test kit's control plane, so
VirtualMachines become VMIs and virt-launcher pods the way a cluster renders them, and every
VM and VMI passes virt-api's webhooks, not the way the team pictures them.

virt-operator is not run (it would deploy pods from images); the kit does what it would do
for virt-controller and virt-api, from what virt-operator's own generators print at the
pinned release (``kubevirt-manifests.yaml``, written by ``tools/build-binaries.sh``):

- the CRDs virt-controller watches that the plane lacks (the plane keeps the VMI, VM and
  instance-type CRDs of ``KUBEVIRT_VERSION``; the rest come from the components' release),
- the namespace ``kubevirt`` with the ServiceAccounts, ClusterRoles, Roles and bindings of
  virt-controller, virt-api and virt-handler (KubeVirt's own rules),
- a KubeVirt CR with ``status.phase: Deployed`` and the default architecture virt-operator
  writes (virt-controller and virt-api read their configuration only from a KubeVirt CR
  with a phase; virt-api's mutator gives new VMIs that architecture),
- KubeVirt's CA in the ConfigMap ``kubevirt-ca`` (a throw-away CA of the kit's), which
  signs virt-api's serving certificate,
- virt-api's webhook configurations as generated (``virt-api-mutator``,
  ``virt-api-validator``, ``virt-launcher-pod-mutator``: rules, failure and reinvocation
  policies, selectors), each webhook calling virt-api by URL on loopback with the kit's CA
  instead of through Service ``kubevirt/virt-api`` (no Service routes here), registered
  once virt-api serves and removed before it stops.

It starts ``virt-api`` (with the arguments virt-operator's Deployment gives it) and then
``virt-controller``, each a process with a token of its ServiceAccount, so the API server,
our webhooks and the raw-name policy see the users a cluster's KubeVirt is:
``system:serviceaccount:kubevirt:kubevirt-controller`` and ``...:kubevirt-apiserver``.
virt-api reads the front proxy's CA the plane publishes (``cluster.start``). Outside a pod
both take the namespace ``kubevirt`` (kubevirt.io/client-go's ``util.GetNamespace`` falls
back to it when no service-account namespace file exists), hence that namespace rather than
Cozystack's ``cozy-kubevirt``; tests render the chart's raw-name policy for this user.
virt-api's aggregated API (``v1.subresources.kubevirt.io``: console, VNC, ``virtctl``'s
subresources) is not registered: an APIService needs a Service with endpoints, and those
may not be loopback addresses. Nothing here calls it.

No virt-handler runs: a node is schedulable for launcher pods once it carries the labels
virt-handler and kubelet put on it and the devices its device plugins advertise
(``as_virt_handler``); with no heartbeat annotation virt-controller's node controller
leaves it alone. Nothing runs a launcher pod either: tests write pod and VMI status as
kubelet and virt-handler would (virt-controller itself moves a VMI to Scheduled, on the
pod's node, once its pod runs), VMI status with virt-handler's ServiceAccount
(``virt_handler``): virt-api's mutator puts back a VMI status changed by anyone but
KubeVirt's own accounts.

What the start-path tests share, by module:

- ``install``: what virt-operator would install, KubeVirt's identities and pinned versions;
- ``virt_api``: virt-api and its webhooks (``start_virt_api``);
- ``virt_controller``: virt-controller and ``start`` (all of it, in order), and the kit's
  virt-handler identity (``virt_handler``);
- ``vms``: VirtualMachines as a tenant writes them (``create_vm``), the VMI virt-controller
  makes for one, and the next one under the same name (``wait_vmi``), its launcher pods by
  the VMI's uid (``launcher_pods``, ``wait_launcher``, ``LauncherWatch``);
- ``node``: the node's part: running a VMI (``runs``), shutting one down that is deleted
  (``shuts_down``), ``virtctl stop`` and ``restart`` (``stops``, ``restarts``) and the
  clean-up of a test's VMs (``removes_vms``). Phases are written as virt-handler writes
  them (``reports``): KubeVirt reads whether a VMI ran from its phase transitions, and a
  VMI that never ran counts as a start failure.
"""

from cozystack_gpu_testkit.kubevirt.install import (
    API_USER,
    HANDLER_USER,
    LAUNCHER_IMAGE,
    NAMESPACE,
    USER,
    VERSION,
    VMI_FINALIZER,
    KubeVirtError,
    go_architecture,
    install,
)
from cozystack_gpu_testkit.kubevirt.migration import (
    MIGRATIONS,
    fails,
    handler_writes,
    is_migratable,
    lands,
    migratable,
    migrate,
)
from cozystack_gpu_testkit.kubevirt.node import (
    KUBELET_LABELS,
    NODE_DEVICES,
    NODE_LABELS,
    as_virt_handler,
    kubelet_removes,
    kubelet_runs,
    removes_vms,
    reports,
    restarts,
    retried_on_conflict,
    running_status,
    runs,
    shuts_down,
    stops,
)
from cozystack_gpu_testkit.kubevirt.virt_api import (
    VirtApi,
    start_virt_api,
)
from cozystack_gpu_testkit.kubevirt.virt_controller import (
    VirtController,
    start,
    virt_handler,
)
from cozystack_gpu_testkit.kubevirt.vms import (
    LAUNCHER_SELECTOR,
    START_TIMEOUT_S,
    LauncherWatch,
    create_vm,
    get_vm,
    get_vmi,
    launcher_pods,
    set_run_strategy,
    uid_of,
    virtual_machine,
    wait_launcher,
    wait_vmi,
)

__all__ = [
    "API_USER",
    "HANDLER_USER",
    "KUBELET_LABELS",
    "LAUNCHER_IMAGE",
    "LAUNCHER_SELECTOR",
    "MIGRATIONS",
    "NAMESPACE",
    "NODE_DEVICES",
    "NODE_LABELS",
    "START_TIMEOUT_S",
    "USER",
    "VERSION",
    "VMI_FINALIZER",
    "KubeVirtError",
    "LauncherWatch",
    "VirtApi",
    "VirtController",
    "as_virt_handler",
    "create_vm",
    "fails",
    "get_vm",
    "get_vmi",
    "go_architecture",
    "handler_writes",
    "install",
    "is_migratable",
    "kubelet_removes",
    "kubelet_runs",
    "lands",
    "launcher_pods",
    "migratable",
    "migrate",
    "removes_vms",
    "reports",
    "restarts",
    "retried_on_conflict",
    "running_status",
    "runs",
    "set_run_strategy",
    "shuts_down",
    "start",
    "start_virt_api",
    "stops",
    "uid_of",
    "virt_handler",
    "virtual_machine",
    "wait_launcher",
    "wait_vmi",
]
