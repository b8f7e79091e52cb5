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
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(frozen=True)
class _Task:
    """The task as this plugin reads it: what the module on the host gets, what stays here."""

    module_args: dict[str, Any]
    auth: dict[str, Any]
    node: str | None
    drain_timeout: float
    drain_poll: float
    force: bool
    # The task says the node's holds are moved off already (the module's own argument).
    drained: bool
    check_mode: bool
    diff: bool


@dataclass
class _Judged:
    """The module's plan on the host and what it does to claims (``holds``).

    ``api`` is None when the consequences are unknown: then nothing here touches the
    cluster, and the plan is the one without the drain.
    """

    planned: dict[str, Any]
    holds: dict[str, Any]
    api: Any | None
    # This run marked the Node layout-state=pending and the binder drained it.
    marked: bool = False
    drain_log: list[str] = field(default_factory=list)


class ActionModule(ActionBase):
    """Plan on the host, judge in the cluster, drain, apply, mark applied."""

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        del tmp
        try:
            result.update(self._run(dict(self._task.args), task_vars or {}))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _run(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        """Gather the task, plan and judge it, drain, apply: the steps of the docstring above,
        one method each. Every way out goes through ``_report``."""
        task = self._gather(args)
        judged = self._plan(task, task_vars)
        if judged.planned.get("failed") or task.check_mode:
            return self._report(task, judged, judged.planned)
        pending = judged.api is not None and self._state(judged.api, task.node) == "pending"
        # A Node an earlier run left pending is finished even when the host needs no change.
        if not judged.planned.get("changed") and not pending:
            return self._report(task, judged, judged.planned)
        refused = self._drain(task, judged)
        if refused is not None:
            return self._report(task, judged, judged.planned, **refused)
        return self._report(task, judged, self._apply(task, task_vars, judged, pending))

    # --- the task -----------------------------------------------------------------------

    def _gather(self, args: dict[str, Any]) -> _Task:
        """Split the task's arguments: the cluster's stay here, the rest go to the host."""
        auth = {k: args.pop(k) for k in list(args) if k in AUTH_ARG_SPEC}
        node = args.pop("node_name", None)
        timeout = float(args.pop("drain_timeout", 600))
        poll = float(args.pop("drain_poll", 2.0))
        drained = boolean(args.pop("drained", False), strict=False)
        return _Task(
            module_args=args,
            auth=auth,
            node=node,
            drain_timeout=timeout,
            drain_poll=poll,
            force=boolean(args.get("force", False), strict=False),
            drained=drained,
            check_mode=bool(self._task.check_mode),
            diff=bool(self._task.diff),
        )

    # --- the plan and its consequences --------------------------------------------------

    def _plan(self, task: _Task, task_vars: dict[str, Any]) -> _Judged:
        """The module's plan on the host (check mode), judged in the cluster when it can be."""
        api = self._cluster(task.auth, task.node)
        if isinstance(api, str):
            planned = self._host(dict(task.module_args, drained=task.drained), task_vars, True)
            return _Judged(planned=planned, holds={"known": False, "why": api}, api=None)
        # Knowing the cluster, the plan is the one after the drain: vGPUs that no claim
        # holds any more (and no VM uses) may then be replaced without force.
        planned = self._host(dict(task.module_args, drained=True), task_vars, True)
        if planned.get("functions") is not None:
            holds = self._holds(api, task.node, planned)
        else:
            holds = {"known": False, "why": "the layout did not fit the host"}
        if holds.get("known"):
            return _Judged(planned=planned, holds=holds, api=api)
        # Not knowing what the change does to claims, nothing is drained: plan without it.
        planned = self._host(dict(task.module_args, drained=task.drained), task_vars, True)
        return _Judged(planned=planned, holds=holds, api=None)

    def _host(
        self, args: dict[str, Any], task_vars: dict[str, Any], check_mode: bool
    ) -> dict[str, Any]:
        """The module on the host; the plan pass runs in check mode whatever the task says."""
        saved = self._task.check_mode
        self._task.check_mode = check_mode
        try:
            result: dict[str, Any] = self._execute_module(
                module_name=MODULE, module_args=args, task_vars=task_vars
            )
            return result
        finally:
            self._task.check_mode = saved

    def _cluster(self, auth: dict[str, Any], node: str | None) -> Any:
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

    def _holds(self, api: Any, node: str | None, planned: dict[str, Any]) -> dict[str, Any]:
        try:
            objects = cluster.read_cluster(api)
            return cluster.consequences(
                objects,
                str(node),
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

    def _state(self, api: Any, node: str | None) -> str | None:
        from kubernetes import client  # only here: the host part never needs it

        labels = client.CoreV1Api(api).read_node(node).metadata.labels or {}
        state: str | None = labels.get(gpu_keys.LABEL_NODE_LAYOUT_STATE)
        return state

    # --- the drain ----------------------------------------------------------------------

    def _drain(self, task: _Task, judged: _Judged) -> dict[str, Any] | None:
        """Move the held units the change takes off the node, when it takes any: refuse
        while an affected claim is attached to a running VMI (unless ``force``), mark the
        Node pending, wait for the binder, and look again for attached claims. None when
        the host may be changed; otherwise what the run fails with."""
        api, node, holds = judged.api, str(task.node), judged.holds
        if api is None or not holds.get("drain"):
            return None
        refusal, breaks = self._attached_refusal(holds["attached"], task.force)
        if refusal:
            return {"failed": True, "changed": False, "msg": refusal}
        holds["breaks"] = breaks
        log = judged.drain_log

        def progress(line: str) -> None:
            log.append(line)
            display.display(f"{self._task.get_name()}: {line}")

        try:
            # Read before the label goes on: the binder moves the first ones at once.
            present = cluster.unattached_on(api, node)
            cluster.set_layout_state(api, node, "pending")
            left = cluster.wait_for_drain(
                api, node, task.drain_timeout, task.drain_poll, progress, before=present
            )
            holds["drained"] = sorted(set(present) | set(left))
        except cluster.DrainTimeout as exc:
            return {"failed": True, "changed": True, "msg": str(exc), "drain_log": log}
        losing = [c["class"] for c in holds["classes"] if c["after"] < c["before"]]
        late = [a for a in cluster.attached_on(api, node, losing) if not task.force]
        if late:
            return {
                "failed": True,
                "changed": True,
                "drain_log": log,
                "msg": (
                    "while the node drained, claims of classes losing units here were"
                    " attached to VMIs: "
                    + ", ".join(f"{a['claim']} (VMI {a['vmi']})" for a in late)
                    + f". The Node {node} stays layout-state=pending; stop those VMs"
                    " and run again, or set force: true to break them"
                ),
            }
        holds["drain_log"] = log
        judged.marked = True
        return None

    @staticmethod
    def _attached_refusal(
        attached: list[dict[str, Any]], force: bool
    ) -> tuple[str | None, list[str]]:
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

    # --- the change ---------------------------------------------------------------------

    def _apply(
        self, task: _Task, task_vars: dict[str, Any], judged: _Judged, pending: bool
    ) -> dict[str, Any]:
        """The module applies the layout on the host, then the Node is marked applied with
        the labels the host now earns. Told (``drained``) that no claim holds the units it
        takes any more, it may replace vGPUs no VM uses without ``force``."""
        api = judged.api
        applied = self._host(
            dict(task.module_args, drained=task.drained or api is not None), task_vars, False
        )
        if applied.get("failed"):
            if judged.marked or pending:
                applied["msg"] = (
                    f"{applied.get('msg', '')}. The Node {task.node} stays layout-state=pending"
                    " (it serves no class) until a run applies the layout"
                )
            return applied
        if api is not None:
            labels = dict(applied.get("node_labels") or {})
            name = (applied.get("layout") or {}).get("name")
            if name:
                labels[gpu_keys.LABEL_NODE_LAYOUT] = gpu_keys.node_label_name(name)
            if cluster.set_layout_state(api, str(task.node), "applied", labels):
                applied["changed"] = True
        return applied

    # --- the report ---------------------------------------------------------------------

    @staticmethod
    def _report(task: _Task, judged: _Judged, data: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """``data`` with the consequences for claims, and what a forced run breaks."""
        holds = judged.holds
        data = dict(data, holds=holds, **extra)
        if holds.get("breaks"):
            data["warnings"] = [
                *data.get("warnings", []),
                "force: this layout change breaks the VMIs " + ", ".join(holds["breaks"]),
            ]
        if task.diff and "diff" in data:
            data["diff"] = [data["diff"], {"prepared": cluster.render(holds)}]
        return data
