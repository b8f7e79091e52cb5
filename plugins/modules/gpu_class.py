#!/usr/bin/python
# Copyright: Cozystack GPU authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_class
short_description: Manage GPUClass objects, the offers of a hoster's GPU catalog
version_added: 0.1.0
description:
  - Creates, updates or deletes one C(GPUClass) (C(gpu.cozystack.io/v1alpha1),
    cluster-scoped) through the Kubernetes API with the official C(kubernetes) client.
  - O(spec) is the whole desired spec; fields left out are removed, except those the
    server defaults (C(onCordon)). Labels and annotations given are set; others are kept.
  - The CRD's own schema and CEL rules judge every request; their refusals (for example
    C(mode is immutable; create a new GPUClass instead)) are returned verbatim in C(msg).
  - Before writing, the module checks the rule CEL cannot, since it spans objects. Two
    classes may share C(source.devicePlugin.resourceName) only when their C(nodeSelector)s
    do not overlap.
  - "With O(state=present) it warns when no Node advertises the class's resource name in
    C(status.allocatable) (the class can place nothing yet). A resource name written before
    the device plugin runs is a prediction: the plugin names passthrough GPUs from the
    C(pci.ids) in its own image, which may name a GPU otherwise than the C(pci.ids) that
    M(cozystack.gpu.gpu_facts) read (it reports C(pci_ids_version)). Check with
    C(kubectl get node <node> -o jsonpath='{.status.allocatable}')."
author:
  - Cozystack GPU team (@cozystack)
requirements:
  - kubernetes (the official Python client)
options:
  name:
    description: Name of the class; a DNS label other than C(total).
    type: str
    required: true
  state:
    description: Whether the class exists.
    type: str
    choices: [present, absent]
    default: present
  spec:
    description:
      - The GPUClass spec (C(vendor), C(model), C(mode), C(profile), C(displayName),
        C(memory), C(maxCount), C(nodeSelector), C(onCordon), C(source), C(tolerations)).
      - Required with O(state=present).
    type: dict
  labels:
    description: Labels to set on the class.
    type: dict
  annotations:
    description: Annotations to set on the class.
    type: dict
extends_documentation_fragment:
  - cozystack.gpu.k8s_auth
attributes:
  check_mode:
    support: full
    description: Sends the request as a server-side dry run, so the CRD's rules judge it and nothing is stored.
  diff_mode:
    support: full
    description: Name, labels, annotations and spec; resourceVersion, generation and managedFields are left out.
seealso:
  - module: cozystack.gpu.gpu_class_info
"""

EXAMPLES = r"""
- name: Offer whole H100s for passthrough on the H100 nodes
  cozystack.gpu.gpu_class:
    name: h100
    spec:
      vendor: NVIDIA
      model: H100 SXM5 80GB
      mode: passthrough
      displayName: NVIDIA H100 80GB (whole GPU)
      memory: 80Gi
      nodeSelector:
        model.gpu.cozystack.io/GH100_H100_SXM5_80GB: "8"
      source:
        devicePlugin:
          resourceName: nvidia.com/GH100_H100_SXM5_80GB

- name: Offer a quarter of an L40S
  cozystack.gpu.gpu_class:
    name: l40s-12c
    kubeconfig: /etc/kubernetes/admin.conf
    spec:
      vendor: NVIDIA
      model: L40S
      mode: vgpu
      profile: L40S-12C
      memory: 12Gi
      source:
        devicePlugin:
          resourceName: nvidia.com/NVIDIA_L40S-12C

- name: Withdraw an offer
  cozystack.gpu.gpu_class:
    name: l40s-12c
    state: absent
"""

RETURN = r"""
result:
  description: The class as the API server stored it (as it would store it, in check mode); empty after deletion.
  returned: always
  type: dict
"""

import copy

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_class_rules, gpu_k8s


def argument_spec():
    spec = dict(
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        spec=dict(type="dict"),
        labels=dict(type="dict"),
        annotations=dict(type="dict"),
    )
    spec.update(copy.deepcopy(gpu_k8s.AUTH_ARG_SPEC))
    return spec


def class_conflicts(name, spec, existing):
    """Messages for classes that share this class's resourceName on overlapping nodes."""
    others = [(o["metadata"]["name"], o.get("spec") or {}) for o in existing]
    return [c.message(name) for c in gpu_class_rules.resource_name_conflicts(name, spec, others)]


def run_module(module, api=None):
    params = module.params
    if api is None:
        try:
            api = gpu_k8s.GpuClassApi(gpu_k8s.make_api_client(params))
        except Exception as exc:  # kubeconfig problems come in many exception types
            module.fail_json(msg="cannot configure the Kubernetes client: %s" % exc)
    try:
        result = gpu_k8s.ensure_class(
            api,
            params["name"],
            params["state"],
            spec=params["spec"],
            labels=params["labels"],
            annotations=params["annotations"],
            check_mode=module.check_mode,
            check_conflicts=class_conflicts,
        )
    except gpu_k8s.ClassRuleError as exc:
        module.fail_json(msg=str(exc))
    except gpu_k8s.ApiException as exc:
        module.fail_json(msg=gpu_k8s.api_error_message(exc), status=exc.status)
    if params["state"] == "present":
        for warning in gpu_k8s.advertisement_warnings(api, params["spec"]):
            module.warn(warning)
    if not module._diff:
        result.pop("diff")
    module.exit_json(**result)


def build_module():
    return AnsibleModule(
        argument_spec=argument_spec(),
        required_if=[("state", "present", ("spec",))],
        supports_check_mode=True,
    )


def main():
    module = build_module()
    if not gpu_k8s.HAS_KUBERNETES:
        module.fail_json(
            msg=missing_required_lib("kubernetes"), exception=gpu_k8s.KUBERNETES_IMPORT_ERROR
        )
    run_module(module)


if __name__ == "__main__":
    main()
