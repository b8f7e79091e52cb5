# Copyright: Cozystack GPU authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_node_layout's controller side: the host module, and around it the cluster.

The module runs on the GPU host (sysfs, sriov-manage); the Kubernetes part runs here, on the
Ansible controller, where the kubeconfig is. In order:

1. the module plans on the host (check mode: it writes nothing) and reports each function
   before and after, who uses it, and the labels the host will earn;
2. with ``node_name`` and a kubeconfig, ``gpu_layout_cluster.consequences`` works out what
   that does to claims (the controller's own placement model); without them the result
   says the consequences are unknown;
3. check mode stops here. Otherwise, when held units are affected: refuse while an affected
   claim is attached to a running VMI (unless ``force``), mark the Node
   ``layout-state=pending``, wait (bounded, with progress) until the binder has moved the
   unattached claims away, and look again for attached claims;
4. the module applies the layout on the host, told (``drained``) that no claim holds the
   units it takes any more, so vGPUs no VM uses may be replaced without ``force``;
5. the Node is marked ``applied`` with the labels the host now earns.
"""

from __future__ import annotations

import os
import time

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_keys
from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_layout_cluster as cluster
from ansible_collections.cozystack.gpu.plugins.module_utils.gpu_k8s import (
    AUTH_ARG_SPEC,
    api_error_message,
    make_api_client,
)

display = Display()

MODULE = "cozystack.gpu.gpu_node_layout"
# Read here, never sent to the host.
CLUSTER_ONLY = ("node_name", "drain_timeout", "drain_poll")
# Any of these (or their K8S_AUTH_ variables) says where the cluster is; without one the
# consequences are unknown rather than guessed from whatever ~/.kube/config holds.
WHERE = ("kubeconfig", "host")


class ActionModule(ActionBase):
    """Plan on the host, judge in the cluster, drain, apply, mark applied."""

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        try:
            result.update(self._run(dict(self._task.args), task_vars or {}))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    # --- the host ----------------------------------------------------------------------

    def _host(self, args, task_vars, check_mode):
        """The module on the host; the plan pass runs in check mode whatever the task says."""
        saved = self._task.check_mode
        self._task.check_mode = check_mode
        try:
            return self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)
        finally:
            self._task.check_mode = saved

    # --- the cluster -------------------------------------------------------------------

    def _cluster(self, auth, node):
        """An API client, or why there is none (a string)."""
        if not node:
            return "node_name is not set, so the claims on this host's Node are not known"
        given = any(auth.get(k) for k in WHERE) or any(
            os.environ.get("K8S_AUTH_" + k.upper()) for k in WHERE
        )
        if not given:
            return (
                "no kubeconfig was given (kubeconfig, or K8S_AUTH_KUBECONFIG), so the claims"
                f" on Node {node} are not known; the consequences are unknown"
            )
        try:
            return make_api_client({k: auth.get(k) for k in AUTH_ARG_SPEC})
        except Exception as exc:  # kubernetes.core reports a bad kubeconfig in many ways
            return f"cannot reach the cluster: {exc}"

    def _holds(self, api, node, planned):
        try:
            objects = cluster.read_cluster(api)
            return cluster.consequences(
                objects,
                node,
                planned.get("functions") or [],
                planned.get("node_labels") or {},
                (planned.get("layout") or {}).get("name"),
                time.time(),
                planned.get("unforeseen") or [],
            )
        except cluster.Unavailable as exc:
            return {"known": False, "why": str(exc)}
        except Exception as exc:  # the client's ApiException and network errors
            return {"known": False, "why": f"reading the cluster failed: {api_error_message(exc)}"}

    # --- the whole ---------------------------------------------------------------------

    def _run(self, args, task_vars):
        auth = {k: args.pop(k) for k in list(args) if k in AUTH_ARG_SPEC}
        node = args.pop("node_name", None)
        timeout = float(args.pop("drain_timeout", 600))
        poll = float(args.pop("drain_poll", 2.0))
        force = boolean(args.get("force", False), strict=False)
        cleared = boolean(args.pop("drained", False), strict=False)
        check_mode = bool(self._task.check_mode)
        diff = bool(self._task.diff)

        api = self._cluster(auth, node)
        if isinstance(api, str):
            holds = {"known": False, "why": api}
            api = None
        # Knowing the cluster, the plan is the one after the drain: vGPUs that no claim
        # holds any more (and no VM uses) may then be replaced without force.
        planned = self._host(
            dict(args, drained=cleared or api is not None), task_vars, check_mode=True
        )
        if api is not None:
            if planned.get("functions") is not None:
                holds = self._holds(api, node, planned)
            else:
                holds = {"known": False, "why": "the layout did not fit the host"}
            if not holds.get("known"):
                api = None
                planned = self._host(dict(args, drained=cleared), task_vars, check_mode=True)

        def finish(data, **extra):
            data = dict(data, holds=holds, **extra)
            if holds.get("breaks"):
                data["warnings"] = [
                    *data.get("warnings", []),
                    "force: this layout change breaks the VMIs " + ", ".join(holds["breaks"]),
                ]
            if diff and "diff" in data:
                data["diff"] = [data["diff"], {"prepared": cluster.render(holds)}]
            return data

        if planned.get("failed") or check_mode:
            return finish(planned)

        pending = False
        if api is not None:
            state = self._state(api, node)
            pending = state == "pending"
        if not planned.get("changed") and not pending:
            return finish(planned)

        marked = False
        if api is not None and holds.get("drain"):
            refusal, breaks = self._attached_refusal(holds["attached"], force)
            if refusal:
                return finish(planned, failed=True, changed=False, msg=refusal)
            holds["breaks"] = breaks
            log = []

            def progress(line):
                log.append(line)
                display.display(f"{self._task.get_name()}: {line}")

            try:
                # Read before the label goes on: the binder moves the first ones at once.
                present = cluster.unattached_on(api, node)
                cluster.set_layout_state(api, node, "pending")
                left = cluster.wait_for_drain(api, node, timeout, poll, progress)
                holds["drained"] = sorted(set(present) | set(left))
            except cluster.DrainTimeout as exc:
                return finish(planned, failed=True, changed=True, msg=str(exc), drain_log=log)
            losing = [c["class"] for c in holds["classes"] if c["after"] < c["before"]]
            late = [a for a in cluster.attached_on(api, node, losing) if not force]
            if late:
                return finish(
                    planned,
                    failed=True,
                    changed=True,
                    drain_log=log,
                    msg=(
                        "while the node drained, claims of classes losing units here were"
                        " attached to VMIs: "
                        + ", ".join(f"{a['claim']} (VMI {a['vmi']})" for a in late)
                        + f". The Node {node} stays layout-state=pending; stop those VMs"
                        " and run again, or set force: true to break them"
                    ),
                )
            holds["drain_log"] = log
            marked = True

        applied = self._host(
            dict(args, drained=cleared or api is not None), task_vars, check_mode=False
        )
        if applied.get("failed"):
            if marked or pending:
                applied["msg"] = (
                    f"{applied.get('msg', '')}. The Node {node} stays layout-state=pending (it"
                    " serves no class) until a run applies the layout"
                )
            return finish(applied)
        if api is not None:
            labels = dict(applied.get("node_labels") or {})
            name = (applied.get("layout") or {}).get("name")
            if name:
                labels[gpu_keys.LABEL_NODE_LAYOUT] = gpu_keys.node_label_name(name)
            if cluster.set_layout_state(api, node, "applied", labels):
                applied["changed"] = True
        return finish(applied)

    def _state(self, api, node):
        from kubernetes import client  # only here: the host part never needs it

        labels = client.CoreV1Api(api).read_node(node).metadata.labels or {}
        return labels.get(gpu_keys.LABEL_NODE_LAYOUT_STATE)

    @staticmethod
    def _attached_refusal(attached, force):
        """(the refusal while affected claims are attached to running VMIs, or None; the
        VMIs a forced run breaks)."""
        affected = [a for a in attached if a["affected"]]
        vmis = sorted({a["vmi"] for a in affected})
        if not affected:
            return None, []
        if force:
            return None, vmis
        claims = ", ".join(f"{a['claim']} (VMI {a['vmi']})" for a in affected)
        return (
            f"refusing to change the layout: claims attached to running VMIs hold units it"
            f" takes: {claims}. Stop those VMs (their claims then move with the drain), or set"
            f" force: true to break {', '.join(vmis)}"
        ), []
