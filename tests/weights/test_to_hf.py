"""convert-weights to-hf: a verl Megatron training checkpoint back to HF BF16, bit-exact round trips."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from r1_ascend.weights import CheckpointFormatError, Layout, convert_hf_to_megatron
from r1_ascend.weights.config_fix import fix_checkpoint
from r1_ascend.weights.source import HFCheckpoint
from r1_ascend.weights.to_hf import convert_megatron_to_hf

SIDE_FILES = ("config.json", "generation_config.json", "tokenizer_config.json")


@pytest.fixture(scope="module")
def hf_fixed(tiny_bf16: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The BF16 model as training uses it (config fixed, MTP dropped): what a round trip must reproduce."""
    out = tmp_path_factory.mktemp("fixed") / "hf"
    shutil.copytree(tiny_bf16, out)
    fix_checkpoint(out)
    return out


def _verl_checkpoint(root: Path, hf: Path, layout: Layout) -> Path:
    """global_step_1/actor/{dist_ckpt,huggingface} as verl 0.6.1's MegatronCheckpointManager lays it out."""
    actor = root / "global_step_1" / "actor"
    convert_hf_to_megatron(hf, actor / "dist_ckpt", layout, progress=False)
    (actor / "huggingface").mkdir()
    for name in SIDE_FILES:
        shutil.copy2(hf / name, actor / "huggingface" / name)
    return root / "global_step_1"


def _assert_same_model(out: Path, want: Path, hf_side: Path) -> None:
    a, b = HFCheckpoint(out), HFCheckpoint(want)
    assert set(a.weight_map) == set(b.weight_map)
    for name in b.weight_map:
        x, y = a.raw(name), b.raw(name)
        assert (x.dtype, x.shape) == (y.dtype, y.shape), name
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), name  # bit for bit
    for name in SIDE_FILES:
        assert (out / name).read_bytes() == (hf_side / name).read_bytes(), name


@pytest.mark.parametrize(
    "layout", [Layout(), Layout(tp=2, pp=2, ep=2, pp_layers=(2, 1)), Layout(pp=3, ep=4), Layout(tp=4, ep=8)], ids=str
)
def test_round_trip_hf_megatron_hf_is_bit_exact(hf_fixed: Path, tmp_path: Path, layout: Layout) -> None:
    step = _verl_checkpoint(tmp_path, hf_fixed, layout)
    result = convert_megatron_to_hf(step, tmp_path / "back", max_shard_bytes=300_000, progress=False)
    assert result.shards_written > 3
    _assert_same_model(tmp_path / "back", hf_fixed, step / "actor" / "huggingface")


def test_checkpoint_saved_by_megatron_core_with_optimizer_state(hf_fixed: Path, tmp_path: Path, monkeypatch) -> None:
    """A dist checkpoint written by megatron-core's own save, holding model, optimizer and RNG state like verl's.

    Stand-in: megatron-core's writer calls ``torch.cuda.synchronize()`` before copying tensors to the host and
    all-reduces a flag on ``torch.cuda.current_device()``; on this CPU-only torch the first is a no-op (tensors
    are already on the host) and the second is the CPU. megatron-core 0.12.1 predates the extra
    ``serialization_format`` argument of torch 2.13's private DCP item writer (the NPU image's torch 2.5.1 has the
    old signature), so the test passes torch's default format.
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from torch.distributed.checkpoint import filesystem

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    if hasattr(filesystem, "SerializationFormat"):
        real = filesystem._write_item
        fmt = filesystem.SerializationFormat.TORCH_SAVE
        monkeypatch.setattr(filesystem_async, "_write_item", lambda *args: real(*args, fmt))
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedObject, ShardedTensor

    from r1_ascend.weights.mcore_plan import build_plan
    from r1_ascend.weights.mcore_verify import expected_shards, local_sharded, process_group

    src = HFCheckpoint(hf_fixed)
    plan = build_plan(src.config, Layout(), extra_state=False)
    model: dict = {}
    for t in plan.tensors:
        entries = local_sharded(t, Layout(), 0, 0)
        for key, value in expected_shards(t, src, Layout(), 0, 0).items():
            entries[key].data.copy_(value)
        model.update(entries)
    moment = torch.arange(12, dtype=torch.float32)
    state = {
        "model": model,
        "optimizer": {"exp_avg": ShardedTensor.from_rank_offsets("optimizer.state.exp_avg.x", moment)},
        "rng_state": ShardedObject("rng_state", {"seed": 1}, (1,), (0,), replica_id=0),
        "lr_scheduler": {"num_steps": 7},
    }
    dist = tmp_path / "global_step_3" / "actor" / "dist_ckpt"
    dist.mkdir(parents=True)
    with process_group():
        dist_checkpointing.save(state, str(dist))
    (dist.parent / "huggingface").mkdir()
    for name in SIDE_FILES:
        shutil.copy2(hf_fixed / name, dist.parent / "huggingface" / name)
    convert_megatron_to_hf(dist.parent, tmp_path / "back", progress=False)
    _assert_same_model(tmp_path / "back", hf_fixed, dist.parent / "huggingface")


@pytest.mark.slow
def test_to_hf_resumes_after_a_kill(hf_fixed: Path, tmp_path: Path) -> None:
    step = _verl_checkpoint(tmp_path / "ckpt", hf_fixed, Layout(ep=2))
    out = tmp_path / "back"
    code = "import sys; from r1_ascend.weights.cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["to-hf", str(step), str(out), "--shard-size-gb", "0.0003", "--quiet"]
    cmd = [sys.executable, "-c", code, *args]
    faults = [sys.executable, str(Path(__file__).with_name("faults.py")), "--kill-after-shards", "2", "--"]
    killed = subprocess.run([*faults, *args], capture_output=True, check=False)
    assert killed.returncode == -signal.SIGKILL
    finished = sorted(out.glob("model-*.safetensors"))
    assert len(finished) == 2
    inodes = {p.name: p.stat().st_ino for p in finished}
    assert not (out / "model.safetensors.index.json").exists()  # not presented as complete
    resumed = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert "2 already complete" in resumed.stdout
    assert all((out / n).stat().st_ino == i for n, i in inodes.items())
    _assert_same_model(out, hf_fixed, step / "actor" / "huggingface")


def test_a_checkpoint_of_another_architecture_is_refused(hf_fixed: Path, tmp_path: Path) -> None:
    step = _verl_checkpoint(tmp_path, hf_fixed, Layout())
    import json

    cfg_path = step / "actor" / "huggingface" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["n_routed_experts"] = 16
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointFormatError, match=r"experts"):
        convert_megatron_to_hf(step, tmp_path / "back", progress=False)
    assert not (tmp_path / "back").exists()


def test_unfinished_save_is_refused(tmp_path: Path) -> None:
    (tmp_path / "global_step_2" / "actor" / "dist_ckpt").mkdir(parents=True)
    with pytest.raises(CheckpointFormatError, match="unfinished save"):
        convert_megatron_to_hf(tmp_path / "global_step_2", tmp_path / "out", progress=False)


def test_a_truncated_shard_is_refused_before_anything_is_written(hf_fixed: Path, tmp_path: Path) -> None:
    """The rule verl_checkpoint_integrity and preflight use: torch's .metadata records each shard's size."""
    step = _verl_checkpoint(tmp_path, hf_fixed, Layout())
    shard = sorted((step / "actor" / "dist_ckpt").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:-1])
    with pytest.raises(CheckpointFormatError, match=rf"shard {shard.name} is \d+ bytes, .* truncated"):
        convert_megatron_to_hf(step, tmp_path / "back", progress=False)
    assert not (tmp_path / "back").exists()
