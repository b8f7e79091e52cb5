"""The chart's pods as local processes (no kubelet runs here): :class:`LocalPods` plays the
Deployment and DaemonSet controllers and the kubelets of the chart's pods, and a local kubelet
process follows the installed objects as a cluster would (see ``platform``'s docstring)."""

from __future__ import annotations

import base64
import contextlib
import enum
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu_testkit import kubevirt
from cozystack_gpu_testkit.demo.run_state import (
    LOCAL_KUBELET,
    LOCAL_KUBELET_PERIOD,
    NAMESPACE,
    TOKEN_SECONDS,
    State,
    admin_client,
    installed,
    spawn,
    stop_process,
)
from cozystack_gpu_testkit.ports import free_port
from cozystack_gpu_testkit.webhook_route import host_address

# --- the chart's pods, as local processes ------------------------------------------------------

log = logging.getLogger(__name__)


class Rollout(enum.Enum):
    """What the local kubelet does with a running local pod on a pass."""

    KEEP = "keep"
    RESTART = "restart"  # its owner's pod template changed: a cluster would roll it
    STOP = "stop"  # its owner is gone: the garbage collector would delete the Pod
    START = "start"  # its owner is back (helm install after helm uninstall)


def template_hash(template: Mapping[str, Any]) -> str:
    """A short hash of a pod template (as Kubernetes' pod-template-hash names a template):
    key order does not count, every value does."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def rollout(started: str, owner: Mapping[str, Any] | None, *, stopped: bool = False) -> Rollout:
    """Restart a local pod when its Deployment's or DaemonSet's current pod template is not
    the one (``started``, its hash) its process was started from; stop it when the owner is
    gone; start a ``stopped`` one again when its owner is back (a reinstalled release names
    its Deployment and DaemonSet as before). Only the template counts: replicas, labels or
    status of the owner roll nothing."""
    if stopped:
        return Rollout.KEEP if owner is None else Rollout.START
    if owner is None:
        return Rollout.STOP
    if template_hash(owner["spec"]["template"]) != started:
        return Rollout.RESTART
    return Rollout.KEEP


def pod_root(directory: Path, node: str, container: str) -> Path:
    """A pod's root directory: short, for the unix socket paths below it."""
    return directory / "pods" / node / container


