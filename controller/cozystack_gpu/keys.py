"""Every key the GPU components share: API names, labels, annotations, the scheduling gate,
quota keys, the settings ConfigMap and the small rules that go with them.

The controller, the node agent, the admission webhooks, the Ansible modules and the policies
must agree on these strings, so they are defined here once. This module imports nothing
beyond the standard library: the Ansible modules load it on hosts (through
``plugins/module_utils/gpu_keys.py``, a link to this file) and the pure model imports it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from enum import Enum
from typing import NamedTuple

# --- API ---------------------------------------------------------------------------------

GROUP = "gpu.cozystack.io"
VERSION = "v1alpha1"
API_VERSION = GROUP + "/" + VERSION

KIND_CLASS = "GPUClass"
KIND_CLAIM = "GPUClaim"
KIND_NODE = "GPUNode"
KIND_RESERVATION = "GPUReservation"
PLURAL_CLASSES = "gpuclasses"
PLURAL_CLAIMS = "gpuclaims"
PLURAL_NODES = "gpunodes"
PLURAL_RESERVATIONS = "gpureservations"

# Usage records: Cozystack's Workload, read by an external billing system.
WORKLOAD_GROUP = "cozystack.io"
WORKLOAD_VERSION = "v1alpha1"
WORKLOAD_API_VERSION = WORKLOAD_GROUP + "/" + WORKLOAD_VERSION
WORKLOAD_KIND = "Workload"
WORKLOAD_PLURAL = "workloads"
# Workload status.kind / status.type of a GPU usage record.
WORKLOAD_STATUS_KIND = "GPUClaim"
WORKLOAD_STATUS_TYPE = "gpu"
# ... and of a reservation's usage record (SPEC §11): one per booked window.
WORKLOAD_RESERVATION_STATUS_KIND = "GPUReservation"
WORKLOAD_RESERVATION_STATUS_TYPE = "gpu-reservation"
# A reservation's usage record carries its window and node in these annotations (RFC 3339,
# and the node's name while it is booked on one): the Workload's status holds only kind,
# type, resources and operational (Cozystack's CRD has nothing else, and prunes the rest).
ANNOTATION_RECORD_START = GROUP + "/window-start"
ANNOTATION_RECORD_END = GROUP + "/window-end"
ANNOTATION_RECORD_NODE = GROUP + "/window-node"

KUBEVIRT_GROUP = "kubevirt.io"
KUBEVIRT_VERSION = "v1"


class ApiKind(NamedTuple):
    """Where one kind lives in the API: its group ("" for core), version and plural."""

    kind: str
    group: str
    version: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


NODE = ApiKind("Node", "", "v1", "nodes", False)
NAMESPACE = ApiKind("Namespace", "", "v1", "namespaces", False)
RESOURCE_QUOTA = ApiKind("ResourceQuota", "", "v1", "resourcequotas", True)
POD = ApiKind("Pod", "", "v1", "pods", True)
GPU_CLASS = ApiKind(KIND_CLASS, GROUP, VERSION, PLURAL_CLASSES, False)
GPU_CLAIM = ApiKind(KIND_CLAIM, GROUP, VERSION, PLURAL_CLAIMS, True)
GPU_NODE = ApiKind(KIND_NODE, GROUP, VERSION, PLURAL_NODES, False)
GPU_RESERVATION = ApiKind(KIND_RESERVATION, GROUP, VERSION, PLURAL_RESERVATIONS, True)
VMI = ApiKind(
    "VirtualMachineInstance", KUBEVIRT_GROUP, KUBEVIRT_VERSION, "virtualmachineinstances", True
)
VM = ApiKind("VirtualMachine", KUBEVIRT_GROUP, KUBEVIRT_VERSION, "virtualmachines", True)
VMIM = ApiKind(
    "VirtualMachineInstanceMigration",
    KUBEVIRT_GROUP,
    KUBEVIRT_VERSION,
    "virtualmachineinstancemigrations",
    True,
)
WORKLOAD = ApiKind(WORKLOAD_KIND, WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL, True)
SECRET = ApiKind("Secret", "", "v1", "secrets", True)
PVC = ApiKind("PersistentVolumeClaim", "", "v1", "persistentvolumeclaims", True)
PV = ApiKind("PersistentVolume", "", "v1", "persistentvolumes", False)
STORAGE_CLASS = ApiKind("StorageClass", "storage.k8s.io", "v1", "storageclasses", False)
# Multus's NetworkAttachmentDefinition: KubeVirt adds to a launcher pod a request for the
# resource one names (ANNOTATION_NAD_RESOURCE) for every VMI network that uses it.
NAD = ApiKind(
    "NetworkAttachmentDefinition", "k8s.cni.cncf.io", "v1", "network-attachment-definitions", True
)
ANNOTATION_NAD_RESOURCE = "k8s.v1.cni.cncf.io/resourceName"
# KubeVirt instance types: a VMI made from one carries its GPU entries too.
INSTANCETYPE_GROUP = "instancetype.kubevirt.io"
INSTANCETYPE = ApiKind(
    "VirtualMachineInstancetype", INSTANCETYPE_GROUP, "v1beta1", "virtualmachineinstancetypes", True
)
CLUSTER_INSTANCETYPE = ApiKind(
    "VirtualMachineClusterInstancetype",
    INSTANCETYPE_GROUP,
    "v1beta1",
    "virtualmachineclusterinstancetypes",
    False,
)
# Dynamic resource allocation (SPEC §13, GA in 1.34): a `dra` class's units are devices of
# ResourceSlices, and the controller makes one ResourceClaim per claim of such a class.
RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_CLAIM = ApiKind("ResourceClaim", RESOURCE_GROUP, "v1", "resourceclaims", True)
RESOURCE_SLICE = ApiKind("ResourceSlice", RESOURCE_GROUP, "v1", "resourceslices", False)
DEVICE_CLASS = ApiKind("DeviceClass", RESOURCE_GROUP, "v1", "deviceclasses", False)
DRA_WATCHES = (RESOURCE_SLICE, DEVICE_CLASS, RESOURCE_CLAIM)  # read when DRA is served

# Everything the binder watches, in one place: its informers and its cluster view are built
# from this table. Usage records (WORKLOAD) are watched too unless they are switched off.
# Volumes (PVCs, PVs and their StorageClasses) say where a VM's disk is: the gate starts a
# VM only where its volumes can be used, and a stopped VM's hold stays with a local disk.
BINDER_WATCHES = (
    NODE,
    GPU_NODE,
    GPU_CLASS,
    GPU_CLAIM,
    GPU_RESERVATION,
    NAMESPACE,
    RESOURCE_QUOTA,
    POD,
    VMI,
    VM,
    VMIM,
    PVC,
    PV,
    STORAGE_CLASS,
)
# What is read to judge from one listing (the kubectl plugin, the layout preview): all the
# binder watches but the migrations, which it watches only to place targets early (their
# targets are on the claims). Those callers' identities need not read migrations.
MODEL_KINDS = tuple(kind for kind in BINDER_WATCHES if kind is not VMIM)

# --- Budgets -----------------------------------------------------------------------------

# ResourceQuota spec.hard keys in tenant namespaces. A class name is a DNS label other than
# "total" (the GPUClass CRD enforces both), so gpu.cozystack.io/<class> never collides
# with the total key.
QUOTA_KEY_PREFIX = GROUP + "/"
QUOTA_TOTAL_NAME = "total"
QUOTA_KEY_TOTAL = QUOTA_KEY_PREFIX + QUOTA_TOTAL_NAME


def quota_key(class_name: str) -> str:
    """The ResourceQuota key that budgets one GPUClass."""
    return QUOTA_KEY_PREFIX + class_name


def class_of_quota_key(key: str) -> str | None:
    """The class a per-class quota key budgets; None for the total key or a foreign key."""
    if not key.startswith(QUOTA_KEY_PREFIX):
        return None
    name = key[len(QUOTA_KEY_PREFIX) :]
    if name == QUOTA_TOTAL_NAME or not name:
        return None
    return name


# A ResourceQuota may also limit a GPU resource name directly ("raw" keys, from before
# classes existed). Kubernetes quotas extended resources as requests.<name>; the bare name is
# accepted as well, since hosters wrote both.
QUOTA_RAW_REQUESTS_PREFIX = "requests."


def raw_quota_keys(resource_name: str) -> tuple[str, str]:
    """The ResourceQuota keys that limit a device-plugin resource name directly."""
    return (QUOTA_RAW_REQUESTS_PREFIX + resource_name, resource_name)


# --- Tenants -----------------------------------------------------------------------------

# Namespace label granting vGPU classes; its effective value must be exactly "true".
LABEL_VGPU_ENTITLEMENT = GROUP + "/vgpu"
VGPU_ENTITLEMENT_VALUE = "true"

# Cozystack writes tenant.cozystack.io/<ancestor-namespace>: "" on a tenant namespace for
# every ancestor and for itself.
TENANT_LABEL_PREFIX = "tenant.cozystack.io/"


def tenant_ancestors(namespace_labels: dict[str, str]) -> frozenset[str]:
    """Namespaces named by the tenant ancestry labels of one namespace (itself included)."""
    return frozenset(
        key[len(TENANT_LABEL_PREFIX) :]
        for key in namespace_labels
        if key.startswith(TENANT_LABEL_PREFIX) and len(key) > len(TENANT_LABEL_PREFIX)
    )


# --- VMIs, launcher pods and claims ------------------------------------------------------

# The GPUClaim field the CRD makes selectable: a node's claims list by a field selector.
FIELD_CLAIM_NODE = "status.nodeName"

# VMI annotation naming the claims a VM holds and the claim templates it orders at start.
# Its value is JSON:
#   {"claims": ["<GPUClaim name>", ...],
#    "claimTemplates": [{"name": "<entry>", "class": "<GPUClass>", "count": <int>}, ...]}
# Both members are optional; names refer to objects in the VMI's namespace.
ANNOTATION_CLAIMS = GROUP + "/claims"
ANNOTATION_MEMBER_CLAIMS = "claims"
ANNOTATION_MEMBER_TEMPLATES = "claimTemplates"

# Reference label on VMIs and launcher pods; the webhooks' object selectors match it, so
# admission is only called for objects that use claims.
LABEL_CLAIMS_REF = GROUP + "/claims"
LABEL_CLAIMS_REF_VALUE = "true"


def uses_claims(labels: Mapping[str, str] | None) -> bool:
    """Whether a VMI, a VM's template or a launcher pod uses claims: the one definition.

    It does iff it carries the reference label, since only then does the API server call
    the webhooks, which refuse an annotation that names no claim (absent, blank, ``{}``,
    malformed). The chart's policies say the same in CEL (claims-label-policy.yaml refuses
    the annotation in any form without the label; raw-names-policy.yaml exempts only
    labelled VMIs and launcher pods under ``forbidden``); the binder counts a pod's GPU
    requests as its claims' only by this rule.
    """
    return (labels or {}).get(LABEL_CLAIMS_REF) == LABEL_CLAIMS_REF_VALUE


# Scheduling gate that holds a launcher pod until the controller has pinned the claim set.
SCHEDULING_GATE_CLAIMS = GROUP + "/claims"

# Label of claims the controller creates from a VMI's claim templates. It carries no VMI
# name (a VMI name can exceed a label value); the ownerReference names the VMI.
LABEL_TEMPLATE_CLAIM = GROUP + "/template-claim"
LABEL_TEMPLATE_CLAIM_VALUE = "true"
# Annotation the controller writes on each template claim it creates: the uid of the VMI it
# was made for. The ownerReference says the same, but it is not the controller's alone (the
# garbage collector cuts it when a VMI is deleted with orphan propagation): what the claim
# was made for is read from here, and the protection policy keeps anyone else from writing
# it, the label or the ownerReferences.
ANNOTATION_TEMPLATE_VMI_UID = GROUP + "/template-vmi-uid"

# Label of the claim the controller creates at a GPUReservation's start (SPEC §11), of the
# reservation's name and owned by it; its value is the reservation's name. Like the template
# label it is the controller's alone (the protection policy): the claim webhook admits such
# a claim without the order check, since its units were booked with the window.
LABEL_RESERVATION = GROUP + "/reservation"

# Prefix of the gpus entries the VMI webhook adds, one per unit.
VMI_GPU_NAME_PREFIX = "gpu-cozystack-"

# VMI annotation the VMI webhook writes at every admission, with the same value in each held
# claim's status.attachmentID: a mutating webhook runs before the API server gives a new
# object its uid, so this ties the attachments to the VMI admitted with them (and not to an
# earlier VMI of the same name) until the controller records that VMI's uid.
ANNOTATION_ATTACHMENT_ID = GROUP + "/attachment-id"

# KubeVirt marks: the temporary pod for WaitForFirstConsumer volumes, and migration targets.
ANNOTATION_EPHEMERAL_PROVISIONING = "kubevirt.io/ephemeral-provisioning"
LABEL_MIGRATION_JOB_UID = "kubevirt.io/migrationJobUID"
# KubeVirt names the instance type a VMI was made from in these VMI annotations.
ANNOTATION_INSTANCETYPE = "kubevirt.io/instancetype-name"
ANNOTATION_CLUSTER_INSTANCETYPE = "kubevirt.io/cluster-instancetype-name"

# Finalizer the binder keeps on a claim while it is attached to a VMI: deleting the claim
# then only marks it, and it goes (with its usage record) once the VMI is final or gone.
FINALIZER_CLAIM = GROUP + "/claim-protection"
# Finalizer the binder keeps on every GPUClass: a class being deleted keeps serving the
# claims that hold its units (Bound, Attached, Lost) and goes once none does, so its held
# units never read as free to another class sharing the resource name.
FINALIZER_CLASS = GROUP + "/class-protection"

# Matched against the whole name (``fullmatch``), as the API server judges names: ``$``
# also matches before a trailing newline.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def is_dns_label(name: str) -> bool:
    """True for a name that may serve as a GPUClass name or a quota key suffix."""
    return len(name) <= 63 and _DNS_LABEL.fullmatch(name) is not None and name != QUOTA_TOTAL_NAME


def template_claim_name(vmi_name: str, entry_name: str) -> str:
    """Name of the claim created from one claim-template entry of a VMI.

    Readable when short; a hash keeps it a valid, stable, unique name when the VMI and entry
    names together are too long.
    """
    plain = f"{vmi_name}-{entry_name}"
    if len(plain) <= 63 and _DNS_LABEL.fullmatch(plain):
        return plain
    digest = hashlib.sha256(f"{vmi_name}/{entry_name}".encode()).hexdigest()[:10]
    head = re.sub(r"[^a-z0-9-]", "-", plain.lower())[: 63 - 11].strip("-") or "claim"
    return f"{head}-{digest}"


# --- DRA (SPEC §13) ---------------------------------------------------------------------

# The ResourceClaim made for a claim of a `dra` class has the claim's name and namespace, its
# owner reference, LABEL_MANAGED_BY and this label (the class's name). Labels only say what
# it claims to be: the owner reference with the claim's uid says the controller made it.
LABEL_DRA_CLASS = GROUP + "/class"
# The settings ConfigMap's key listing the DeviceClasses of dra classes (the raw-name policy).
SETTINGS_KEY_DRA_DEVICE_CLASSES = "draDeviceClasses"
# Its requests, one per unit: gpu-0, gpu-1, ... (DNS labels, as the API wants request names).
DRA_REQUEST_PREFIX = "gpu-"
# Prefix of the spec.resourceClaims entries the VMI webhook adds, one per held claim of a
# `dra` class (its gpus entries keep VMI_GPU_NAME_PREFIX, one per unit).
VMI_RESOURCE_CLAIM_PREFIX = "gpu-cozystack-"

# --- Guest licence (vGPU) --------------------------------------------------------------

# A class with spec.license names the hoster's NVIDIA License System client configuration
# token Secret (in the controller's namespace). The controller copies the named key into
# every namespace entitled to vGPU, one copy per licensed class under a name derived from
# the class, and the VMI webhook hands that copy to each VM of the class as a disk with a
# fixed serial. The copy's keys are the guest contract (roles/guest_license reads them).
LICENSE_COPY_PREFIX = "gpu-license-"
# Every copy carries both labels: the first marks what the controller owns (and lists, so it
# deletes copies it no longer wants even after a restart), the second names the class.
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_CONTROLLER = "cozystack-gpu-controller"
LABEL_LICENSE_CLASS = GROUP + "/license-class"
# And the sha256 of its data (``licensing.rules.content_hash``). The labels and the hash only
# say what the copy claims to be: a tenant may write all three on a Secret of its own, so the
# VMI webhook trusts a copy only when its data is what the hoster's Secret gives now.
ANNOTATION_LICENSE_CONTENT_HASH = GROUP + "/license-content-sha256"
# The hoster marks a Secret of the controller's namespace as a licence token with this label
# (an Opaque Secret holding LICENSE_TOKEN_KEY); a class's secretRef naming any other Secret
# (the webhook's TLS key, a ServiceAccount token) is refused on the class and never copied.
LABEL_LICENSE_TOKEN = GROUP + "/license-token"
LICENSE_TOKEN_MARK = "true"
LICENSE_SECRET_TYPE = "Opaque"
# The copy's keys, which become the files of the guest's licence disk: the token (gridd takes
# a *.tok file from ClientConfigTokenPath) and the class's FeatureType, as decimal text.
LICENSE_TOKEN_KEY = "client_configuration_token.tok"
LICENSE_FEATURE_TYPE_KEY = "feature-type"
# The VMI's volume and disk of the copy. A virtio disk serial is at most 20 bytes; the guest
# finds the disk as /dev/disk/by-id/virtio-<serial>.
LICENSE_VOLUME_NAME = "gpu-cozystack-license"
LICENSE_DISK_SERIAL = "gpu-license"
# gridd.conf FeatureType values a licensed vGPU class may give its guests (NVIDIA License
# System user guide); 0 (unlicensed) is no licence at all, so a class leaves license out.
LICENSE_FEATURE_TYPES = {
    1: "NVIDIA vGPU (the licence edition follows the vGPU type)",
    2: "NVIDIA RTX Virtual Workstation",
    4: "NVIDIA Virtual Compute Server",
}
LICENSE_DEFAULT_FEATURE_TYPE = 1


def license_copy_name(class_name: str) -> str:
    """The name of a licensed class's token copy in each entitled namespace. A class name
    is a DNS label (at most 63), so the name is a valid Secret name."""
    return LICENSE_COPY_PREFIX + class_name


# --- Nodes -------------------------------------------------------------------------------

# Node labels the host layer writes so class nodeSelectors can select on the layout.
LABEL_NODE_LAYOUT = GROUP + "/layout"  # the layout name from the hoster's inventory
LABEL_NODE_LAYOUT_STATE = GROUP + "/layout-state"  # see LayoutState
NODE_MODEL_LABEL_PREFIX = "model." + GROUP + "/"  # model.gpu.cozystack.io/<model>: "<count>"
NODE_PROFILE_LABEL_PREFIX = (
    "profile." + GROUP + "/"
)  # profile.gpu.cozystack.io/<profile>: "<count>"
NODE_MODE_LABEL_PREFIX = "mode." + GROUP + "/"  # mode.gpu.cozystack.io/<mode>: "<count>"


class LayoutState(str, Enum):
    """Value of LABEL_NODE_LAYOUT_STATE. The binder leaves a Pending node out."""

    PENDING = "pending"
    APPLIED = "applied"
    FAILED = "failed"


def node_label_name(text: str) -> str:
    """A label name part (<=63, alphanumeric ends, [-_.A-Za-z0-9]) from a model or profile.

    "NVIDIA L40S-24C" becomes "NVIDIA_L40S-24C", as the device plugin names resources.
    """
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", text.strip().replace(" ", "_"))
    name = name.strip("_.-")[:63].rstrip("_.-")
    return name or "unknown"


# --- Settings ----------------------------------------------------------------------------

# ConfigMap in the controller's namespace; the ValidatingAdmissionPolicies take it as
# paramRef. The controller owns it; nothing else writes it.
SETTINGS_CONFIGMAP = "gpu-settings"
# NVIDIA's device plugins advertise GPUs under this prefix, but not only GPUs: a ConnectX or
# BlueField VF, an audio function or an NVSwitch bound to vfio-pci gets a name under it too.
# A name counts as a GPU name when a class names it, when the node agent finds its devices
# to be GPU functions, or when the hoster lists it (seed 004); a name under the prefix that
# the agent has not judged yet counts too, until it finds it to be another device's.
NVIDIA_RESOURCE_PREFIX = "nvidia.com/"
SETTINGS_KEY_RESOURCE_NAMES = "resourceNames"
# ConfigMap in the controller's namespace where the GPUClass webhook records each class it
# admits, written with the resourceVersion it read: two classes that share a resource name
# admitted at the same moment by two replicas see each other (the API server stores a class
# only after every webhook answered, so neither could see the other in a listing).
CLASS_ADMISSIONS_CONFIGMAP = "gpu-class-admissions"
SETTINGS_KEY_RAW_RESOURCE_NAMES = "rawResourceNames"


class RawNamesPolicy(str, Enum):
    """Whether tenants may request GPU resource names directly, without claims."""

    ALLOWED = "allowed"
    FORBIDDEN = "forbidden"


def format_resource_names(names: set[str] | frozenset[str] | list[str]) -> str:
    """The settings value of a resource-name set: sorted, de-duplicated, comma-joined."""
    return ",".join(sorted({n.strip() for n in names if n.strip()}))


def parse_resource_names(value: str) -> frozenset[str]:
    """Inverse of format_resource_names; tolerant of spaces and empty members."""
    return frozenset(n.strip() for n in value.split(",") if n.strip())


# --- Class rules -------------------------------------------------------------------------


class Mode(str, Enum):
    PASSTHROUGH = "passthrough"
    VGPU = "vgpu"


class OnCordon(str, Enum):
    MOVE = "Move"
    STAY = "Stay"


class Phase(str, Enum):
    PENDING = "Pending"
    BOUND = "Bound"
    ATTACHED = "Attached"
    LOST = "Lost"


def effective_max_count(mode: str, max_count: int | None, gpus_of_one_node: int) -> int:
    """How many units of a class one VM may take.

    maxCount has no schema default because the default depends on the mode: 1 for vgpu,
    and for passthrough every GPU of one node (the largest node serving the class).
    """
    if max_count is not None:
        return max_count
    if mode == Mode.VGPU.value:
        return 1
    return max(gpus_of_one_node, 0)


# --- Controller identity -----------------------------------------------------------------

FIELD_MANAGER_BINDER = "cozystack-gpu-binder"
FIELD_MANAGER_AGENT = "cozystack-gpu-agent"
FIELD_MANAGER_WEBHOOK = "cozystack-gpu-webhook"
LEASE_NAME_BINDER = "cozystack-gpu-binder"
# GPUClaim status field: the binder's fencing token on each of its claim status writes
# ({holder, term, basedOn}); the claim-fence policy refuses one whose term is not the Lease's.
CLAIM_STATUS_WRITER = "writer"

# Condition types.
CONDITION_BOUND = "Bound"  # on GPUClaim: why a claim waits, or where it went
CONDITION_PLACED = "Placed"  # on GPUClaim: the launcher pod's set placement
CONDITION_AVAILABLE = "Available"  # on GPUClass: has it free capacity
CONDITION_READY = "Ready"  # on GPUNode: written by the binder: does the node serve classes
# on GPUNode: does kubelet advertise every resource name the agent reports for a device
CONDITION_NAMES_ADVERTISED = "ResourceNamesAdvertised"
CONDITION_DELETING = "Deleting"  # on GPUClaim: deletion waits for the VMI to stop
CONDITION_OFFER_WITHDRAWN = "OfferWithdrawn"  # on GPUClaim: its class is being deleted
# on GPUClaim: its VM's live migration: the target placed, why it waits, how it ended
CONDITION_MIGRATION = "Migration"
# on a licensed GPUClass: written by the licence copier: is its token Secret copied
CONDITION_LICENSE_READY = "LicenseReady"
CONDITION_BOOKED = "Booked"  # on GPUReservation: booked on a node, or why it waits
CONDITION_ENDING = "Ending"  # on GPUReservation: its window ends within warnBefore


# Condition and Event reasons the controller writes, besides the model's refusal reasons
# (cozystack_gpu.model.Reason, which a waiting claim's Bound condition carries). Every one
# has a row in docs/troubleshooting.md; a test keeps the two in step.


class ClaimReason(str, Enum):
    """Reasons of a GPUClaim's Bound, Placed, Deleting and Migration conditions when it does
    not wait."""

    BOUND = "Bound"  # bound to a node when ordered (or at its VM's start)
    MOVED = "Moved"  # moved with its set to another node
    LOST = "Lost"  # its node went away, or nowhere had room for its set
    REBOUND = "Rebound"  # a Lost claim bound again
    REATTACHED = "Reattached"  # a Lost claim back on its node, which is Ready again
    ATTACHED = "Attached"  # its VMI runs
    VMI_FINISHED = "VMIFinished"  # its VMI is Succeeded or Failed
    VMI_GONE = "VMIGone"  # its VMI was deleted
    ATTACHMENT_EXPIRED = "AttachmentExpired"  # its VMI never appeared within the grace
    PINNED = "Pinned"  # its VM's launcher pod was pinned to the set's node
    NODE_REFUSED = "NodeRefused"  # the scheduler refused the pinned launcher pod on a node
    WAITING_FOR_VMI = "WaitingForVMI"  # deleted while attached: goes when the VMI stops
    VOLUME_NOT_BOUND = "VolumeNotBound"  # (Placed False) its VM's volume is not bound yet
    # (Placed False) its launcher pod's GPU requests are not exactly what its claims cover
    REQUESTS_BEYOND_CLAIMS = "GPURequestsBeyondClaims"
    # (Placed False) another pod naming its VMI is the VMI's launcher pod
    NOT_THE_LAUNCHER = "NotTheLauncherPod"
    # (Placed False) the API server refuses one of the VM's template claims as invalid
    TEMPLATE_CLAIM_INVALID = "TemplateClaimInvalid"
    # (Migration) its VM's live migration: the target's units held on the node recorded
    MIGRATION_TARGET_PLACED = "MigrationTargetPlaced"
    # (Migration False) no node has room for the set's target: its target pod stays gated
    MIGRATION_TARGET_NOT_PLACED = "MigrationTargetNotPlaced"
    MIGRATION_LANDED = "MigrationLanded"  # (Migration False) the VM runs on the target now
    # (Migration False) it failed, was cancelled, or its target pod or node went
    MIGRATION_ENDED = "MigrationEnded"


class NodeReason(str, Enum):
    """Reasons of a GPUNode's Ready and ResourceNamesAdvertised conditions."""

    SERVING = "Serving"
    NODE_GONE = "NodeGone"
    NO_INVENTORY = "NoInventory"
    INVENTORY_STALE = "InventoryStale"
    NODE_NOT_READY = "NodeNotReady"
    CORDONED = "Cordoned"
    LAYOUT_PENDING = "LayoutPending"
    LAYOUT_FAILED = "LayoutFailed"
    ADVERTISED = "Advertised"
    NOT_ADVERTISED = "NotAdvertised"


