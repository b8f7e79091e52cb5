#!/usr/bin/python
# Copyright: Cozystack GPU authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_node_layout
short_description: Validate, plan and apply the GPU layout of one node
version_added: 0.1.0
description:
  - Takes the node layout (which GPUs are passthrough, which carry which vGPU profile),
    validates it against the host, plans the steps from the current sysfs state and applies
    them, B(with the same code) the C(vgpu_layout) role's boot restore unit runs at boot.
  - "Steps, in order: bind passthrough GPUs to C(vfio-pci) (C(driver_override), unbind,
    C(drivers_probe)); enable SR-IOV VFs with C(sriov-manage -e), retried and judged by
    C(sriov_numvfs) alone because it can exit 0 without creating any; write profiles
    read-compare-write to C(nvidia/current_vgpu_type); create mdevs on mdev-based cards."
  - Never unbinds or resets a GPU that carries vGPUs, never disables VFs, never reboots.
    A VF or mdev that carries another profile is changed only with O(force) (or once a drain
    has moved every claim off the node, see below).
  - "B(Never under a running VM): a function or mdev a running VM uses, as sysfs shows it
    (the VFIO device node its C(iommu_group) or C(vfio-dev/) entry names, held open by a
    QEMU process; a function on C(vfio-pci) whose C(enable) reads 1), is not reconfigured
    without O(force); the refusal names the devices and the VMs (QEMU's C(-name))."
  - "B(Knowing the cluster) (with O(node_name) and a kubeconfig; the module's action plugin
    does this part on the Ansible controller, where the kubeconfig is): check mode also
    reports the consequences in RV(holds) and in the diff: per GPU/VF the resource names
    and units before and after and which GPUClass loses or gains units (classes select
    nodes by their C(nodeSelector) on the labels the layout earns, see RV(node_labels));
    which claims bound to the node would move and where (the controller's own placement
    model on the current cluster, the node as it will be after the change), which would go
    C(Lost) for lack of room, and which are attached to a running VMI. Without a kubeconfig
    it says the consequences are unknown."
  - "B(The drain): applying a change that takes units claims hold first marks the Node
    C(gpu.cozystack.io/layout-state=pending) (the binder then serves nothing there and
    moves its unattached claims away, each VM's claims together), waits up to
    O(drain_timeout) seconds for them to leave, printing progress, and refuses while an
    affected claim is attached to a running VMI unless O(force) (the result then lists
    the VMIs it breaks under C(breaks) in RV(holds)). Then it applies the layout and
    marks the Node C(applied) with the labels the host now earns. Check mode writes
    nothing, on the host or in the cluster."
  - "B(Layout schema) (O(layout), or the file O(src)): a mapping with an optional C(name)
    and a list C(gpus). Each entry has C(address) (a PCI address such as C(0000:41:00.0) or
    C(41:00.0), or C(GPU-<uuid>); never an index) and C(mode) (V(passthrough) or V(vgpu)). A
    V(vgpu) entry has exactly one of C(profile) (a vGPU type name such as C(NVIDIA L40S-24C)
    for every VF, or every mdev, of the card; with an optional C(count), the exact number
    of vGPUs, otherwise as many as the card can hold) and C(vfs) (a mapping of VF
    addresses of that same card to profile names; VFs it does not name are left as they
    are). A passthrough entry takes no profile, count or vfs. No GPU may appear twice once
    the PCI domain is canonicalised and UUIDs are resolved. Profiles are names, resolved per
    card to its type ID. Each refusal names its entry (C(gpus[2] (41:00.0): ...))."
author:
  - Cozystack GPU team (@cozystack)
extends_documentation_fragment:
  - cozystack.gpu.k8s_auth
options:
  layout:
    description:
      - The layout, as described above. Exactly one of O(layout) and O(src).
    type: dict
  src:
    description:
      - Path on the managed host of a layout file (JSON, or YAML when PyYAML is installed).
    type: path
  force:
    description:
      - Replace the profile of VFs (or mdevs) that carry another one, and rebind a GPU
        declared V(vgpu) that is bound to C(vfio-pci).
      - Also reconfigure what a running VM uses, and go on with a drain although affected
        claims are attached to running VMIs (they break; the result lists them).
      - Does not allow unbinding a GPU with live vGPUs; nothing does.
    type: bool
    default: false
  drained:
    description:
      - Every claim on this node's units has been moved off it, so VFs and mdevs carrying
        another profile, and a GPU on C(vfio-pci) declared V(vgpu), may be replaced without
        O(force) as long as no running VM uses them. The drain sets it; set it by hand only
        when you know no claim holds the node's units.
    type: bool
    default: false
  node_name:
    description:
      - The Kubernetes Node this host is. With it and a kubeconfig (the connection options
        below, or C(K8S_AUTH_KUBECONFIG)), the module knows the cluster; check mode reports
        the consequences for claims, and applying drains the node first.
      - Without it, or without a kubeconfig, the consequences are reported as unknown and
        the layout is applied without touching the Node.
    type: str
  drain_timeout:
    description: Seconds to wait for the binder to move the unattached claims off the node.
    type: int
    default: 600
  drain_poll:
    description: Seconds between two looks at the node's claims while draining.
    type: float
    default: 2
  root:
    description:
      - Directory below which C(sys/) is read and written (V(/) on a host, a fixture tree
        in tests).
    type: path
    default: /
  sriov_manage:
    description: NVIDIA's C(sriov-manage) command.
    type: path
    default: /usr/lib/nvidia/sriov-manage
  nvidia_smi:
    description:
      - The C(nvidia-smi) command; resolves C(GPU-<uuid>) addresses and names the vGPU
        types of a card whose sysfs lists do not.
    type: str
    default: nvidia-smi
  retries:
    description: Attempts of C(sriov-manage -e) per card (it races C(nvidia-vgpu-mgr) start-up).
    type: int
    default: 5
  retry_delay:
    description: Seconds between those attempts.
    type: float
    default: 3
attributes:
  check_mode:
    support: full
    description: Validates and returns the plan; writes nothing and runs no command that changes the host.
  diff_mode:
    support: full
    description: Driver, VF count, per-VF type IDs and mdevs of each declared GPU, before and after.
notes:
  - In check mode on a host whose VFs do not exist yet, per-VF work shows as a C(pending)
    step and names that only the VFs can resolve appear in RV(plan.deferred).
  - The cluster part runs on the Ansible controller and needs the C(kubernetes) Python
    client there (as kubernetes.core does) and Python 3.11; it uses the controller's
    placement model shipped in this collection's C(controller/) directory.
  - The standalone form for boot is C(python3 gpu_layout.py apply LAYOUT --root /), see
    the C(gpu_layout) module_utils docstring and C(docs/node-layout.md).
seealso:
  - module: cozystack.gpu.vgpu_profile
  - module: cozystack.gpu.gpu_facts
"""

EXAMPLES = r"""
- name: Two H100 for passthrough, an L40S split in two 24C vGPUs
  cozystack.gpu.gpu_node_layout:
    layout:
      name: mixed
      gpus:
        - address: "0000:18:00.0"
          mode: passthrough
        - address: GPU-5e8b1c0a-1f2e-4d3c-9b8a-7f6e5d4c3b2a
          mode: passthrough
        - address: "41:00.0"
          mode: vgpu
          profile: NVIDIA L40S-24C
          count: 2

- name: Show what would change
  cozystack.gpu.gpu_node_layout:
    src: /etc/cozystack-gpu/layout.json
  check_mode: true
  register: layout_plan

- name: Per-VF profiles, replacing what the VFs carry now
  cozystack.gpu.gpu_node_layout:
    layout:
      gpus:
        - address: "0000:41:00.0"
          mode: vgpu
          vfs:
            "0000:41:00.4": NVIDIA L40S-24C
            "0000:41:00.5": NVIDIA L40S-12C
    force: true
"""

RETURN = r"""
layout:
  description: The validated layout, addresses canonical.
  returned: always
  type: dict
plan:
  description: The plan computed from the host's state before any change.
  returned: always
  type: dict
  contains:
    steps:
      description:
        - Steps with C(action) (V(bind_vfio), V(bind_nvidia), V(enable_vfs),
          V(remove_mdev), V(clear_vgpu_type), V(set_vgpu_type), V(create_mdev), V(pending)),
          C(target), C(gpu), C(reason) and, as they apply, C(type_id), C(profile),
          C(old_type_id), C(mdev_type), C(mdev_uuid), C(fill).
      type: list
      elements: dict
    refusals:
      description: Changes refused (need O(force), or never made); the module fails when any.
      type: list
      elements: str
    deferred:
      description: Checks that can only run once the VFs exist.
      type: list
      elements: str
done:
  description: Steps executed (empty in check mode).
  returned: always
  type: list
  elements: dict
skipped_steps:
  description:
    - Steps that had nothing to do when their turn came, with the reason (for example a full
      card).
    - Not C(skipped), which Ansible reads as "the task was skipped" and then evaluates
      neither C(changed_when) nor C(failed_when).
  returned: always
  type: list
  elements: dict
remaining:
  description: Steps a last read of the host still finds missing; the module fails when any.
  returned: always
  type: list
  elements: dict
functions:
  description:
    - Each function of the declared GPUs (GPUs and their VFs), before and after (predicted
      in check mode) the layout, with C(address), C(gpu), C(changed), C(users) (the running
      VMs that use it) and, under C(before) and C(after), C(driver) and C(devices) (resource
      name to units, as the device plugin names them).
  returned: always
  type: list
  elements: dict
node_labels:
  description:
    - The Node labels the host earns after the layout (predicted in check mode), as
      C(gpu_facts) reports them for the C(node_labels) role.
  returned: always
  type: dict
unforeseen:
  description: GPUs whose vGPUs check mode cannot foresee (their VFs are not enabled yet).
  returned: always
  type: list
  elements: str
holds:
  description:
    - What the layout does to claims (the cluster part); C(known) false with C(why) when
      no kubeconfig or node name was given.
    - C(classes) (per class on this node, C(before) and C(after) units), C(affected)
      (claims the change itself pushes off the node), C(moves) (each VM's claims, from
      this node to C(to)), C(lost) (sets nowhere has room for, with C(why)), C(attached)
      (claims attached to a running VMI, C(affected) when their units go), C(breaks)
      (VMIs a forced run breaks), C(drain) (whether applying drains the node) and, after
      a run, C(drained) (the claims that left).
  returned: always
  type: dict
"""

import copy

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cozystack.gpu.plugins.module_utils import (
    gpu_layout,
    gpu_layout_apply,
    gpu_layout_schema,
    gpu_node_labels,
)
from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC


def argument_spec():
    spec = dict(
        layout=dict(type="dict"),
        src=dict(type="path"),
        force=dict(type="bool", default=False),
        drained=dict(type="bool", default=False),
        node_name=dict(type="str"),
        drain_timeout=dict(type="int", default=600),
        drain_poll=dict(type="float", default=2.0),
        root=dict(type="path", default="/"),
        sriov_manage=dict(type="path", default=gpu_layout_apply.DEFAULT_SRIOV_MANAGE),
        nvidia_smi=dict(type="str", default=gpu_layout.DEFAULT_NVIDIA_SMI),
        retries=dict(type="int", default=5),
        retry_delay=dict(type="float", default=3.0),
    )
    # The connection options are read by the action plugin on the controller; the host
    # part accepts and ignores them.
    spec.update(copy.deepcopy(AUTH_ARG_SPEC))
    return spec


def _devices(function):
    """Resource name -> units the device plugin would advertise for one function."""
    if function.mdevs:
        devices = {}
        for mdev in function.mdevs:
            if mdev.resource_name:
                devices[mdev.resource_name] = devices.get(mdev.resource_name, 0) + 1
        return devices
    return {function.resource_name: 1} if function.resource_name else {}


def function_report(result):
    """Per function of the declared GPUs: driver and devices before and after, and users."""
    before = result.inventory_before.by_address() if result.inventory_before else {}
    after = result.inventory_after.by_address() if result.inventory_after else {}
    wanted = set(result.gpus)
    addresses = sorted(
        {
            a
            for a, f in list(before.items()) + list(after.items())
            if a in wanted or f.physfn in wanted
        }
    )
    report = []
    for address in addresses:
        old, new = before.get(address), after.get(address)
        entry = {
            "address": address,
            "gpu": (old or new).physfn or address,
            "device_id": (old or new).device_id,
            "before": {"driver": old.driver, "devices": _devices(old)} if old else None,
            "after": {"driver": new.driver, "devices": _devices(new)} if new else None,
        }
        entry["changed"] = entry["before"] != entry["after"]
        users = list(result.users.get(address, []))
        for mdev in (old.mdevs if old else []):
            users.extend(u for u in result.users.get(mdev.uuid, []) if u not in users)
        entry["users"] = users
        report.append(entry)
    return report


def run_module(module, writer=None, runner=None, nvidia=None, sleep=None):
    params = module.params
    try:
        if params["src"]:
            document = gpu_layout_schema.load_layout_file(params["src"])
        else:
            document = params["layout"]
        layout = gpu_layout_schema.parse_layout(document)
        kwargs = dict(
            force=params["force"],
            check_mode=module.check_mode,
            drained=params["drained"],
            nvidia=nvidia or gpu_layout.NvidiaSmi(params["nvidia_smi"]),
            sriov_manage=params["sriov_manage"],
            writer=writer,
            runner=runner,
            retries=params["retries"],
            retry_delay=params["retry_delay"],
        )
        if sleep is not None:
            kwargs["sleep"] = sleep
        # The result carries the host before and after; the module reads sysfs no more.
        result = gpu_layout.apply_layout(layout, params["root"], **kwargs)
    except gpu_layout_schema.LayoutError as exc:
        module.fail_json(msg="; ".join(exc.problems), problems=exc.problems)
    except (OSError, ValueError) as exc:
        module.fail_json(msg=str(exc))

    data = result.to_dict()
    data.pop("ok")
    # "skipped" is Ansible's own result key: with it, failed_when and changed_when are not
    # evaluated at all.
    data["skipped_steps"] = data.pop("skipped")
    data["functions"] = function_report(result)
    data["node_labels"] = (
        gpu_node_labels.gpu_labels(result.inventory_after) if result.inventory_after else {}
    )
    data["unforeseen"] = list(result.unforeseen)
    data["holds"] = {
        "known": False,
        "why": "the cluster part runs in the module's action plugin on the Ansible controller",
    }
    if module._diff:
        data["diff"] = result.diff
    if result.plan.refusals:
        module.fail_json(msg="; ".join(result.plan.refusals), **data)
    if result.error:
        module.fail_json(msg=result.error, **data)
    if result.remaining and not module.check_mode:
        missing = ", ".join("%s %s" % (s["action"], s["target"]) for s in result.remaining)
        module.fail_json(msg="layout not in place after applying: " + missing, **data)
    module.exit_json(**data)


def build_module():
    return AnsibleModule(
        argument_spec=argument_spec(),
        mutually_exclusive=[("layout", "src")],
        required_one_of=[("layout", "src")],
        supports_check_mode=True,
    )


def main():
    module = build_module()
    run_module(module)


if __name__ == "__main__":
    main()
