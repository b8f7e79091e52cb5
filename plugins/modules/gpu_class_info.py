#!/usr/bin/python
# Copyright: Cozystack GPU authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_class_info
short_description: List GPUClass objects, the offers of a hoster's GPU catalog
version_added: 0.1.0
description:
  - Reads C(GPUClass) objects (C(gpu.cozystack.io/v1alpha1), cluster-scoped) through the
    Kubernetes API with the official C(kubernetes) client.
author:
  - Cozystack GPU team (@cozystack)
requirements:
  - kubernetes (the official Python client)
options:
  name:
    description: Only this class; without it, every class.
    type: str
  label_selector:
    description: Only classes matching this label selector (ignored with O(name)).
    type: str
extends_documentation_fragment:
  - cozystack.gpu.k8s_auth
attributes:
  check_mode:
    support: full
    description: Only reads, so check mode runs it unchanged.
  diff_mode:
    support: none
    description: Changes nothing.
seealso:
  - module: cozystack.gpu.gpu_class
"""

EXAMPLES = r"""
- name: Every offer of the catalog
  cozystack.gpu.gpu_class_info:
  register: catalog

- name: One offer
  cozystack.gpu.gpu_class_info:
    name: l40s-12c
  register: l40s
"""

RETURN = r"""
classes:
  description: The classes found, sorted by name; empty when O(name) does not exist.
  returned: always
  type: list
  elements: dict
"""

import copy

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_k8s


def argument_spec():
    spec = dict(name=dict(type="str"), label_selector=dict(type="str"))
    spec.update(copy.deepcopy(gpu_k8s.AUTH_ARG_SPEC))
    return spec


def run_module(module, api=None):
    params = module.params
    if api is None:
        try:
            api = gpu_k8s.GpuClassApi(gpu_k8s.make_api_client(params))
        except Exception as exc:  # kubeconfig problems come in many exception types
            module.fail_json(msg="cannot configure the Kubernetes client: %s" % exc)
    try:
        if params["name"]:
            found = api.get(params["name"])
            classes = [found] if found is not None else []
        else:
            classes = api.list(params["label_selector"])
    except gpu_k8s.ApiException as exc:
        module.fail_json(msg=gpu_k8s.api_error_message(exc), status=exc.status)
    module.exit_json(changed=False, classes=classes)


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def main():
    module = build_module()
    if not gpu_k8s.HAS_KUBERNETES:
        module.fail_json(
            msg=missing_required_lib("kubernetes"), exception=gpu_k8s.KUBERNETES_IMPORT_ERROR
        )
    run_module(module)


if __name__ == "__main__":
    main()
