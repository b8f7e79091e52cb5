"""The driver: one seed's run (``LifecycleFuzz.run``) on a control plane of its own. Each
step KubeVirt takes its pass, killed replicas due back start again and the claims are
listed (``_tick``), then one operation is drawn by its weight (``_operate``) and journaled;
every fifth step, and while the run settles, the driver's own looks
(``invariants.driver_looks``). At the end every fault is undone and the run settles; each
violation comes with the operations that touched its subject (``_finding``)."""

from __future__ import annotations

import datetime
import logging
import time
from pathlib import Path

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.objects.translate import meta
from cozystack_gpu_testkit.fault_suite import Run
from cozystack_gpu_testkit.fuzz.journal import Finding, Journal
from cozystack_gpu_testkit.fuzz.operations import OPERATIONS
from cozystack_gpu_testkit.fuzz.operations.nodes import restore
from cozystack_gpu_testkit.fuzz.settings import FuzzResult, FuzzSettings
from cozystack_gpu_testkit.fuzz.setup import Admission, prepare
from cozystack_gpu_testkit.fuzz.stage import Stage
from cozystack_gpu_testkit.invariants import Invariants, Violation
from cozystack_gpu_testkit.invariants.driver_looks import look_stranded, look_surplus, orphans
from cozystack_gpu_testkit.kubevirt.stand_in import vm_of
from cozystack_gpu_testkit.objects import TIMEOUT, message_of

log = logging.getLogger(__name__)

