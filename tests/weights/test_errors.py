"""Clean errors and no silent no-ops: read-only output, BF16 input, output inside input, impossible layouts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from r1_ascend.weights import Layout, OutputExistsError, WeightsError, convert_fp8_to_bf16, convert_hf_to_megatron
from r1_ascend.weights.cli import main
from r1_ascend.weights.errors import AlreadyBF16Error
from r1_ascend.weights.mcore_plan import check_layout
from r1_ascend.weights.tiny import deepseek_v3_config

CLI = "import sys; from r1_ascend.weights.cli import main; sys.exit(main(sys.argv[1:]))"


def _run_on_read_only_dir(ro: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the CLI with ``ro`` a read-only file system (a private mount namespace when root, chmod otherwise)."""
    ro.mkdir()
    cmd = [sys.executable, "-c", CLI, *args]
    if os.geteuid() == 0:
        if not shutil.which("unshare"):
            pytest.skip("root without unshare: cannot make a read-only directory")
        script = 'mount -t tmpfs -o ro tmpfs "$0" && exec "$@"'
        probe = subprocess.run(["unshare", "-m", "sh", "-c", script, str(ro), "true"], capture_output=True)
        if probe.returncode:
            pytest.skip(f"cannot mount a read-only tmpfs: {probe.stderr!r}")
        cmd = ["unshare", "-m", "sh", "-c", script, str(ro), *cmd]
    else:
        ro.chmod(0o555)
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("step", ["fp8-to-bf16", "to-megatron"])
def test_read_only_output_gives_a_clean_message(step: str, tiny_fp8, tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    done = _run_on_read_only_dir(ro, [step, str(tiny_fp8.path), str(ro / "out"), "--quiet"])
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"cannot write the output {ro / 'out'}" in done.stderr
    assert "Read-only file system" in done.stderr or "Permission denied" in done.stderr
    assert "writable" in done.stderr  # the fix


def test_already_bf16_input_is_refused_not_copied(tiny_bf16: Path, tmp_path: Path, capsys) -> None:
    with pytest.raises(AlreadyBF16Error, match=r"already a BF16 checkpoint.*nothing was written"):
        convert_fp8_to_bf16(tiny_bf16, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    assert main(["fp8-to-bf16", str(tiny_bf16), str(tmp_path / "out"), "--quiet"]) == 1
    assert "fix-config" in capsys.readouterr().err


def test_output_inside_the_input_is_refused(tiny_fp8, tiny_bf16: Path, tmp_path: Path) -> None:
    src = tmp_path / "fp8"
    shutil.copytree(tiny_fp8.path, src)
    before = sorted(p.name for p in src.iterdir())
    with pytest.raises(OutputExistsError, match="inside the source checkpoint"):
        convert_fp8_to_bf16(src, src / "bf16", progress=False)
    with pytest.raises(OutputExistsError, match="inside the source checkpoint"):
        convert_hf_to_megatron(src, src / "mcore" / "x", progress=False)
    assert sorted(p.name for p in src.iterdir()) == before


def test_tp_not_dividing_the_heads_is_refused(tiny_bf16: Path, tmp_path: Path) -> None:
    """The reported case: --tp 2 on a model with 3 attention heads."""
    src = tmp_path / "hf"
    shutil.copytree(tiny_bf16, src)
    cfg_path = src / "config.json"
    import json

    cfg = json.loads(cfg_path.read_text())
    with pytest.raises(WeightsError, match=r"tp=3 does not divide num_attention_heads .* = 4"):
        convert_hf_to_megatron(src, tmp_path / "out", Layout(tp=3), progress=False)
    with pytest.raises(WeightsError, match=r"ep=3 does not divide n_routed_experts = 8"):
        convert_hf_to_megatron(src, tmp_path / "out", Layout(ep=3), progress=False)
    with pytest.raises(WeightsError, match=r"sums to 4, the model has num_hidden_layers = 3"):
        convert_hf_to_megatron(src, tmp_path / "out", Layout(pp=2, pp_layers=(2, 2)), progress=False)
    assert not (tmp_path / "out").exists()
    assert cfg["num_attention_heads"] == 4


def test_cli_reports_a_bad_layout(tiny_bf16: Path, tmp_path: Path, capsys) -> None:
    assert main(["to-megatron", str(tiny_bf16), str(tmp_path / "o"), "--tp", "3", "--quiet"]) == 1
    assert "num_attention_heads" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@settings(max_examples=150, deadline=None)
@given(
    heads=st.integers(1, 12),
    experts=st.integers(1, 16),
    layers=st.integers(1, 8),
    tp=st.integers(1, 8),
    ep=st.integers(1, 8),
    pp=st.integers(1, 9),
    split=st.one_of(st.none(), st.lists(st.integers(0, 4), min_size=1, max_size=9)),
)
def test_layout_check_agrees_with_divisibility(heads, experts, layers, tp, ep, pp, split) -> None:
    # sizes chosen so only heads, experts and layers can make a layout impossible
    cfg = deepseek_v3_config(
        num_attention_heads=heads,
        n_routed_experts=experts,
        num_hidden_layers=layers,
        vocab_size=840,
        moe_intermediate_size=840,
        intermediate_size=840,
        q_lora_rank=840,
        kv_lora_rank=824,
        qk_rope_head_dim=16,
    )
    # without an explicit split, Megatron's even split applies: keep the inputs where it is the whole story
    assume(split or pp > layers or layers % pp == 0)
    layout = Layout(tp=tp, pp=len(split) if split else pp, ep=ep, pp_layers=tuple(split or ()))
    pp_ok = (sum(split) == layers and min(split) >= 1) if split else pp <= layers
    ok = heads % tp == 0 and experts % ep == 0 and pp_ok
    if ok:
        check_layout(layout, cfg)
    else:
        with pytest.raises(WeightsError, match="does not fit the model"):
            check_layout(layout, cfg)
