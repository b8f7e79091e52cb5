#!/usr/bin/python
# Copyright: Cozystack GPU authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_facts
short_description: Report the NVIDIA GPU functions of a host from sysfs as facts
version_added: 0.1.0
description:
  - Reads every NVIDIA GPU PCI function below O(root) (C(sys/bus/pci/devices)) with its
    driver, IOMMU group, NUMA node, SR-IOV physical/virtual function relation, vGPU type,
    mdev types and mdevs, and the device-plugin resource name it is advertised under.
  - Uses the same sysfs reader as the node agent of the cozystack.gpu controller, so the
    host layer and the cluster agree on what a GPU is and what it is called.
  - Says which running VMs use the GPUs (C(users), C(vms)), that is the processes holding a
    GPU function's or mdev's VFIO device open, named by QEMU's C(-name), read as the
    M(cozystack.gpu.gpu_node_layout) guard reads them. The host driver role and the
    C(cozystack.gpu.upgrade_hosts) playbook wait on and refuse by the same list.
  - Sets the fact C(cozystack_gpu). Reads only; never changes the host.
  - "Resource names are B(predictions). The device plugin names passthrough GPUs from the
    C(pci.ids) bundled in its own image (C(/usr/pci.ids)), never from the host's, so a name
    read here is the plugin's name only when both files name the device alike. The facts
    say which file and release the prediction used (C(pci_ids_path), C(pci_ids_version));
    point O(pci_ids) at a copy of the plugin's file to predict its names, and check them
    against the deployed plugin with
    C(kubectl get node <node> -o jsonpath='{.status.allocatable}')."
author:
  - Cozystack GPU team (@cozystack)
options:
  root:
    description:
      - Directory below which C(sys/) and C(usr/share/misc/pci.ids) are read.
      - V(/) on a host; a fixture tree in tests, or the host root mounted in a container.
    type: path
    default: /
  pci_ids:
    description:
      - C(pci.ids) files to name devices from, tried in order before the distribution's
        (C(/usr/share/misc/pci.ids), C(/usr/share/hwdata/pci.ids), C(/usr/pci.ids)), each
        below O(root) first and then as given.
      - For example a copy of the device plugin image's C(/usr/pci.ids), so passthrough
        names are predicted from the file the plugin reads.
    type: list
    elements: path
attributes:
  check_mode:
    support: full
    description: Only reads sysfs, so check mode runs it unchanged.
  diff_mode:
    support: none
    description: Changes nothing, so there is nothing to diff.
  facts:
    support: full
    description: Sets C(ansible_facts.cozystack_gpu).
notes:
  - Attribute files that exist but cannot be parsed are reported per function in
    C(errors), never as a module failure.
seealso:
  - module: cozystack.gpu.gpu_node_layout
  - module: cozystack.gpu.vgpu_profile
"""

EXAMPLES = r"""
- name: Read the GPU inventory
  cozystack.gpu.gpu_facts:

- name: Show the resource names this host advertises
  ansible.builtin.debug:
    var: ansible_facts.cozystack_gpu.resource_names

- name: Read a fixture tree instead of the host
  cozystack.gpu.gpu_facts:
    root: /srv/fixtures/l40s

- name: Predict names from the device plugin's own pci.ids (copied out of its image)
  cozystack.gpu.gpu_facts:
    pci_ids: [/srv/kubevirt-gpu-device-plugin/pci.ids]
"""

RETURN = r"""
ansible_facts:
  description: Facts set by the module.
  returned: always
  type: dict
  contains:
    cozystack_gpu:
      description: The inventory.
      returned: always
      type: dict
      contains:
        root:
          description: The root read.
          type: str
          returned: always
          sample: /
        functions:
          description:
            - One entry per NVIDIA GPU function, sorted by PCI address, with C(address),
              C(device_id), C(model), C(driver), C(iommu_group), C(numa_node), C(physfn),
              C(is_vf), C(sriov) (C(total_vfs), C(num_vfs), C(vfs)), C(vgpu)
              (C(current_type_id), C(creatable)), C(vgpu_type_name), C(mdev_types),
              C(mdevs), C(mode), C(resource_name), C(resource_names) and C(errors).
          type: list
          elements: dict
          returned: always
        mdevs:
          description: Every mdev on the host, with its parent and type.
          type: list
          elements: dict
          returned: always
        resource_names:
          description:
            - Every device-plugin resource name the functions serve, as predicted from sysfs
              and the pci.ids in C(pci_ids_path) (see the notes above).
          type: list
          elements: str
          returned: always
          sample: [nvidia.com/NVIDIA_L40S-24C, nvidia.com/GH100_H100_SXM5_80GB]
        node_labels:
          description:
            - The Node labels this host earns (what GPUClass nodeSelectors select on), as the
              C(cozystack.gpu.node_labels) role writes them
              (C(model.gpu.cozystack.io/<model>), C(profile.gpu.cozystack.io/<profile>),
              C(mode.gpu.cozystack.io/<mode>), each a count).
          type: dict
          returned: always
          sample: {"model.gpu.cozystack.io/AD102GL_L40S": "1", "mode.gpu.cozystack.io/vgpu": "1"}
        pci_ids_path:
          description: The pci.ids file the model names come from, if one was found.
          type: str
          returned: always
        pci_ids_version:
          description: The release that pci.ids names in its C(Version) header line, if any.
          type: str
          returned: always
          sample: "2025.06.09"
        users:
          description:
            - Per PCI address or mdev UUID in use, who uses it (a VM as C(VM <name> (pid N)),
              KubeVirt naming its domains C(<namespace>_<vmi>)).
          type: dict
          returned: always
          sample: {"0000:41:00.4": ["VM tenant-a_vm-1 (pid 4242)"]}
        vms:
          description: Every user of C(users) once, sorted; empty on a host drained of GPU VMs.
          type: list
          elements: str
          returned: always
          sample: ["VM tenant-a_vm-1 (pid 4242)"]
        errors:
          description: Problems that belong to no single function.
          type: list
          elements: str
          returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cozystack.gpu.plugins.module_utils import (
    gpu_layout,
    gpu_node_labels,
    gpu_sysfs,
)


def argument_spec():
    return dict(
        root=dict(type="path", default="/"),
        pci_ids=dict(type="list", elements="path"),
    )


def run_module(module):
    params = module.params
    paths = None
    if params["pci_ids"]:
        paths = [*params["pci_ids"], *gpu_sysfs.DEFAULT_PCI_IDS_PATHS]
    inventory = gpu_sysfs.read_inventory(params["root"], pci_ids_paths=paths)
    facts = inventory.to_dict()
    facts["node_labels"] = gpu_node_labels.gpu_labels(inventory)
    users = gpu_layout.read_users(params["root"], inventory)
    facts["users"] = users
    facts["vms"] = sorted({name for names in users.values() for name in names})
    module.exit_json(changed=False, ansible_facts={"cozystack_gpu": facts})


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def main():
    module = build_module()
    run_module(module)


if __name__ == "__main__":
    main()
