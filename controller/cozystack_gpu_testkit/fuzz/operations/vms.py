"""What tenants do to VMs: create one with held claims and/or claim templates, one with an odd
claims annotation and a raw GPU entry, one on a network that names the GPU resource, one at a
preempting priority, one with a claims annotation beyond the limits; stop, start, restart
(the guest powers off) and delete it, or delete its VMI; live-migrate it, and cancel a
migration (SPEC §12)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.objects import MutableObj
from cozystack_gpu_testkit import kubevirt
from cozystack_gpu_testkit.fault_suite import Run
from cozystack_gpu_testkit.fuzz.stage import FuzzVM, Stage, labelled_template
from cozystack_gpu_testkit.objects import message_of

# The NetworkAttachmentDefinition of each tenant whose k8s.v1.cni.cncf.io/resourceName is the
# world's GPU resource: a VM on it would get a launcher pod asking a unit beyond its claims.
GPU_NAD = "gpu-net"
# Odd claims-annotation shapes (None: no annotation) and whether the reference label goes
# with them; each VM made of one also carries a raw GPU entry of its own.
ODD_SHAPES: tuple[tuple[str | None, bool], ...] = (
    ("", False),
    ("", True),
    (" ", True),
    ("{}", True),
    ('{"claims": []}', True),
    ("{not json", True),
    (None, True),
    ('{"claims": ["x"]}', False),
)


def create_vm(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """A VM that holds some of its tenant's claims and/or orders from templates."""
    world = run.world
    namespace = stage.rng.choice(world.tenants)
    used = {
        c for vm in stage.vms.values() if vm.namespace == namespace and not vm.gone
        for c in vm.held
    }  # fmt: skip
    free = [
        n for n in stage.tenant_claims(namespace)
        if n not in used and not labelled_template(stage.claims[(namespace, n)])
    ]  # fmt: skip
    held = tuple(stage.rng.sample(free, k=min(len(free), stage.rng.choice((0, 1, 1, 2)))))
    templates: tuple[Mapping[str, Any], ...] = ()
    if not held or stage.rng.random() < 0.4:
        held_class = (
            str((stage.claims[(namespace, held[0])].get("spec") or {}).get("class")) if held else ""
        )
        templates = (
            {
                "name": stage.rng.choice(("gpu", "extra")),
                # One class with held claims most of the time: a set across pools never
                # places, and stays gated (with its reason). A dra class has no templates.
                "class": (
                    held_class
                    if held_class in world.template_classes and stage.rng.random() < 0.8
                    else stage.rng.choice(world.template_classes)
                ),
                "count": 1 if stage.rng.random() < 0.8 else 2,
            },
        )
    vm = FuzzVM(namespace, stage.next_name("vm"), held, templates)
    request: MutableObj = {}
    if held:
        request[keys.ANNOTATION_MEMBER_CLAIMS] = list(held)
    if templates:
        request[keys.ANNOTATION_MEMBER_TEMPLATES] = [dict(t) for t in templates]
    labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
    notes = {keys.ANNOTATION_CLAIMS: json.dumps(request)}
    body = stage.vm_body(vm, labels, notes, [])
    names = {vm.name, *held, *(stage.template_name(vm, t) for t in templates)}
    args = f"{namespace}/{vm.name} {json.dumps(request, sort_keys=True)}"
    return stage.submit_vm(vm, body, args, names)


def odd_vm(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    world = run.world
    namespace = stage.rng.choice(world.tenants)
    note, labelled = stage.rng.choice(ODD_SHAPES)
    vm = FuzzVM(namespace, stage.next_name("odd"), (), (), odd=True)
    labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE} if labelled else {}
    notes = {keys.ANNOTATION_CLAIMS: note} if note is not None else {}
    gpus = [{"name": "raw0", "deviceName": world.resource}]
    body = stage.vm_body(vm, labels, notes, gpus)
    args = f"{namespace}/{vm.name} annotation {note!r} label {labelled} raw gpus 1"
    return stage.submit_vm(vm, body, args, {vm.name})