REPORT_EVERY_S = 60.0


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class LifecycleFuzz:
    """One seed's run; ``run()`` returns its result."""

    def __init__(self, workdir: Path, admission: Admission, settings: FuzzSettings) -> None:
        self.workdir = workdir
        self.admission = admission
        self.settings = settings
        self.journal = Journal(settings.seed)
        self.stage = Stage(settings.seed, self.journal)
        self.outcomes: dict[str, int] = {}
        self.stranded: dict[str, str] = {}  # pod -> violation
        self.surplus: dict[str, str] = {}  # pod -> violation
        self._reported = time.monotonic()

    # --- the run -------------------------------------------------------------------------

    def run(self) -> FuzzResult:
        settings = self.settings
        stage = self.stage
        started = time.monotonic()
        name = f"fz{settings.seed % 1000}"
        with Run(
            name,
            self.workdir,
            nodes=settings.nodes,
            gpus=settings.gpus,
            dra_nodes=settings.dra_nodes,
            webhooks=True,
            replica_args=("--raw-resource-names", "forbidden"),
        ) as run:
            stage.run = run
            run.load = None  # the fuzz is the load: the suite's own never starts
            hooks = prepare(run, self.admission, stage)
            service = stage.service
            checker = Invariants(run.api)
            stage.checker = checker
            first_seen: dict[str, int] = {}
            try:
                with checker.watching():
                    for _op in range(settings.operations):
                        self._tick(run)
                        self._operate(run)
                        self._note(checker, first_seen)
                        if _op % 5 == 4:
                            self._look_stranded(run, first_seen)
                            self._look_surplus(run, first_seen)
                        time.sleep(stage.rng.uniform(*settings.pause_s))
                    final = self._settle(run, checker, first_seen)
            finally:
                self.admission.webhooks.remove(run.api, hooks)
                service.down()
            violations = [str(v) for v in checker.seen]
            violations += [str(v) for v in final if str(v) not in violations]
            for v in final:
                first_seen.setdefault(str(v), self.journal.last)
            for text, index in stage.kubevirt.raw_admitted:
                violations.append(text)
                first_seen.setdefault(text, index)
            violations += list(self.stranded.values())
            violations += list(self.surplus.values())
            for text, index in stage.forged:
                violations.append(text)
                first_seen.setdefault(text, index)
            findings = [self._finding(v, first_seen.get(v, self.journal.last)) for v in violations]
            return FuzzResult(
                seed=settings.seed,
                operations=settings.operations,
                faults=stage.faults,
                kills=stage.kills,
                checks=checker.checks,
                looks=checker.looks,
                starts=stage.kubevirt.starts,
                violations=violations,
                findings=findings,
                outcomes=dict(sorted(self.outcomes.items())),
                wall_s=time.monotonic() - started,
            )

    def _note(self, checker: Invariants, first_seen: dict[str, int]) -> None:
        for violation in list(checker.seen):
            first_seen.setdefault(str(violation), self.journal.last)

    def _tick(self, run: Run) -> None:
        """KubeVirt's pass, replicas due back, node agents' reports, the claim listing."""
        stage = self.stage
        now = time.monotonic()
        for identity, due in list(stage.killed):
            if now >= due:
                run.replicas[identity].restart()
                stage.killed.remove((identity, due))
                self.journal.record("controller", identity, "started again", {identity})
        if now - self._reported >= REPORT_EVERY_S:
            for node in run.world.gpu_nodes:
                run.kube.custom.patch_cluster_custom_object_status(
                    keys.GROUP, keys.VERSION, keys.PLURAL_NODES, node,
                    {"status": {"updatedAt": _now()}}, _request_timeout=TIMEOUT,
                )  # fmt: skip
            self._reported = now
        try:
            stage.kubevirt.reconcile()
            listing = run.kube.custom.list_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_CLAIMS, _request_timeout=TIMEOUT
            )
        except Exception as exc:  # a webhook or the server away for a moment: next tick
            log.debug("tick: %s", exc)
            return
        world = run.world
        stage.claims = {
            (meta(c)["namespace"], meta(c)["name"]): c
            for c in listing.get("items") or []
            if meta(c)["namespace"] in world.tenants
        }

    def _settle(self, run: Run, checker: Invariants, first_seen: dict[str, int]) -> list[Violation]:
        """Every fault undone, then KubeVirt keeps playing until every rule holds (or the
        settle time passes): the last look's violations."""
        stage = self.stage
        for node in list(stage.faulted):
            restore(stage, run, node, op="end_restore")
        for identity, _due in list(stage.killed):
            run.replicas[identity].restart()
        stage.killed.clear()
        deadline = time.monotonic() + self.settings.settle_s
        calm_until = time.monotonic() + 20.0  # VMs started by the last operations run
        final: list[Violation] = []
        while True:
            self._tick(run)
            self._note(checker, first_seen)
            self._look_stranded(run, first_seen)
            self._look_surplus(run, first_seen)
            try:
                final = checker.settled() + orphans(run.kube, run.world.tenants, stage.claims)
            except Exception as exc:
                final = [Violation("look", "cluster", f"{type(exc).__name__}: {exc}")]
            now = time.monotonic()
            if (not final and now >= calm_until) or now >= deadline:
                return final
            time.sleep(1.0)

    # --- the driver's own looks ----------------------------------------------------------

    def _look_stranded(self, run: Run, first_seen: dict[str, int]) -> None:
        for key, text in look_stranded(run.kube, self.stranded):
            self._found(self.stranded, key, text, first_seen)

    def _look_surplus(self, run: Run, first_seen: dict[str, int]) -> None:
        for key, text in look_surplus(run.kube, run.world.resource, self.surplus):
            self._found(self.surplus, key, text, first_seen)

    def _found(self, rule: dict[str, str], key: str, text: str, first_seen: dict[str, int]) -> None:
        """A violation of one of the driver's own look rules, once per subject."""
        rule[key] = text
        first_seen.setdefault(text, self.journal.last)
        log.error("seed %d: %s", self.settings.seed, text)

    def _finding(self, violation: str, first: int) -> Finding:
        names = set()
        for part in violation.replace(",", " ").replace(":", " ").split():
            name = part.split("/")[-1]
            names.add(name)
            if name.startswith("virt-launcher-"):
                names.add(vm_of(name))
        stage = self.stage
        vm_names = {
            vm.name
            for vm in stage.vms.values()
            if names & ({vm.name, *vm.held} | {stage.template_name(vm, t) for t in vm.templates})
        }
        names |= vm_names
        for vm in stage.vms.values():
            if vm.name in vm_names:
                names |= set(vm.held) | {stage.template_name(vm, t) for t in vm.templates}
        steps = tuple(str(e) for e in self.journal.touching(names, first))
        return Finding(violation, first, steps)

    # --- operations ----------------------------------------------------------------------

    def _operate(self, run: Run) -> None:
        weights = self.settings.weights
        ops = sorted(weights)
        op = self.stage.rng.choices(ops, weights=[weights[o] for o in ops])[0]
        action = OPERATIONS[op]
        try:
            args, outcome, names = action(self.stage, run)
        except ApiException as exc:
            args, outcome, names = "", f"error {exc.status}: {message_of(exc)}", set()
        except Exception as exc:  # the server away (a kill, a fault): the run goes on
            args, outcome, names = "", f"error {type(exc).__name__}: {exc}", set()
        key = f"{op}: {outcome.split(':', 1)[0].split(' (', 1)[0]}"
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        self.journal.record(op, args, outcome, names)


def run_seed(workdir: Path, admission: Admission, settings: FuzzSettings) -> FuzzResult:
    """One seed on a control plane of its own."""
    return LifecycleFuzz(workdir, admission, settings).run()
