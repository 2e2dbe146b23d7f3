from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from r1_ascend.weights import CheckpointFormatError, fix_checkpoint, verify_bf16

INDEX = "model.safetensors.index.json"


@pytest.fixture
def bf16_copy(tiny_bf16: Path, tmp_path: Path) -> Path:
    out = tmp_path / "bf16"
    shutil.copytree(tiny_bf16, out)
    return out


def test_config_edits_and_mtp_dropped(tiny_fp8, bf16_copy: Path) -> None:
    before = json.loads((bf16_copy / "config.json").read_text())
    result = fix_checkpoint(bf16_copy, copy_side_files_from=tiny_fp8.path)
    cfg = json.loads((bf16_copy / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert cfg["num_nextn_predict_layers"] == 0
    assert cfg["torch_dtype"] == "bfloat16"
    unchanged = {k: v for k, v in before.items() if k not in ("num_nextn_predict_layers", "torch_dtype")}
    assert {k: cfg[k] for k in unchanged} == unchanged
    mtp_layer = f"model.layers.{cfg['num_hidden_layers']}."
    index = json.loads((bf16_copy / INDEX).read_text())
    assert result.mtp_tensors_dropped == sum(
        1
        for n in json.loads((tiny_fp8.path / INDEX).read_text())["weight_map"]
        if n.startswith(mtp_layer) and not n.endswith("_scale_inv")
    )
    assert not [n for n in index["weight_map"] if n.startswith(mtp_layer)]
    tensors = {}
    for shard in bf16_copy.glob("*.safetensors"):
        tensors.update(load_file(shard))
    assert not [n for n in tensors if n.startswith(mtp_layer)]
    assert set(tensors) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    # the FP8 index and config were never copied over the rewritten ones; tokenizer files were
    assert "tokenizer_config.json" in result.side_files_copied
    assert "config.json" not in result.side_files_copied
    assert INDEX not in result.side_files_copied
    assert verify_bf16(tiny_fp8.path, bf16_copy, drop_mtp=True, progress=False) == len(tensors)


def test_fix_is_idempotent(bf16_copy: Path) -> None:
    fix_checkpoint(bf16_copy)
    snapshot = {p.name: p.read_bytes() for p in bf16_copy.iterdir() if p.is_file()}
    again = fix_checkpoint(bf16_copy)
    assert again.mtp_tensors_dropped == 0
    assert {p.name: p.read_bytes() for p in bf16_copy.iterdir() if p.is_file()} == snapshot


def test_refuses_fp8_checkpoint(tiny_fp8, tmp_path: Path) -> None:
    shutil.copytree(tiny_fp8.path, tmp_path / "fp8")
    before = (tmp_path / "fp8" / "config.json").read_text()
    with pytest.raises(CheckpointFormatError, match="still holds FP8 weights"):
        fix_checkpoint(tmp_path / "fp8")
    assert (tmp_path / "fp8" / "config.json").read_text() == before
