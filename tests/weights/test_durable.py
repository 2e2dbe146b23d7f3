"""fp8-to-bf16's shard loop: fsync and rename run in the background, yet a shard is in place only once durable and
whole; the serial path computes with one torch thread like a worker."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from r1_ascend import atomic
from r1_ascend.weights import dequant
from r1_ascend.weights.source import HFCheckpoint


def _plans(tiny_fp8) -> list[dequant.ShardPlan]:
    plans = [p for p in dequant.plan_shards(HFCheckpoint(tiny_fp8.path), drop_mtp=False) if p.layout]
    assert len(plans) >= 2, "the tiny checkpoint must have several shards for these tests"
    return plans


def test_a_failure_mid_shard_leaves_the_finished_shards_in_place(
    tiny_fp8, tiny_bf16: Path, tmp_path: Path, monkeypatch
):
    """The shard before the failing one was still fsyncing in the background: it must land, complete."""
    plans = _plans(tiny_fp8)
    failing = plans[1].layout[-1].name
    real = dequant.stream_tensor

    def stream(ckpt, name, writer, bufs):
        if name == failing:
            raise OSError(28, "No space left on device")
        real(ckpt, name, writer, bufs)

    monkeypatch.setattr(dequant, "stream_tensor", stream)
    with pytest.raises(OSError, match="No space left"):
        dequant.convert_shards(str(tiny_fp8.path), str(tmp_path), plans)
    assert (tmp_path / plans[0].file).read_bytes() == (tiny_bf16 / plans[0].file).read_bytes()
    assert not (tmp_path / plans[1].file).exists()
    assert not list(tmp_path.glob(".*.tmp-*"))


def test_a_failed_fsync_never_renames_and_is_raised(tiny_fp8, tmp_path: Path, monkeypatch) -> None:
    plans = _plans(tiny_fp8)
    calls = []

    def fsync(fd: int) -> None:
        calls.append(fd)
        time.sleep(0.2)  # still failing when the next shard is done: its own fsync must be waited for too
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        dequant.convert_shards(str(tiny_fp8.path), str(tmp_path), plans)
    assert calls
    assert not list(tmp_path.glob("*.safetensors"))
    assert not list(tmp_path.glob(".*.tmp-*"))


def test_every_shard_is_durable_and_in_place_when_convert_returns(
    tiny_fp8, tiny_bf16: Path, tmp_path: Path, monkeypatch
):
    """Renames happen only after their own fsync, and all of them before ``convert_shards`` returns."""
    plans = _plans(tiny_fp8)
    synced: set[str] = set()
    real_fsync, real_replace = os.fsync, Path.replace

    def fsync(fd: int) -> None:
        real_fsync(fd)
        synced.add(os.readlink(f"/proc/self/fd/{fd}"))

    def replace(self: Path, target):
        assert str(self) in synced, f"{self.name} renamed before its fsync"
        return real_replace(self, target)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(Path, "replace", replace)
    written = dequant.convert_shards(str(tiny_fp8.path), str(tmp_path), plans)
    assert written == sum(p.file_size for p in plans)
    for plan in plans:
        assert (tmp_path / plan.file).read_bytes() == (tiny_bf16 / plan.file).read_bytes()
    assert not list(tmp_path.glob(".*.tmp-*"))


def test_serial_conversion_uses_one_torch_thread_and_restores_it(tiny_fp8, tmp_path: Path, monkeypatch) -> None:
    import torch

    from r1_ascend.weights import convert_fp8_to_bf16

    seen: set[int] = set()
    real = dequant.stream_tensor

    def stream(ckpt, name, writer, bufs):
        seen.add(torch.get_num_threads())
        real(ckpt, name, writer, bufs)

    before = torch.get_num_threads()
    monkeypatch.setattr(dequant, "stream_tensor", stream)
    convert_fp8_to_bf16(tiny_fp8.path, tmp_path / "out", workers=1, progress=False)
    assert seen == {1}
    assert torch.get_num_threads() == before