@dataclass
class LocalPod:
    name: str
    node: str
    ports: dict[str, int]  # container port name (or number) -> local port
    log: Path
    proc: subprocess.Popen[bytes]
    readiness: tuple[str, int] | None  # (path, local port) of the readiness probe
    obj: dict[str, Any]  # the Pod as created

    def log_tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class LocalPods:
    """Plays the Deployment and DaemonSet controllers and the kubelets of the chart's pods."""

    state: State
    api: Any
    detach: bool
    namespace: str = NAMESPACE

    @property
    def directory(self) -> Path:
        return Path(self.state.dir)

    def start(
        self,
        owner: dict[str, Any],
        pod_name: str,
        node: str,
        host_root: Path,
        *,
        ports: Mapping[str, int] | None = None,
    ) -> LocalPod:
        """Writes the Pod and starts its container as a local process. ``ports``: local
        ports to keep (by container port name) from the pod this one replaces, so what
        points at them (the webhook Service's endpoint) stays right."""
        template = owner["spec"]["template"]
        spec = template["spec"]
        (container,) = spec["containers"]
        pod = self._create_pod(owner, pod_name, node)
        kubeconfig = self._token_kubeconfig(pod, spec["serviceAccountName"])
        root = pod_root(self.directory, node, container["name"])
        self._mounts(root, spec, container, host_root)
        keep = ports or {}
        ports = {}
        for p in container.get("ports") or []:
            port_name = str(p.get("name") or p["containerPort"])
            ports[port_name] = keep.get(port_name) or free_port()
        by_number = {
            int(p["containerPort"]): ports[str(p.get("name") or p["containerPort"])]
            for p in container.get("ports") or []
        }
        fields = {
            "metadata.name": pod_name,
            "metadata.namespace": self.namespace,
            "spec.nodeName": node,
            "spec.serviceAccountName": spec["serviceAccountName"],
            "status.podIP": host_address(),
        }
        env: dict[str, str] = {}
        for entry in container.get("env") or []:
            if "valueFrom" in entry:
                value = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
            else:  # the API server leaves an empty value out
                value = expand_vars(str(entry.get("value", "")), env)
            env[entry["name"]] = localize(value, root, by_number)
        argv = [
            localize(expand_vars(arg, env), root, by_number)
            for arg in [*(container.get("command") or []), *(container.get("args") or [])]
        ]
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # the image's interpreter: this environment's
        # The image's code: a release's tree where the state names one for the image, else
        # this checkout's (the import path the demo runs with).
        code = self.state.images.get(str(container.get("image")), os.environ.get("PYTHONPATH"))
        process_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root),
            "LANG": "C.UTF-8",
            **({"PYTHONPATH": code} if code else {}),
            **env,
            "KUBECONFIG": str(kubeconfig),
        }
        log = self.directory / "logs" / f"{pod_name}.log"
        proc = spawn(
            self.state, f"pod/{pod_name}", argv, log=log, env=process_env, cwd=root,
            detach=self.detach,
        )  # fmt: skip
        probe = (container.get("readinessProbe") or {}).get("httpGet")
        readiness = None
        if probe:
            port = probe["port"]
            local = ports[str(port)] if str(port) in ports else by_number[int(port)]
            readiness = (str(probe["path"]), local)
        self.state.pods[pod_name] = {
            "kind": owner["kind"],
            "owner": owner["metadata"]["name"],
            "node": node,
            "host_root": str(host_root),
            "template": template_hash(template),
            "ports": ports,
        }
        self.state.save()
        return LocalPod(pod_name, node, ports, log, proc, readiness, pod)

    def sync(self) -> list[str]:
        """One pass of the local kubelet over the pods it started: restarts each whose
        owner's pod template changed (stop, then start: one replica on the same ports, where
        a cluster would surge a new one first), stops each whose owner is gone, and starts
        again one whose owner came back (its record stays, so it comes back on its node and
        ports). Returns a line per pod it acted on."""
        done = []
        for name, record in sorted(self.state.pods.items()):
            owner = self._owner(record)
            action = rollout(record["template"], owner, stopped=bool(record.get("stopped")))
            if action is Rollout.KEEP:
                continue
            old = self.state.processes.get(f"pod/{name}")
            stop_process(self.state, f"pod/{name}")
            what = f"pod {name}: {record['kind']} {record['owner']}"
            if owner is None:
                record["stopped"] = True
                self.state.save()
                done.append(f"{what} gone; pid {old} stopped")
                continue
            pod = self.start(
                owner, name, record["node"], Path(record["host_root"]), ports=record["ports"]
            )
            if action is Rollout.START:
                line = f"{what} back: pid {pod.proc.pid}"
            else:
                line = (
                    f"{what}'s pod template {record['template']} → "
                    f"{self.state.pods[name]['template']}: pid {old} → {pod.proc.pid}"
                )
            try:
                self.wait_ready(pod)
            except RuntimeError as exc:
                # Left as it is (not Ready; its log says why), as a cluster leaves a failed
                # rollout: its record has the new template, so only a next change restarts it.
                line += f", not ready: {exc}"
            done.append(line)
        return done

    def wait_ready(self, pod: LocalPod, timeout: float = 90.0) -> None:
        """Waits for the readiness probe to answer 200, then writes the pod Ready as its
        kubelet would."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while pod.readiness is not None:
            if pod.proc.poll() is not None:
                raise RuntimeError(
                    f"pod {pod.name} exited with {pod.proc.returncode}:\n{pod.log_tail()}"
                )
            path, port = pod.readiness
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as r:
                    if r.status == 200:
                        break
            except urllib.error.HTTPError as exc:
                last = f"{path} answered {exc.code}"
            except OSError as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"pod {pod.name} not ready after {timeout:.0f} s: {last}")
            time.sleep(0.3)
        self._status(pod.obj, ready=True)

    # --- helpers -------------------------------------------------------------------------

    def _owner(self, record: Mapping[str, Any]) -> dict[str, Any] | None:
        """The pod's Deployment or DaemonSet now, or None when it is gone."""
        try:
            return installed(self.api, record["kind"], record["owner"], self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _create_pod(self, owner: dict[str, Any], pod_name: str, node: str) -> dict[str, Any]:
        core = client.CoreV1Api(self.api)
        template = owner["spec"]["template"]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": self.namespace,
                "labels": dict(template["metadata"].get("labels") or {}),
                "annotations": dict(template["metadata"].get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": owner["apiVersion"],
                        "kind": owner["kind"],
                        "name": owner["metadata"]["name"],
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            # Bound to its node as the scheduler (or the DaemonSet controller) would.
            "spec": {**template["spec"], "nodeName": node},
        }
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(pod_name, self.namespace, grace_period_seconds=0)
        for _attempt in range(50):
            try:
                created: dict[str, Any] = self.api.sanitize_for_serialization(
                    core.create_namespaced_pod(self.namespace, body)
                )
                break
            except ApiException as exc:  # the earlier one is still going
                if exc.status != 409:
                    raise
                time.sleep(0.1)
        else:
            raise RuntimeError(f"pod {pod_name} from an earlier run does not go away")
        self._status(created, ready=False)
        return created

    def _status(self, pod: dict[str, Any], *, ready: bool) -> None:
        address = host_address()
        status = kubevirt.running_status(pod["spec"]["containers"], ready=ready)
        status.update({"podIP": address, "podIPs": [{"ip": address}], "hostIP": address})
        client.CoreV1Api(self.api).patch_namespaced_pod_status(
            pod["metadata"]["name"], self.namespace, {"status": status}
        )

    def _token_kubeconfig(self, pod: dict[str, Any], service_account: str) -> Path:
        """A kubeconfig with a token of ``service_account`` bound to ``pod``: the identity
        the pod's projected token volume would give it."""
        request = client.CoreV1Api(self.api).create_namespaced_service_account_token(
            service_account,
            self.namespace,
            {
                "spec": {
                    "expirationSeconds": TOKEN_SECONDS,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": pod["metadata"]["name"],
                        "uid": pod["metadata"]["uid"],
                    },
                }
            },
        )
        admin = yaml.safe_load(Path(self.state.kubeconfig).read_text())
        context = next(
            c["context"]
            for c in admin["contexts"]
            if c["name"] == admin.get("current-context", admin["contexts"][0]["name"])
        )
        server = next(c["cluster"] for c in admin["clusters"] if c["name"] == context["cluster"])
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": server}],
            "users": [{"name": service_account, "user": {"token": request.status.token}}],
            "contexts": [
                {
                    "name": "pod",
                    "context": {
                        "cluster": "cluster",
                        "user": service_account,
                        "namespace": self.namespace,
                    },
                }
            ],
            "current-context": "pod",
        }
        node = str(pod["spec"]["nodeName"])
        path = self.directory / "pods" / node / f"{service_account}.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def _mounts(
        self, root: Path, spec: dict[str, Any], container: dict[str, Any], host_root: Path
    ) -> None:
        """The pod's root directory: each volume mount a link to the volume's source."""
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        core = client.CoreV1Api(self.api)
        for mount in container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            if "hostPath" in volume:
                source = host_root / volume["hostPath"]["path"].lstrip("/")
                if volume["hostPath"].get("type") == "Directory" and not source.is_dir():
                    raise RuntimeError(f"hostPath {source} of {mount['name']} is not a directory")
            elif "secret" in volume:
                source = root.parent / f"{root.name}.volumes" / mount["name"]
                shutil.rmtree(source, ignore_errors=True)
                source.mkdir(parents=True)
                secret = core.read_namespaced_secret(volume["secret"]["secretName"], self.namespace)
                for key, data in (secret.data or {}).items():
                    (source / key).write_bytes(base64.b64decode(data))
            elif "emptyDir" in volume:
                source = root.parent / f"{root.name}.volumes" / mount["name"]
                shutil.rmtree(source, ignore_errors=True)
                source.mkdir(parents=True)
            else:
                raise RuntimeError(f"volume {mount['name']}: only hostPath, secret, emptyDir")
            target = root / mount["mountPath"].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)


