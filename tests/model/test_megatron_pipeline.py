"""A pipeline stage boundary on the actor's real path: megatron-core's DeepSeek-V3 actor at pipeline-parallel size 2
(two processes over gloo, the first MoE layer on one stage and the next on the other) computes the same loss and the
same gradient for every parameter as at PP 1 through megatron-core's own 1F1B schedule and its p2p, and verl's
weight export, which broadcasts each stage's tensors to every rank, hands every rank the PP 1 export bit for bit.

The rehearsal's actor runs at PP 1 (docs/rehearsal.md, "What is real": layout); this is the stage boundary's proof at
the model level: the schedule, the p2p shapes exchange (``variable_seq_lengths``) and ``per_tensor_generator`` across
stages, with the converted checkpoint resharded to PP 2 by dist checkpointing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from r1_ascend.ports import unused_local_port

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("megatron_pipeline.py")


@pytest.fixture(scope="module")
def ranks(converted: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[dict]]:
    """The PP 1 reference and the two PP 2 ranks, run side by side."""
    from r1_ascend.rehearse.cluster import with_site

    tmp = tmp_path_factory.mktemp("pipeline")
    env = with_site(os.environ)
    runs = [(1, 0, unused_local_port()), *((2, rank, port) for port in [unused_local_port()] for rank in (0, 1))]
    outs = [tmp / f"pp{world}-rank{rank}.json" for world, rank, _ in runs]
    children = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(converted), str(world), str(rank), str(port), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for (world, rank, port), out in zip(runs, outs, strict=True)
    ]
    logs = [child.communicate(timeout=900)[0] for child in children]
    for child, log in zip(children, logs, strict=True):
        assert child.returncode == 0, log[-3000:]
    reports = [json.loads(out.read_text(encoding="utf-8")) for out in outs]
    return reports[0], reports[1:]


def test_each_stage_holds_its_layers(ranks: tuple[dict, list[dict]]) -> None:
    reference, stages = ranks
    assert [stage["stage"] for stage in stages] == [0, 1]
    held = [stage["layers"] for stage in stages]
    assert held[0], "each stage holds decoder layers"
    assert held[1], "each stage holds decoder layers"
    assert held[0] + held[1] == reference["layers"]


def test_the_loss_through_the_1f1b_schedule_equals_pp_1(ranks: tuple[dict, list[dict]]) -> None:
    reference, stages = ranks
    assert stages[0]["loss"] is None, "only the last stage computes the loss"
    assert stages[1]["loss"] == pytest.approx(reference["loss"], rel=1e-6)


def test_every_gradient_crosses_the_stage_boundary(ranks: tuple[dict, list[dict]]) -> None:
    """The first stage's gradients come from the second stage's loss, sent back through the p2p."""
    reference, stages = ranks
    pipelined = {**stages[0]["grads"], **stages[1]["grads"]}
    assert set(pipelined) == set(reference["grads"])
    assert not set(stages[0]["grads"]) & set(stages[1]["grads"])
    for name, norm in reference["grads"].items():
        assert pipelined[name] == pytest.approx(norm, rel=1e-5, abs=1e-9), name
    assert all(norm > 0 for name, norm in stages[0]["grads"].items() if "embedding" in name)


def test_verls_export_across_stages_gives_every_rank_the_whole_model(ranks: tuple[dict, list[dict]]) -> None:
    reference, stages = ranks
    for stage in stages:
        assert stage["exported"] == reference["exported"]
