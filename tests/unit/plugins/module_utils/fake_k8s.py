"""An in-memory stand-in for GpuClassApi that behaves like the API server where it matters.

It applies the CRD's default (onCordon: Move), refuses a mode change with the CRD's CEL
message in a 422 Status body, bumps resourceVersion and generation on every write, and
honours dry runs. The real server is exercised by controller/tests/integration.
"""

from __future__ import annotations

import copy
import json

from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_k8s


def status_error(code, message):
    exc = gpu_k8s.ApiException(status=code, reason="Invalid")
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": code})
    return exc


class FakeClassApi:
    def __init__(self, *objects, nodes=None, nodes_error=None, device_classes=()):
        # Node name -> status.allocatable; nodes_error is raised instead of listing them.
        self.nodes = dict(nodes or {})
        self.nodes_error = nodes_error
        self.device_classes = set(device_classes)
        self.objects = {}
        self.writes = []
        self.version = 100
        for obj in objects:
            self._store(copy.deepcopy(obj))

    def _store(self, obj):
        self.version += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self.version)
        meta["generation"] = meta.get("generation", 0) + 1
        meta["managedFields"] = [{"manager": "fake", "time": str(self.version)}]
        obj["spec"].setdefault("onCordon", "Move")
        self.objects[meta["name"]] = obj
        return obj

    def get(self, name):
        return copy.deepcopy(self.objects.get(name))

    def list(self, label_selector=None):
        items = [copy.deepcopy(self.objects[name]) for name in sorted(self.objects)]
        if label_selector:
            key, _sep, value = label_selector.partition("=")
            items = [o for o in items if (o["metadata"].get("labels") or {}).get(key) == value]
        return items

    def create(self, body, dry_run):
        name = body["metadata"]["name"]
        if name in self.objects:
            raise status_error(409, f'gpuclasses.gpu.cozystack.io "{name}" already exists')
        if dry_run:
            obj = copy.deepcopy(body)
            obj["spec"].setdefault("onCordon", "Move")
            return obj
        self.writes.append(("create", name))
        return copy.deepcopy(self._store(copy.deepcopy(body)))

    def replace(self, name, body, dry_run):
        old = self.objects[name]
        if body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
            raise status_error(409, "the object has been modified")
        if body["spec"].get("mode") != old["spec"].get("mode"):
            raise status_error(
                422,
                f'GPUClass.gpu.cozystack.io "{name}" is invalid: spec.mode: Invalid value: "string":'
                " mode is immutable; create a new GPUClass instead",
            )
        obj = copy.deepcopy(body)
        obj["spec"].setdefault("onCordon", "Move")
        if dry_run:
            return obj
        self.writes.append(("replace", name))
        obj["metadata"]["generation"] = old["metadata"]["generation"]
        return copy.deepcopy(self._store(obj))

    def delete(self, name, dry_run):
        if name not in self.objects:
            raise status_error(404, "not found")
        if not dry_run:
            self.writes.append(("delete", name))
            del self.objects[name]

    def device_class_exists(self, name):
        return name in self.device_classes

    def node_allocatable(self):
        if self.nodes_error is not None:
            raise self.nodes_error
        return copy.deepcopy(self.nodes)
