"""The guard bench's branches: every fault planted on a snapshot of one loop (guard_calibration.branched).

The snapshot must put back whatever a step or a fault changed (a module replaced, a config attribute set, a parameter
updated in place or rebound), and a fault whose step leaves something it does not put back must stop the bench
instead of skewing the faults after it. The model-level proof (a branched fault equals the fault planted on a loop
of its own, bit for bit) is the slow test in tests/model/test_rollout_guard_faults.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from r1_ascend.cpu.engine import WeightSyncError
from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.rehearse import guard_calibration as gc


def _tree() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Sequential(torch.nn.Linear(3, 2)))
    model[1].register_buffer("bias_state", torch.zeros(2))
    model[1].topk_group = 2
    return model


def test_a_module_tree_copy_puts_back_every_change_in_place() -> None:
    model = _tree()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weight, inner = model[0].weight, model[1]
    copied = gc.ModuleTreeCopy.take([model])

    with torch.no_grad():
        model[0].weight.add_(1.0)  # an update, in place
    model[1].bias_state = torch.ones(5)  # a buffer rebound with another shape
    model[1].topk_group = 8  # a config attribute
    model[1][0] = torch.nn.Linear(3, 2)  # a module replaced
    model[0].extra = torch.nn.ReLU()  # a module added
    copied.restore()

    assert model[0].weight is weight, "the optimizer holds the same parameter object"
    assert model[1] is inner
    assert model[1].topk_group == 2
    assert not hasattr(model[0], "extra")
    after = model.state_dict()
    assert after.keys() == before.keys()
    for name, value in before.items():
        assert torch.equal(after[name], value), name


def test_a_module_tree_copy_restores_again_after_a_second_change() -> None:
    model = _tree()
    first = model[0].weight.detach().clone()
    copied = gc.ModuleTreeCopy.take([model])
    for shift in (1.0, 2.0):
        with torch.no_grad():
            model[0].weight.add_(shift)
        copied.restore()
        assert torch.equal(model[0].weight, first)


# --- branched: the order of steps and faults, and the leak check, on a loop whose steps are counted -------------


@dataclass
class _Snapshot:
    step: int
    counted: list[int]

    def restore(self, loop: _CountingLoop) -> None:
        loop.step = self.step
        loop.counted[:] = self.counted


@dataclass
class _CountingLoop:
    """Each step's statistics come from the step number, the fault's name and (when ``leaky``) how many faults ran
    before: what a step changed that the snapshot does not hold."""

    leaky: bool = False
    refuse: str | None = None
    step: int = 0
    counted: list[int] = field(default_factory=list)
    leaked: int = 0
    calls: list[tuple[int, str | None]] = field(default_factory=list)

    def run_step(self, fault: Any = None) -> gc.StepResult:
        self.step += 1
        name = None if fault is None else fault.name
        self.calls.append((self.step, name))
        if name is not None and name == self.refuse:
            raise WeightSyncError(f"refused {name}")
        value = float(self.step) + (0.0 if name is None else 0.5 + len(name) / 100) + self.leaked / 1000
        if self.leaky and name is not None:
            self.leaked += 1
        actor = torch.full((1, 2), -value)
        stats = guard.DiffStats.from_tensors(actor, actor - 0.01, torch.ones(1, 2))
        return gc.StepResult(self.step, name, stats, reward=value)


def _branched(monkeypatch: pytest.MonkeyPatch, loop: _CountingLoop, **kwargs: Any) -> gc.SeedRun:
    monkeypatch.setattr(gc.Loop, "build", classmethod(lambda _cls, _setup: loop))
    monkeypatch.setattr(gc.LoopSnapshot, "take", classmethod(lambda _cls, lp: _Snapshot(lp.step, list(lp.counted))))
    return gc.branched(gc.Setup(hf_dir=None, dist_ckpt=None), **kwargs)  # type: ignore[arg-type]


def test_faults_branch_off_the_step_before_theirs_and_healthy_steps_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = _CountingLoop()
    run = _branched(monkeypatch, loop, steps=4, fault_names=["stale-layers", "yarn-off"], at_step=3)
    assert [r.step for r in run.healthy] == [1, 2, 3, 4]
    assert all(r.fault is None for r in run.healthy)
    assert {name: r.step for name, r in run.faults.items()} == {"stale-layers": 3, "yarn-off": 3}
    # the first fault runs again after the last one: the leak check
    assert loop.calls == [(1, None), (2, None), (3, "stale-layers"), (3, "yarn-off"), (3, "stale-layers"), (3, None),
                          (4, None)]  # fmt: skip


def test_faults_planted_after_the_last_healthy_step(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = _CountingLoop()
    run = _branched(monkeypatch, loop, steps=1, fault_names=["not-synced"], at_step=3)
    assert [r.step for r in run.healthy] == [1]
    assert run.faults["not-synced"].step == 3


def test_a_fault_step_that_leaks_state_stops_the_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(gc.BranchLeakError, match="stale-layers planted again after yarn-off"):
        _branched(monkeypatch, _CountingLoop(leaky=True), steps=4, fault_names=["stale-layers", "yarn-off"], at_step=3)


def test_a_refused_sync_is_recorded_and_the_next_fault_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = _CountingLoop(refuse="moe-loader-dropped")
    run = _branched(monkeypatch, loop, steps=2, fault_names=["moe-loader-dropped", "w13-swap"], at_step=2)
    refused = run.faults["moe-loader-dropped"]
    assert isinstance(refused, gc.SyncRefused)
    assert (refused.step, refused.fault) == (2, "moe-loader-dropped")
    assert isinstance(run.faults["w13-swap"], gc.StepResult)


def test_without_faults_only_the_healthy_steps_run(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = _CountingLoop()
    run = _branched(monkeypatch, loop, steps=3, fault_names=[], at_step=5)
    assert [r.step for r in run.healthy] == [1, 2, 3]
    assert run.faults == {}
    assert [c[1] for c in loop.calls] == [None, None, None]


def test_a_fault_step_before_the_first_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="step >= 1"):
        _branched(monkeypatch, _CountingLoop(), steps=2, fault_names=["w13-swap"], at_step=0)
