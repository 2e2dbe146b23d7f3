"""Where a checkpoint is (r1_ascend.weights.ckpt_root) at the edges of its reading: an ``actor/`` outside a
``global_step_N``, a ``dist_ckpt/`` known by its HF sibling rather than its parent's name, a manifest whose source
is gone, unfinished saves, and outputs that are, contain or lie inside the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r1_ascend.weights.ckpt_root import DIST, HF, VERL_ACTOR, VERL_DIST, VERL_STEP, find_root, refuse_nested
from r1_ascend.weights.errors import CheckpointFormatError, OutputExistsError
from r1_ascend.weights.manifest import MEGATRON_MANIFEST


def dist(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "metadata.json").write_text("{}")
    return path


def test_a_step_directory_is_the_root_of_everything_in_it(tmp_path: Path) -> None:
    step = tmp_path / "global_step_7"
    dist(step / "actor" / "dist_ckpt")
    found = find_root(step)
    assert (found.kind, found.root, found.dist_ckpt, found.hf_dir) == (
        VERL_STEP,
        step,
        step / "actor" / "dist_ckpt",
        step / "actor" / "huggingface",
    )
    assert find_root(step / "actor").root == step
    assert find_root(step / "actor" / "dist_ckpt").root == step


def test_an_actor_outside_a_step_directory_is_its_own_root(tmp_path: Path) -> None:
    actor = tmp_path / "copied" / "actor"
    dist(actor / "dist_ckpt")
    found = find_root(actor)
    assert (found.kind, found.root, found.hf_dir) == (VERL_ACTOR, actor, actor / "huggingface")
    named_otherwise = tmp_path / "global_step_3" / "policy"
    dist(named_otherwise / "dist_ckpt")
    assert find_root(named_otherwise).root == named_otherwise


def test_a_dist_ckpt_beside_a_huggingface_directory_is_verls(tmp_path: Path) -> None:
    role = tmp_path / "global_step_2" / "critic"
    dist(role / "dist_ckpt")
    (role / "huggingface").mkdir()
    found = find_root(role / "dist_ckpt")
    assert (found.kind, found.root, found.hf_dir) == (VERL_DIST, role, role / "huggingface")


def test_a_dist_ckpt_with_neither_is_a_plain_dist_checkpoint(tmp_path: Path) -> None:
    plain = dist(tmp_path / "somewhere" / "dist_ckpt")
    found = find_root(plain)
    assert (found.kind, found.root, found.dist_ckpt, found.hf_dir) == (DIST, plain, plain, None)


def manifest(mcore: Path, source: str | None) -> None:
    data = {"step": "to-megatron", "layout": {"tp": 1, "pp": 1, "ep": 1}}
    if source is not None:
        data["source"] = source
    (mcore / MEGATRON_MANIFEST).write_text(json.dumps(data))


def test_the_hf_directory_of_a_conversion_comes_from_its_manifest(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    mcore = dist(tmp_path / "mcore")
    manifest(mcore, str(hf))
    assert find_root(mcore).hf_dir == hf


@pytest.mark.parametrize("source", [None, "", "gone"], ids=["no-source", "empty-source", "moved-away"])
def test_a_manifest_without_a_usable_source_gives_no_hf_directory(tmp_path: Path, source: str | None) -> None:
    mcore = dist(tmp_path / "mcore")
    manifest(mcore, str(tmp_path / source) if source else source)
    assert find_root(mcore).hf_dir is None


def test_an_hf_directory_is_its_own_root(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    found = find_root(hf)
    assert (found.kind, found.root, found.dist_ckpt, found.hf_dir) == (HF, hf, None, hf)


@pytest.mark.parametrize("inner", ["dist_ckpt", "actor/dist_ckpt"])
def test_an_unfinished_save_is_named_as_such(tmp_path: Path, inner: str) -> None:
    step = tmp_path / "global_step_9"
    (step / inner).mkdir(parents=True)
    with pytest.raises(CheckpointFormatError) as info:
        find_root(step)
    assert str(info.value) == (
        f"{step} is an unfinished save: its dist_ckpt has no metadata.json (verl writes it last). Use an earlier "
        "global_step_N."
    )


def test_anything_else_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointFormatError, match=r"is not a checkpoint: expected verl's global_step_N"):
        find_root(tmp_path)


# --- outputs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("out", [".", ".."], ids=["the-source", "its-parent"])
def test_an_output_that_is_or_contains_the_source_is_refused(tmp_path: Path, out: str) -> None:
    source = tmp_path / "ck"
    source.mkdir()
    with pytest.raises(OutputExistsError) as info:
        refuse_nested(source, source / out)
    assert str(info.value).startswith(f"output {source / out} contains the source checkpoint {source};")


def test_an_output_inside_the_source_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "ck"
    with pytest.raises(OutputExistsError) as info:
        refuse_nested(source, source / "a" / "b")
    assert str(info.value).startswith(f"output {source / 'a' / 'b'} lies inside the source checkpoint {source};")


def test_an_output_beside_the_source_is_fine(tmp_path: Path) -> None:
    refuse_nested(tmp_path / "ck", tmp_path / "ck-hf")
    refuse_nested(tmp_path / "ck", tmp_path / "other" / "ck")


def test_the_whole_checkpoint_counts_when_the_source_is_part_of_it(tmp_path: Path) -> None:
    step = tmp_path / "global_step_1"
    source = step / "actor"
    with pytest.raises(OutputExistsError) as info:
        refuse_nested(source, step / "hf", root=step)
    assert f"lies inside the source checkpoint {source} (whole checkpoint: {step})" in str(info.value)
    refuse_nested(source, step / "hf")  # without the root, beside actor/ is fine
