"""One reading of checkpoint paths: every layout, typed every way, finds the same root; outputs beside the source
work, outputs inside it are refused with the path the user gave."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from r1_ascend.weights.ckpt_root import DIST, HF, VERL_ACTOR, VERL_DIST, VERL_STEP, find_root, refuse_nested
from r1_ascend.weights.errors import CheckpointFormatError, OutputExistsError
from r1_ascend.weights.manifest import MEGATRON_MANIFEST
from r1_ascend.weights.source import HFCheckpoint

#: layout -> (directory the user points at, relative to the base; the root it must find; its dist ckpt; its HF dir)
_STEP, _ACTOR = "ck/global_step_3", "ck/global_step_3/actor"
LAYOUTS = {
    VERL_STEP: (_STEP, _STEP, f"{_ACTOR}/dist_ckpt", f"{_ACTOR}/huggingface"),
    VERL_ACTOR: (_ACTOR, _STEP, f"{_ACTOR}/dist_ckpt", f"{_ACTOR}/huggingface"),
    VERL_DIST: (f"{_ACTOR}/dist_ckpt", _STEP, f"{_ACTOR}/dist_ckpt", f"{_ACTOR}/huggingface"),
    DIST: ("out/mcore", "out/mcore", "out/mcore", "out/hf-bf16"),
    HF: ("out/hf-bf16", "out/hf-bf16", None, "out/hf-bf16"),
}


def _build(base: Path) -> None:
    """A verl training checkpoint and a convert-weights output (hf-bf16 + mcore with its manifest)."""
    actor = base / "ck" / "global_step_3" / "actor"
    (actor / "dist_ckpt").mkdir(parents=True)
    (actor / "dist_ckpt" / "metadata.json").write_text("{}")
    (actor / "huggingface").mkdir()
    (actor / "huggingface" / "config.json").write_text("{}")
    hf = base / "out" / "hf-bf16"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    mcore = base / "out" / "mcore"
    mcore.mkdir()
    (mcore / "metadata.json").write_text("{}")
    manifest = {"step": "to-megatron", "source": str(hf.resolve()), "layout": {"tp": 1, "pp": 1, "ep": 1}}
    (mcore / MEGATRON_MANIFEST).write_text(json.dumps(manifest))


def _typed(base: Path, rel: str, style: str, link_dir: Path) -> str:
    """``rel`` as a user might type it: absolute, relative to the working directory, with a trailing slash, or
    through a symlink to the base directory."""
    if style == "absolute":
        return str(base / rel)
    if style == "relative":
        return os.path.relpath(base / rel)
    if style == "trailing-slash":
        return str(base / rel) + "/"
    return str(link_dir / rel)  # symlink


STYLES = st.sampled_from(["absolute", "relative", "trailing-slash", "symlink"])


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(LAYOUTS)), style=STYLES, out_style=STYLES, name=st.sampled_from(["back", "x-hf"]))
def test_every_layout_typed_every_way_finds_its_root(kind, style, out_style, name):
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        _build(base)
        link = Path(tmp) / "link"
        link.symlink_to(base, target_is_directory=True)
        pointed, root, dist, hf = LAYOUTS[kind]
        found = find_root(_typed(base, pointed, style, link))
        real = base.resolve()
        assert found.kind == kind
        assert found.root == real / root
        assert found.dist_ckpt == (real / dist if dist else None)
        assert found.hf_dir == real / hf
        typed = _typed(base, pointed, style, link)
        # beside the checkpoint's root: accepted
        beside = _typed(base, str(Path(root).parent / name), out_style, link)
        refuse_nested(typed, beside, found.root)
        # inside the root (also inside verl's global_step_N when the user named actor/ or dist_ckpt/): refused,
        # naming the paths as typed
        inside = _typed(base, f"{root}/{name}", out_style, link)
        with pytest.raises(OutputExistsError, match="lies inside") as exc:
            refuse_nested(typed, inside, found.root)
        assert typed in str(exc.value)
        assert inside in str(exc.value)
        # the root itself, or a directory holding it: refused
        for holder in (root, str(Path(root).parent)):
            with pytest.raises(OutputExistsError, match="contains"):
                refuse_nested(typed, _typed(base, holder, out_style, link), found.root)


def test_a_directory_that_is_no_checkpoint_is_named_as_typed(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointFormatError, match=r"^empty/? is not a checkpoint"):
        find_root("empty/")


def test_a_dist_checkpoint_without_a_known_hf_directory_has_none(tmp_path):
    (tmp_path / "mcore").mkdir()
    (tmp_path / "mcore" / "metadata.json").write_text("{}")
    assert find_root(tmp_path / "mcore").hf_dir is None


def test_to_hf_with_the_output_beside_a_converted_mcore_round_trips(hf_fixed_for_root, tmp_path, monkeypatch):
    """``convert-weights to-hf mcore back`` run in the directory holding ``mcore``: the HF config comes from the
    conversion's manifest, the output sits beside the source, and the result equals the model bit for bit."""
    from r1_ascend.weights import Layout, convert_hf_to_megatron
    from r1_ascend.weights.cli import main

    work = tmp_path / "w"
    shutil.copytree(hf_fixed_for_root, work / "hf-bf16")
    convert_hf_to_megatron(work / "hf-bf16", work / "mcore", Layout(pp=3, ep=2), progress=False)
    monkeypatch.chdir(work)
    assert main(["to-hf", "mcore", "back", "--quiet"]) == 0
    a, b = HFCheckpoint(work / "back"), HFCheckpoint(hf_fixed_for_root)
    assert set(a.weight_map) == set(b.weight_map)
    for name in b.weight_map:
        assert torch.equal(a.raw(name).view(torch.uint8), b.raw(name).view(torch.uint8)), name  # bit for bit
    assert (work / "back" / "config.json").read_bytes() == (hf_fixed_for_root / "config.json").read_bytes()
    assert main(["to-hf", "mcore/", "mcore/back", "--quiet"]) == 1


@pytest.fixture(scope="module")
def hf_fixed_for_root(tiny_bf16: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from r1_ascend.weights.config_fix import fix_checkpoint

    out = tmp_path_factory.mktemp("fixed") / "hf"
    shutil.copytree(tiny_bf16, out)
    fix_checkpoint(out)
    return out
