from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file

from r1_ascend.weights import CheckpointFormatError, OutputExistsError, convert_fp8_to_bf16, verify_bf16
from r1_ascend.weights.fp8 import dequantize_fp8_blockwise, quantize_fp8_blockwise

INDEX = "model.safetensors.index.json"


def _load_all(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 300), cols=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_blockwise_dequant_equals_elementwise_oracle(oracle, rows: int, cols: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    weight, scale = quantize_fp8_blockwise(torch.randn(rows, cols, generator=gen) * 3)
    scale = scale * torch.rand(scale.shape, generator=gen)  # distinct per block so a wrong block index shows
    got = dequantize_fp8_blockwise(weight, scale)
    assert torch.equal(got.view(torch.int16), oracle(weight, scale).view(torch.int16))


def test_large_tensor_crosses_row_bands(oracle) -> None:
    weight, scale = quantize_fp8_blockwise(torch.randn(1100, 200))  # > 8 row-blocks: several bands, partial edge
    assert torch.equal(dequantize_fp8_blockwise(weight, scale), oracle(weight, scale))


def test_wrong_scale_shape_is_a_clear_error() -> None:
    weight, scale = quantize_fp8_blockwise(torch.randn(130, 10))
    with pytest.raises(CheckpointFormatError, match=r"expected \(2, 1\)"):
        dequantize_fp8_blockwise(weight, scale[:1], name="w")


def test_every_bf16_tensor_equals_the_oracle(oracle, tiny_fp8, tiny_bf16: Path) -> None:
    src, out = _load_all(tiny_fp8.path), _load_all(tiny_bf16)
    assert not [n for n in out if n.endswith("_scale_inv")]
    for name, tensor in src.items():
        if name.endswith("_scale_inv"):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            assert out[name].dtype == torch.bfloat16
            assert torch.equal(out[name], oracle(tensor, src[name + "_scale_inv"])), name
        else:
            assert out[name].dtype == tensor.dtype, name
            assert torch.equal(out[name], tensor), name
    assert out["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32


def test_scales_in_another_shard_are_found(oracle, tiny_fp8, tiny_bf16: Path) -> None:
    wm = tiny_fp8.weight_map
    moved = [s for s in tiny_fp8.moved_scales if wm[s] != wm[s.removesuffix("_scale_inv")]]
    assert len(moved) >= 3
    src, out = _load_all(tiny_fp8.path), _load_all(tiny_bf16)
    for scale in moved:
        name = scale.removesuffix("_scale_inv")
        assert torch.equal(out[name], oracle(src[name], src[scale]))


def test_index_total_size_and_weight_map(tiny_fp8, tiny_bf16: Path) -> None:
    index = json.loads((tiny_bf16 / INDEX).read_text())
    tensors = _load_all(tiny_bf16)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert set(index["weight_map"]) == set(tensors)
    for name, file in index["weight_map"].items():
        assert tiny_fp8.weight_map[name] == file  # tensor -> file assignment preserved


def test_shards_carry_transformers_metadata(tiny_bf16: Path) -> None:
    for shard in tiny_bf16.glob("*.safetensors"):
        assert load_file(shard)  # parses with safetensors' own reader
        with safe_open(str(shard), "pt") as f:
            assert f.metadata() == {"format": "pt"}


def test_config_has_no_quantization(tiny_bf16: Path) -> None:
    cfg = json.loads((tiny_bf16 / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert cfg["torch_dtype"] == "bfloat16"


def test_refuses_non_empty_foreign_output(tiny_fp8, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="not empty"):
        convert_fp8_to_bf16(tiny_fp8.path, tmp_path, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    convert_fp8_to_bf16(tiny_fp8.path, tmp_path, progress=False, overwrite=True)
    assert not (tmp_path / "notes.txt").exists()
    assert verify_bf16(tiny_fp8.path, tmp_path, progress=False) > 0


def test_truncated_shard_gives_clear_error(tiny_fp8, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(tiny_fp8.path, src)
    shard = sorted(src.glob("*.safetensors"))[2]
    size = shard.stat().st_size
    with shard.open("r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(CheckpointFormatError, match=rf"{shard.name} is truncated.*re-download"):
        convert_fp8_to_bf16(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_missing_scale_is_an_error_not_a_silent_fp8_copy(tiny_fp8, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(tiny_fp8.path, src)
    index = json.loads((src / INDEX).read_text())
    del index["weight_map"]["model.layers.0.self_attn.o_proj.weight_scale_inv"]
    (src / INDEX).write_text(json.dumps(index))
    with pytest.raises(CheckpointFormatError, match=r"o_proj\.weight_scale_inv"):
        convert_fp8_to_bf16(src, tmp_path / "out", progress=False)


def test_e5m2_tensor_is_refused_not_copied(tmp_path: Path) -> None:
    """float8 e5m2 is not DeepSeek's format: refusing it beats writing FP8 bytes into a 'BF16' checkpoint."""
    from safetensors.torch import save_file

    src = tmp_path / "src"
    src.mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4, dtype=torch.float8_e5m2)}, src / "model.safetensors")
    weight_map = {"model.embed_tokens.weight": "model.safetensors"}
    (src / INDEX).write_text(json.dumps({"metadata": {"total_size": 16}, "weight_map": weight_map}))
    (src / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", "num_hidden_layers": 1}))
    with pytest.raises(CheckpointFormatError, match="e5m2"):
        convert_fp8_to_bf16(src, tmp_path / "out", progress=False)


@pytest.mark.slow
def test_resume_after_kill(tiny_fp8, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = "import sys; from r1_ascend.weights.cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["fp8-to-bf16", str(tiny_fp8.path), str(out), "--quiet"]
    cmd = [sys.executable, "-c", code, *args]
    faults = [sys.executable, str(Path(__file__).with_name("faults.py")), "--kill-after-tensors", "60", "--"]
    killed = subprocess.run([*faults, *args], capture_output=True, check=False)
    assert killed.returncode == -signal.SIGKILL
    done_before = sorted(p.name for p in out.glob("*.safetensors"))
    assert done_before  # some shards finished ...
    assert list(out.glob(".*.tmp-*"))  # ... and one was cut off mid-write
    assert not (out / INDEX).exists()
    resumed = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert f"{len(done_before)} already complete" in resumed.stdout
    assert not list(out.glob(".*.tmp-*"))
    assert verify_bf16(tiny_fp8.path, out, progress=False) == len(_load_all(out))


@pytest.mark.slow
def test_parallel_workers_write_identical_shards(tiny_fp8, tiny_bf16: Path, tmp_path: Path) -> None:
    convert_fp8_to_bf16(tiny_fp8.path, tmp_path / "par", workers=2, progress=False)
    for shard in tiny_bf16.glob("*.safetensors"):
        assert (tmp_path / "par" / shard.name).read_bytes() == shard.read_bytes()


def test_overwrite_never_deletes_a_source_inside_the_output(tiny_fp8, tmp_path: Path) -> None:
    src = tmp_path / "models" / "fp8"
    shutil.copytree(tiny_fp8.path, src)
    before = sorted(p.name for p in src.iterdir())
    with pytest.raises(OutputExistsError, match="contains the source checkpoint"):
        convert_fp8_to_bf16(src, tmp_path / "models", overwrite=True, progress=False)
    assert sorted(p.name for p in src.iterdir()) == before


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 400),
    cols=st.integers(1, 300),
    start=st.integers(0, 399),
    seed=st.integers(0, 2**16),
)
def test_row_ranges_with_every_code_equal_the_oracle(oracle, rows: int, cols: int, start: int, seed: int) -> None:
    """Any row range (not block-aligned) of a weight holding all 256 codes, NaN codes included, bit for bit."""
    from r1_ascend.weights.fp8 import dequantize_rows

    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (rows, cols), generator=gen, dtype=torch.uint8)
    weight = codes.view(torch.float8_e4m3fn)
    scale = torch.rand(-(-rows // 128), -(-cols // 128), generator=gen) * 1e-2
    start = min(start, rows - 1)
    stop = torch.randint(start + 1, rows + 1, (1,), generator=gen).item()
    out = torch.empty((stop - start, cols), dtype=torch.bfloat16)
    got = dequantize_rows(weight[start:stop], scale, start, out)
    want = oracle(weight, scale)[start:stop]
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_bands_smaller_than_a_tensor_give_the_same_shards(tiny_fp8, tiny_bf16: Path, tmp_path: Path, monkeypatch):
    """Streaming in bands of a few rows (forced here) writes the same bytes as whole-tensor bands."""
    from r1_ascend.weights import dequant

    monkeypatch.setattr(dequant, "BAND_BYTES", 1000)
    convert_fp8_to_bf16(tiny_fp8.path, tmp_path / "small", progress=False)
    for shard in tiny_bf16.glob("*.safetensors"):
        assert (tmp_path / "small" / shard.name).read_bytes() == shard.read_bytes()