class ClassReason(str, Enum):
    """Reasons of a GPUClass's Available condition."""

    FREE = "Free"
    NO_FREE_UNITS = "NoFreeUnits"
    DELETING = "Deleting"


class LicenseReason(str, Enum):
    """Reasons of a licensed GPUClass's LicenseReady condition (the licence copier's)."""

    COPIED = "TokenCopied"
    SECRET_MISSING = "LicenseSecretMissing"
    SECRET_NOT_MARKED = "LicenseSecretNotMarked"
    SECRET_WRONG_TYPE = "LicenseSecretWrongType"
    KEY_NOT_TOKEN = "LicenseKeyNotToken"
    TOKEN_MISSING = "LicenseTokenMissing"


class AdmissionReason(str, Enum):
    """Reasons of the admission webhooks' refusals beyond the model's (an order refused for
    budget or capacity, a set of mixed vGPU classes... carries the model's Reason)."""

    MALFORMED_ANNOTATION = "MalformedClaimsAnnotation"
    LABEL_WITHOUT_ANNOTATION = "ClaimsLabelWithoutAnnotation"
    CLAIM_NOT_FOUND = "ClaimNotFound"
    CLAIM_BEING_DELETED = "ClaimBeingDeleted"
    CLAIM_ATTACHED_ELSEWHERE = "ClaimAttachedElsewhere"
    CLAIM_NOT_BOUND = "ClaimNotBound"
    CLAIMS_ON_SEVERAL_NODES = "ClaimsOnSeveralNodes"
    OWN_GPU_ENTRIES = "OwnGPUEntries"
    INSTANCETYPE_MISSING = "InstanceTypeMissing"
    LABEL_ON_FOREIGN_POD = "ClaimsLabelOnForeignPod"
    OWNER_VMI_MISSING = "OwnerVMIMissing"
    SPEC_IMMUTABLE = "SpecImmutable"
    TEMPLATE_LABEL_MISUSED = "TemplateLabelMisused"
    RESOURCE_NAME_SHARED = "ResourceNameShared"
    REPLICA_CANNOT_CHECK = "ReplicaCannotCheck"
    REPLICA_NOT_SYNCED = "ReplicaNotSynced"
    VMI_EXISTS = "VMIExists"
    TEMPLATE_CLAIM_CONFLICT = "TemplateClaimConflict"
    CLAIM_IS_TEMPLATE = "ClaimIsTemplateClaim"
    LICENSE_COPY_MISSING = "LicenseCopyMissing"
    LICENSE_COPY_UNTRUSTED = "LicenseCopyUntrusted"
    LICENSE_SECRET_REFUSED = "LicenseSecretRefused"
    NETWORK_GPU_RESOURCE = "NetworkRequestsGPU"
    WINDOW_UNREADABLE = "WindowUnreadable"
    WINDOW_LABEL_MISUSED = "ReservationLabelMisused"
    WINDOW_NOT_OPEN = "WindowNotOpen"
    DRA_TEMPLATE = "DRAClassTemplate"


class EventReason(str, Enum):
    """Reasons of Events the controller writes that no condition carries."""

    SET_NOT_PLACED = "GPUSetNotPlaced"  # on a VMI whose set fits nowhere yet
    NODE_REJECTED = "GPUNodeRejected"  # on a VMI whose pinned pod the scheduler refused
    DELETION_WAITS = "DeletionWaitsForVMI"  # on a claim deleted while attached
    RESOURCE_CLAIM_TAKEN = "ResourceClaimNameTaken"  # on a dra claim (SPEC §13)
