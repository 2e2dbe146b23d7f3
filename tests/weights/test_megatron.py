from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from r1_ascend.weights import Layout, OutputExistsError, convert_hf_to_megatron
from r1_ascend.weights.mcore_plan import build_plan
from r1_ascend.weights.mcore_verify import megatron_to_hf, verify_megatron
from r1_ascend.weights.source import HFCheckpoint


@pytest.fixture(scope="module")
def mcore_from_fp8(tiny_fp8, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Written straight from the FP8 checkpoint (dequantised on the fly) at TP2 PP2 EP2."""
    out = tmp_path_factory.mktemp("mcore") / "ckpt"
    convert_hf_to_megatron(tiny_fp8.path, out, Layout(tp=2, pp=2, ep=2, pp_layers=(2, 1)), progress=False)
    return out


def test_plan_uses_every_non_mtp_tensor_once(tiny_fp8) -> None:
    ckpt = HFCheckpoint(tiny_fp8.path)
    plan = build_plan(ckpt.config, Layout(tp=2, pp=3, ep=4))
    names = ckpt.names(include_mtp=False)
    assert plan.consumed == set(names)
    assert plan.total_numel() == sum(ckpt.entry(n).numel for n in names)
    for t in plan.tensors:  # chunks tile each global tensor exactly
        assert sum(torch.Size(p.sizes).numel() for p in t.pieces) == t.numel, t.key
    fc1 = next(t for t in plan.tensors if t.key == "decoder.layers.2.mlp.experts.experts.linear_fc1.weight")
    per_ep = ckpt.config["n_routed_experts"] // 4
    for p in fc1.pieces:
        expert = p.offsets[0]
        assert p.source.startswith(f"model.layers.2.mlp.experts.{expert}.")
        assert p.rank == Layout(tp=2, pp=3, ep=4).rank(2, expert // per_ep, p.rank % 2)
        half = "gate_proj" if p.offsets[1] < ckpt.config["moe_intermediate_size"] else "up_proj"
        assert half in p.source  # fc1 = [gate; up]


def test_checkpoint_files(mcore_from_fp8: Path) -> None:
    meta = json.loads((mcore_from_fp8 / "metadata.json").read_text())
    assert meta["sharded_backend"] == "torch_dist"
    assert sorted(p.name for p in mcore_from_fp8.glob("__*_0.distcp")) == [f"__{r}_0.distcp" for r in range(8)]
    assert torch.load(mcore_from_fp8 / "common.pt", weights_only=True) == {}


def test_loads_through_megatron_core_and_round_trips(tiny_fp8, tiny_bf16: Path, mcore_from_fp8: Path, tmp_path: Path):
    n = verify_megatron(mcore_from_fp8, tiny_bf16, [Layout()])
    assert n > 0
    back = megatron_to_hf(mcore_from_fp8, HFCheckpoint(tiny_bf16).config, tmp_path / "hf")
    original = HFCheckpoint(tiny_bf16)
    expected = set(original.names(include_mtp=False))
    got: dict[str, torch.Tensor] = {}
    for shard in back.glob("*.safetensors"):
        got.update(load_file(shard))
    assert set(got) == expected
    for name in expected:
        want = original.tensor(name)
        assert got[name].dtype == want.dtype, name
        assert torch.equal(got[name], want), name


@pytest.mark.slow
def test_loads_at_another_tensor_parallel_size(tiny_bf16: Path, mcore_from_fp8: Path) -> None:
    """Two gloo processes load their TP halves (written at TP2 PP2 EP2, loaded at TP2 EP1)."""
    assert verify_megatron(mcore_from_fp8, tiny_bf16, [Layout(tp=2)]) > 0


def test_corrupted_value_is_detected(tiny_bf16: Path, tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    convert_hf_to_megatron(tiny_bf16, out, progress=False)
    other = tmp_path / "other"
    import shutil

    shutil.copytree(tiny_bf16, other)
    # swap one source tensor for different data: the loaded checkpoint must no longer match
    shard = next(p for p in other.glob("*.safetensors") if "model.norm.weight" in load_file(p))
    tensors = load_file(shard)
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 2
    from safetensors.torch import save_file

    save_file(tensors, str(shard), metadata={"format": "pt"})
    from r1_ascend.weights import CheckpointFormatError

    with pytest.raises(CheckpointFormatError, match="final_layernorm"):
        verify_megatron(out, other, [Layout()])


def test_refuses_non_empty_output_and_skips_finished(tiny_bf16: Path, tmp_path: Path) -> None:
    (tmp_path / "x").write_text("keep")
    with pytest.raises(OutputExistsError):
        convert_hf_to_megatron(tiny_bf16, tmp_path, progress=False)
    out = tmp_path / "ckpt"
    convert_hf_to_megatron(tiny_bf16, out, progress=False)
    assert convert_hf_to_megatron(tiny_bf16, out, progress=False).skipped


def test_item_writer_supports_the_torch_signature_of_the_npu_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.5.1 (the NPU image) has the four-argument DCP item writer; the converter must accept it."""
    from r1_ascend.weights import mcore_writer
    from r1_ascend.weights.errors import CheckpointFormatError

    calls = []

    def old_style(stream, data, write_item, storage_key):
        calls.append(storage_key)
        return "result"

    monkeypatch.setattr(mcore_writer, "dcp_write_item", old_style)
    assert mcore_writer.item_writer()(None, None, None, "__0_0.distcp") == "result"
    assert calls == ["__0_0.distcp"]

    monkeypatch.setattr(mcore_writer, "dcp_write_item", lambda stream, data: None)
    with pytest.raises(CheckpointFormatError, match="does not know"):
        mcore_writer.item_writer()


def test_overwrite_never_deletes_the_source(tiny_bf16: Path, tmp_path: Path) -> None:
    import shutil

    src = tmp_path / "hf"
    shutil.copytree(tiny_bf16, src)
    before = sorted(p.name for p in src.iterdir())
    for dst in (src, tmp_path):
        with pytest.raises(OutputExistsError, match="contains the source checkpoint"):
            convert_hf_to_megatron(src, dst, overwrite=True, progress=False)
    assert sorted(p.name for p in src.iterdir()) == before


@pytest.mark.slow
def test_killed_conversion_keeps_finished_rank_files(tiny_bf16: Path, tmp_path: Path) -> None:
    """to-megatron killed after one rank file resumes from there; the result loads and matches the source."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "mcore"
    code = "import sys; from r1_ascend.weights.cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["to-megatron", str(tiny_bf16), str(out), "--ep", "2", "--pp", "2", "--pp-layers", "2,1", "--quiet"]
    cmd = [sys.executable, "-c", code, *args]
    faults = [sys.executable, str(Path(__file__).with_name("faults.py")), "--kill-after-ranks", "1", "--"]
    killed = subprocess.run([*faults, *args], capture_output=True, check=False)
    assert killed.returncode == -signal.SIGKILL
    first = sorted(out.glob("__*_0.distcp"))
    assert len(first) == 1, "exactly one finished rank file before the kill"
    kept = first[0].stat().st_ino
    assert not (out / "metadata.json").exists()

    resumed = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert first[0].stat().st_ino == kept, "the finished rank file was reused, not rewritten"
    assert len(list(out.glob("__*_0.distcp"))) == 4
    assert not list(out.glob(".__*")), "temporary files and result sidecars are gone"
    assert verify_megatron(out, tiny_bf16, [Layout()]) > 0


def test_torn_rank_file_is_rewritten(tiny_bf16: Path, tmp_path: Path) -> None:
    """A rank file whose length disagrees with its recorded results is not trusted on resume."""
    from r1_ascend.weights.mcore_writer import finished_rank_results, rank_items, results_path

    out = tmp_path / "mcore"
    convert_hf_to_megatron(tiny_bf16, out, Layout(ep=2), progress=False)
    plan = build_plan(HFCheckpoint(tiny_bf16).config, Layout(ep=2), extra_state=True)
    items = rank_items(plan)[0]
    rank_file = out / "__0_0.distcp"
    with (out / ".metadata").open("rb") as f:
        results = list(pickle.load(f).storage_data.items())  # DCP writes its metadata with pickle
    assert results  # the metadata records where each item is
    torch.save(
        [_FakeResult(index, info) for index, info in results if info.relative_path == rank_file.name],
        results_path(out, 0),
    )
    assert finished_rank_results(out, 0, items) is not None
    with rank_file.open("ab") as f:
        f.write(b"torn")
    assert finished_rank_results(out, 0, items) is None


class _FakeResult:
    """The two fields of a DCP WriteResult that resume reads."""

    def __init__(self, index: object, storage_data: object) -> None:
        self.index, self.storage_data = index, storage_data


def test_large_tensors_split_into_bounded_chunks_still_load(tiny_fp8, tiny_bf16: Path, tmp_path: Path, monkeypatch):
    """Chunks capped at a few kB (forced here; 256 MB by default) load back bit for bit through megatron-core."""
    from r1_ascend.weights import mcore_plan

    monkeypatch.setattr(mcore_plan, "MAX_PIECE_BYTES", 4096)
    out = tmp_path / "ckpt"
    convert_hf_to_megatron(tiny_fp8.path, out, Layout(tp=2, ep=2), progress=False)
    plan = build_plan(HFCheckpoint(tiny_bf16).config, Layout(tp=2, ep=2))
    emb = next(t for t in plan.tensors if t.key == "embedding.word_embeddings.weight")
    assert len(emb.pieces) > 2
    assert all(torch.Size(p.sizes).numel() * 2 <= 4096 for p in emb.pieces)
    assert verify_megatron(out, tiny_bf16, [Layout()]) > 0
