"""execute_steps: each step runs through its own handler, is read back, and stops the run when it fails."""

from __future__ import annotations

import pytest
from ansible_collections.cozystack.gpu.plugins.module_utils import (
    gpu_layout_apply,
    gpu_layout_plan,
)

H100 = "0000:5d:00.0"  # the mixed scenario's H100 on the nvidia driver


def bind_vfio(address):
    return gpu_layout_plan.Step(
        action=gpu_layout_plan.BIND_VFIO, target=address, gpu=address, reason="test"
    )


def test_an_unknown_action_fails_naming_it_and_later_steps_do_not_run(build, kernel):
    tree = build(scenario="mixed")
    writer = kernel(tree)
    odd = gpu_layout_plan.Step(action="reset_gpu", target=H100, gpu=H100, reason="never")
    with pytest.raises(gpu_layout_apply.ApplyFailed, match="unknown step action 'reset_gpu'"):
        gpu_layout_apply.execute_steps([odd, bind_vfio(H100)], str(tree.root), writer=writer)
    assert writer.writes == [] and tree.driver_of(H100) == "nvidia"


def test_steps_before_a_failure_stay_done_and_are_reported(build, kernel):
    tree = build(scenario="mixed")
    done, skipped = [], []
    gone = "0000:ff:00.0"
    with pytest.raises(gpu_layout_apply.ApplyFailed, match=f"{gone} is gone from sysfs"):
        gpu_layout_apply.execute_steps(
            [bind_vfio(H100), bind_vfio(gone)],
            str(tree.root),
            writer=kernel(tree),
            done=done,
            skipped=skipped,
        )
    assert [d["target"] for d in done] == [H100] and skipped == []
    assert tree.driver_of(H100) == "vfio-pci"


def test_pending_steps_are_not_executed(build, kernel):
    tree = build(scenario="mixed")
    writer = kernel(tree)
    pending = gpu_layout_plan.Step(
        action=gpu_layout_plan.PENDING, target=H100, gpu=H100, reason="later"
    )
    done, skipped = gpu_layout_apply.execute_steps([pending], str(tree.root), writer=writer)
    assert done == [] and skipped == [] and writer.writes == []