def local_pid(directory: Path, pod: str) -> int | None:
    """The pid of a local pod's process now (the local kubelet writes the state)."""
    state = State.load(directory)
    return None if state is None else state.processes.get(f"pod/{pod}")


def process_env(pid: int | None) -> dict[str, str]:
    """A local process's environment as it was started (empty once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(e.split("=", 1) for e in raw.split("\0") if "=" in e)


def start_local_kubelet(state: State, *, detach: bool) -> int:
    """Starts the local kubelet process over the pods started so far; returns its pid. From
    then on it alone writes the state (the story starts no more pods)."""
    argv = [sys.executable, "-m", "cozystack_gpu_testkit.demo", "--dir", state.dir, "kubelet"]
    proc = spawn(
        state,
        LOCAL_KUBELET,
        [*argv, *(() if detach else ("--attached",))],
        log=Path(state.dir) / "logs" / f"{LOCAL_KUBELET}.log",
        detach=detach,
    )
    return proc.pid


def run_local_kubelet(directory: Path, *, detach: bool) -> None:
    """The local kubelet's loop (its own process, so it outlives ``make demo``): a
    :meth:`LocalPods.sync` pass every few seconds over the pods in the state, read again on
    each pass. It writes the state only when it restarts or stops a pod."""
    state = State.load(directory)
    if state is None:
        raise SystemExit(f"no demo in {directory}")
    api = admin_client(state.kubeconfig)
    log.info("following the pod templates of %s", ", ".join(sorted(state.pods)))
    while True:
        state = State.load(directory) or state
        try:
            for line in LocalPods(state, api, detach).sync():
                log.info("%s", line)
        except Exception as exc:  # the API server restarting, a pod that fails: next pass
            log.warning("pass failed: %s: %s", type(exc).__name__, exc)
        time.sleep(LOCAL_KUBELET_PERIOD)


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand_vars(value: str, env: Mapping[str, str]) -> str:
    """kubelet's $(VAR) expansion of the container's own variables."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), value)


def localize(value: str, root: Path, ports: Mapping[int, int]) -> str:
    """A container's path or port in an argument or variable, as the local process sees it."""
    flag, eq, rest = value.partition("=")
    if eq and flag.startswith("-") and rest.startswith("/"):
        return f"{flag}={root}{rest}"
    if value.startswith("/"):
        return f"{root}{value}"
    for container_port, local in ports.items():
        value = re.sub(rf"(?<![\d.]){container_port}(?!\d)", str(local), value)
    return value