def nad_vm(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """A VM with a claim template and a multus network on the tenant's definition that
    names the GPU resource: KubeVirt renders a launcher pod asking a unit more than the
    template. The VMI webhook refuses it (or, the definition unread, the gate keeps the
    pod gated); a pod that starts so is ``SURPLUS``."""
    world = run.world
    namespace = stage.rng.choice(world.tenants)
    if (namespace, GPU_NAD) not in stage.nads:
        run.kube.nad(namespace, GPU_NAD, world.resource)
        stage.nads.add((namespace, GPU_NAD))
    template = {"name": "gpu", "class": stage.rng.choice(world.template_classes), "count": 1}
    vm = FuzzVM(namespace, stage.next_name("net"), (), (template,))
    request = {keys.ANNOTATION_MEMBER_TEMPLATES: [template]}
    labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
    body = stage.vm_body(vm, labels, {keys.ANNOTATION_CLAIMS: json.dumps(request)}, [])
    spec = body["spec"]["template"]["spec"]
    spec["domain"]["devices"]["interfaces"] = [
        {"name": "default", "masquerade": {}},
        {"name": "gpu-net", "bridge": {}},
    ]
    spec["networks"] = [
        {"name": "default", "pod": {}},
        {"name": "gpu-net", "multus": {"networkName": GPU_NAD}},
    ]
    names = {vm.name, stage.template_name(vm, template)}
    args = f"{namespace}/{vm.name} template {template['class']} x1, network on {GPU_NAD}"
    return stage.submit_vm(vm, body, args, names)


def stop_vm(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    vm = stage.pick_vm()
    if vm is None:
        return "", "no VM", set()
    stage.run_strategy(vm, "Halted")
    return f"{vm.namespace}/{vm.name}", "runStrategy Halted", stage.names(vm)


def start_vm(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    vm = stage.pick_vm()
    if vm is None:
        return "", "no VM", set()
    stage.run_strategy(vm, "Always")
    return f"{vm.namespace}/{vm.name}", "runStrategy Always", stage.names(vm)


def restart_vm(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """The guest shuts itself down: virt-handler reports the VMI Succeeded, and
    runStrategy Always starts the next VMI under the same name."""
    vm = stage.pick_vm(odd=False)
    if vm is None:
        return "", "no VM", set()
    outcome = stage.kubevirt.guest_shuts_down(vm.namespace, vm.name)
    return f"{vm.namespace}/{vm.name}", outcome, stage.names(vm)


def delete_vmi(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """``kubectl delete vmi``: once its guest is shut down and its pod gone, the VM
    (runStrategy Always) starts a new one at once."""
    vm = stage.pick_vm(odd=False)
    if vm is None:
        return "", "no VM", set()
    # As the admin: KubeVirt's tenant roles, which would let the tenant, are not here.
    delete = run.kube.custom.delete_namespaced_custom_object
    stage.vmi_call(delete, vm.namespace, vm.name)
    return f"{vm.namespace}/{vm.name}", "VMI deleted", stage.names(vm)


def delete_vm(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    vm = stage.pick_vm()
    if vm is None:
        return "", "no VM", set()
    stage.vm_call(stage.tenant.custom.delete_namespaced_custom_object, vm.namespace, vm.name)
    vm.gone = True
    return f"{vm.namespace}/{vm.name}", "VM deleted", stage.names(vm)


def preempting_vm(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """A VM of one claim template whose pods would run at system-node-critical priority:
    its launcher pod, gated at creation, would have kube-scheduler evict another tenant's
    running launcher pod for its unit. The launcher-gate policy refuses such a pod (its
    priority above launcherPolicy.maxPriority, preemption on), so the VM never starts."""
    world = run.world
    namespace = stage.rng.choice(world.tenants)
    template = {"name": "gpu", "class": stage.rng.choice(world.template_classes), "count": 1}
    vm = FuzzVM(namespace, stage.next_name("prio"), (), (template,))
    request = {keys.ANNOTATION_MEMBER_TEMPLATES: [template]}
    labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
    body = stage.vm_body(vm, labels, {keys.ANNOTATION_CLAIMS: json.dumps(request)}, [])
    body["spec"]["template"]["spec"]["priorityClassName"] = "system-node-critical"
    names = {vm.name, stage.template_name(vm, template)}
    args = f"{namespace}/{vm.name} template {template['class']} x1, system-node-critical"
    return stage.submit_vm(vm, body, args, names)


# Claims annotations beyond what a tenant may write (16 KiB, 64 claims and templates): a
# replica would keep every such value of every VM in memory.
HUGE_SHAPES = ("many", "long")


def huge_annotation_vm(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """A VM whose claims annotation is beyond the limits: 65 claims, or one list of 17 KiB.
    The VM webhook refuses it at create with the limit named (and the VMI webhook would
    refuse each start of it)."""
    namespace = stage.rng.choice(run.world.tenants)
    shape = stage.rng.choice(HUGE_SHAPES)
    vm = FuzzVM(namespace, stage.next_name("huge"), (), (), odd=True)
    if shape == "many":
        claims = [f"c{i:03d}" for i in range(65)]
    else:
        claims = [f"c{i:03d}-" + "x" * 240 for i in range(72)]  # about 17.5 KiB of JSON
    note = json.dumps({keys.ANNOTATION_MEMBER_CLAIMS: claims})
    labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
    body = stage.vm_body(vm, labels, {keys.ANNOTATION_CLAIMS: note}, [])
    args = f"{namespace}/{vm.name} claims annotation of {len(claims)} claims, {len(note)} bytes"
    return stage.submit_vm(vm, body, args, {vm.name})


def migrate_vm(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """The tenant live-migrates a running VM: virt-controller makes the target pod, the
    binder places the set's target and pins it, and the kit's virt-handler lands the VM
    there once it runs (``kubevirt.stand_in``)."""
    running = sorted(
        (vm.namespace, vm.name) for vm in stage.vms.values()
        if not vm.gone and not vm.odd and (vm.namespace, vm.name) in stage.kubevirt.running
    )  # fmt: skip
    if not running:
        return "", "no running VM", set()
    namespace, name = stage.rng.choice(running)
    vmi = kubevirt.get_vmi(run.kube, namespace, name)
    if vmi is None or not kubevirt.is_migratable(vmi):
        return f"{namespace}/{name}", "not migratable yet", {name}
    job = stage.next_name("mig")
    try:
        # As the tenant admin: kubevirt.io:admin, aggregated into admin, lets it migrate.
        kubevirt.migrate(stage.tenant, namespace, name, job)
    except ApiException as exc:
        return f"{namespace}/{name}", f"refused: {message_of(exc)[:120]}", {name}
    stage.migrations.add((namespace, job))
    return f"{namespace}/{name} {job}", "migration created", {name, job}


def cancel_migration(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """The tenant deletes a migration: one not done yet is aborted (its target pod goes,
    and its target with it); one done is only its record."""
    if not stage.migrations:
        return "", "no migration", set()
    namespace, job = stage.rng.choice(sorted(stage.migrations))
    stage.migrations.discard((namespace, job))
    try:
        stage.tenant.custom.delete_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, namespace, kubevirt.MIGRATIONS, job
        )
    except ApiException as exc:
        return f"{namespace}/{job}", f"error {exc.status}", {job}
    return f"{namespace}/{job}", "migration deleted", {job}
