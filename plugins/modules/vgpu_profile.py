#!/usr/bin/python
# Copyright: Cozystack GPU authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vgpu_profile
short_description: Set the vGPU profile of NVIDIA SR-IOV virtual functions
version_added: 0.1.0
description:
  - Gives each VF in O(vfs) the vGPU type named O(profile) by writing its
    C(nvidia/current_vgpu_type) read-compare-write, and reads it back.
  - The profile is a type B(name) (for example C(NVIDIA L40S-24C)), resolved to a type ID
    per card from the C(creatable_vgpu_types) lists of that card's functions, since type IDs
    are unique only within one card. C(nvidia-smi) is asked when no list names it.
  - A VF that already carries another profile is left alone and the module fails, unless
    O(force) is set.
  - Omitting O(profile), or setting it to V(0), clears the listed VFs (deletes their vGPUs).
  - For whole cards and passthrough GPUs use M(cozystack.gpu.gpu_node_layout).
author:
  - Cozystack GPU team (@cozystack)
options:
  vfs:
    description:
      - PCI addresses of the virtual functions, with or without the PCI domain.
    type: list
    elements: str
    required: true
  profile:
    description:
      - vGPU type name to set, for example C(NVIDIA L40S-24C).
      - Omitted or V(0) clears the VFs.
    type: str
  force:
    description:
      - Replace the profile of a VF that carries another one (its vGPU is deleted first).
      - Also change, or clear, a VF a running VM uses (the VFIO device node sysfs names for it
        is held open by a QEMU process); without it the refusal names the VF and the VM.
    type: bool
    default: false
  root:
    description:
      - Directory below which C(sys/) is read and written (V(/) on a host).
    type: path
    default: /
  nvidia_smi:
    description:
      - The C(nvidia-smi) command, asked for the card's vGPU types when no sysfs list
        names the profile.
    type: str
    default: nvidia-smi
attributes:
  check_mode:
    support: full
    description: Reports the writes it would make and writes nothing.
  diff_mode:
    support: full
    description: Shows each VF's type ID before and after.
notes:
  - The NVIDIA vGPU host driver drops VFs and profiles at every reboot or driver reload;
    the C(vgpu_layout) role's boot restore unit re-applies the node layout.
seealso:
  - module: cozystack.gpu.gpu_node_layout
  - module: cozystack.gpu.gpu_facts
"""

EXAMPLES = r"""
- name: Give two VFs the L40S-24C profile
  cozystack.gpu.vgpu_profile:
    vfs:
      - "0000:41:00.4"
      - "0000:41:00.5"
    profile: NVIDIA L40S-24C

- name: Replace whatever profile a VF carries
  cozystack.gpu.vgpu_profile:
    vfs: ["41:00.6"]
    profile: NVIDIA L40S-12C
    force: true

- name: Delete the vGPU of a VF
  cozystack.gpu.vgpu_profile:
    vfs: ["0000:41:00.6"]
    profile: "0"
"""

RETURN = r"""
steps:
  description: The writes made (in check mode, the writes that would be made).
  returned: always
  type: list
  elements: dict
  sample:
    - action: set_vgpu_type
      target: "0000:41:00.4"
      gpu: "0000:41:00.0"
      type_id: 1151
      profile: NVIDIA L40S-24C
      old_type_id: 0
      reason: profile NVIDIA L40S-24C
vfs:
  description: Type ID of each VF after the run (predicted in check mode); V(0) is none.
  returned: always
  type: dict
  sample: {"0000:41:00.4": 1151, "0000:41:00.5": 1151}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cozystack.gpu.plugins.module_utils import (
    gpu_layout,
    gpu_layout_apply,
    gpu_layout_plan,
    gpu_layout_schema,
)


def argument_spec():
    return dict(
        vfs=dict(type="list", elements="str", required=True),
        profile=dict(type="str"),
        force=dict(type="bool", default=False),
        root=dict(type="path", default="/"),
        nvidia_smi=dict(type="str", default=gpu_layout.DEFAULT_NVIDIA_SMI),
    )


def _types(inventory, addresses):
    functions = inventory.by_address()
    found = {}
    for address in addresses:
        function = functions.get(address)
        if function is not None and function.vgpu is not None:
            found[address] = function.vgpu.current_type_id or 0
    return found


def run_module(module, writer=None):
    params = module.params
    root = params["root"]
    inventory = gpu_layout.read_host(root)
    try:
        plan = gpu_layout_plan.plan_vf_profiles(
            inventory,
            params["vfs"],
            params["profile"],
            force=params["force"],
            nvidia=gpu_layout.NvidiaSmi(params["nvidia_smi"]),
            # A VF a running VM uses is not changed without force; the refusal names the VM.
            in_use=gpu_layout.read_users(root, inventory),
        )
    except gpu_layout_schema.LayoutError as exc:
        module.fail_json(msg="; ".join(exc.problems), problems=exc.problems)
    if plan.refusals:
        module.fail_json(msg="; ".join(plan.refusals), refusals=plan.refusals)

    addresses = [gpu_layout_schema.canonical_pci(vf) for vf in params["vfs"]]
    before = _types(inventory, addresses)
    steps = [s.to_dict() for s in plan.steps]
    if module.check_mode:
        after = dict(before)
        for step in plan.steps:
            after[step.target] = step.type_id
    else:
        try:
            done, _skipped = gpu_layout_apply.execute_steps(plan.steps, root, writer=writer)
        except gpu_layout_apply.ApplyFailed as exc:
            module.fail_json(msg=str(exc), steps=steps)
        steps = done
        after = _types(gpu_layout.read_host(root), addresses)
    result = dict(changed=bool(steps), steps=steps, vfs=after)
    if module._diff:
        result["diff"] = dict(before=before, after=after)
    module.exit_json(**result)


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def main():
    module = build_module()
    run_module(module)


if __name__ == "__main__":
    main()
