"""The checkpoint rules (r1_ascend.patches.rules.checkpoints and the patch's ``remove_stale``) at their edges: a new
step that is complete but not yet tracked, the retention count, a step directory next to non-step files, a tracker
that is unreadable, a shard exactly as long as its metadata says.

Checkpoints are written in the real formats (``checkpoint_fakes``: torch's DCP writer, ``torch.save``,
megatron-core's ``metadata.json``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from r1_ascend.patches.rules.checkpoints import (
    TRACKER,
    dist_ckpt_problems,
    inspect_step,
    read_tracker,
    resume_decision,
    stale_steps,
    step_dirs,
    tracker_written_at,
)
from r1_ascend.patches.verl_checkpoint_integrity import remove_stale

sys.path.insert(0, str(Path(__file__).parent))
import checkpoint_fakes as fakes


def steps_left(root: Path) -> list[int]:
    return [step for step, _ in step_dirs(root)]


# --- deleting old checkpoints after a save ---------------------------------------------------------------------


def test_a_complete_but_untracked_new_step_deletes_nothing(tmp_path: Path) -> None:
    """verl writes the tracker last: until it names the new step, the save is not over and a resume would take the
    old checkpoint, so the old one stays even though the new directory already looks complete."""
    fakes.write_step(tmp_path, 1)
    assert inspect_step(fakes.write_step(tmp_path, 2, track=False)).complete
    assert remove_stale(tmp_path, 2, keep=1) == []
    assert steps_left(tmp_path) == [1, 2]
    assert inspect_step(tmp_path / "global_step_1").complete


def test_a_tracked_but_incomplete_new_step_deletes_nothing(tmp_path: Path) -> None:
    fakes.write_step(tmp_path, 1)
    fakes.truncate(fakes.shard(fakes.write_step(tmp_path, 2)))
    assert remove_stale(tmp_path, 2, keep=1) == []
    assert steps_left(tmp_path) == [1, 2]


def test_once_the_new_step_is_complete_and_tracked_the_old_ones_go(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        fakes.write_step(tmp_path, step)
    assert remove_stale(tmp_path, 3, keep=2) == [tmp_path / "global_step_1"]
    assert steps_left(tmp_path) == [2, 3]
    assert remove_stale(tmp_path, 3, keep=1) == [tmp_path / "global_step_2"]
    assert steps_left(tmp_path) == [3]


@pytest.mark.parametrize("keep", [0, -1])
def test_no_limit_deletes_nothing(tmp_path: Path, keep: int) -> None:
    fakes.write_step(tmp_path, 1)
    fakes.write_step(tmp_path, 2)
    assert remove_stale(tmp_path, 2, keep=keep) == []
    assert stale_steps(tmp_path, 2, keep=keep) == []
    assert steps_left(tmp_path) == [1, 2]


def test_retention_counts_the_new_step_among_those_kept(tmp_path: Path) -> None:
    """keep=N leaves N complete checkpoints up to the new one, the new one included."""
    for step in (1, 2, 3, 4):
        fakes.write_step(tmp_path, step)
    for keep in (1, 2, 3, 4, 5):
        gone = stale_steps(tmp_path, 4, keep=keep)
        assert gone == [tmp_path / f"global_step_{s}" for s in range(1, max(5 - keep, 1))], keep


def test_a_partial_step_between_complete_ones_is_not_counted_as_kept(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        fakes.write_step(tmp_path, step)
    fakes.truncate(fakes.shard(tmp_path / "global_step_2"))
    assert stale_steps(tmp_path, 3, keep=2) == [tmp_path / "global_step_2"]


def test_later_steps_are_never_touched(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        fakes.write_step(tmp_path, step)
    assert stale_steps(tmp_path, 2, keep=1) == [tmp_path / "global_step_1"]


# --- what counts as a step directory and as a tracker ----------------------------------------------------------


def test_step_dirs_are_numbered_directories_in_step_order(tmp_path: Path) -> None:
    for name in ("global_step_10", "global_step_9", "global_step_x", "global_step_3.broken", "other"):
        (tmp_path / name).mkdir()
    (tmp_path / "global_step_4").write_text("a file, not a save")
    assert step_dirs(tmp_path) == [(9, tmp_path / "global_step_9"), (10, tmp_path / "global_step_10")]
    assert step_dirs(tmp_path / "missing") == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [("7", 7), ("7\n", 7), (" 12 ", 12), ("", "not a step number"), ("-1", "not a step number"), ("3.0", "holds")],
)
def test_the_tracker_holds_a_step_number(tmp_path: Path, text: str, expected: int | str) -> None:
    (tmp_path / TRACKER).write_text(text)
    found = read_tracker(tmp_path)
    if isinstance(expected, int):
        assert found == expected
    else:
        assert isinstance(found, str)
        assert expected in found


def test_a_tracker_that_is_not_text_is_described(tmp_path: Path) -> None:
    (tmp_path / TRACKER).write_bytes(b"\xff\xfe")
    found = read_tracker(tmp_path)
    assert isinstance(found, str)
    assert "cannot be read" in found
    assert read_tracker(tmp_path / "nothing") is None


# --- what a complete step is -----------------------------------------------------------------------------------


def test_a_shard_as_long_as_its_metadata_says_is_complete_one_byte_less_is_not(tmp_path: Path) -> None:
    step = fakes.write_step(tmp_path, 1)
    shard = fakes.shard(step)
    data = shard.read_bytes()
    assert inspect_step(step).complete
    shard.write_bytes(data + b"\0")  # longer than recorded: torch only reads what .metadata places
    assert inspect_step(step).complete
    shard.write_bytes(data[:-1])
    (problem,) = inspect_step(step).problems
    assert f"is {len(data) - 1} bytes, .metadata records items up to byte {len(data)}: truncated" in problem


def test_a_critic_is_checked_like_the_actor(tmp_path: Path) -> None:
    step = fakes.write_step(tmp_path, 1)
    fakes.write_dist_ckpt(step / "critic" / "dist_ckpt")
    assert inspect_step(step).complete
    fakes.truncate(next((step / "critic" / "dist_ckpt").glob("*.distcp")))
    assert [p.split(":")[0] for p in inspect_step(step).problems] == ["critic/dist_ckpt"]


def test_a_step_without_an_actor_is_incomplete(tmp_path: Path) -> None:
    step = fakes.write_step(tmp_path, 1)
    (step / "actor").rename(step / "critic")
    assert "no actor/ directory" in inspect_step(step).problems


def test_a_missing_step_names_itself(tmp_path: Path) -> None:
    state = inspect_step(tmp_path / "global_step_5")
    assert (state.step, state.problems) == (5, ("does not exist",))
    assert state.describe() == f"{tmp_path / 'global_step_5'}: does not exist"
    assert inspect_step(fakes.write_step(tmp_path, 6)).describe() == f"{tmp_path / 'global_step_6'} complete"


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ('{"sharded_backend": "zarr"}', "names sharded_backend 'zarr', expected 'torch_dist'"),
        ("{}", "names sharded_backend None"),
        ('{"sharded_backend": "torch_dist"', "not readable JSON"),
        ("[1]", "not readable JSON"),
    ],
)
def test_metadata_json_must_name_the_torch_dist_backend(tmp_path: Path, metadata: str, expected: str) -> None:
    dist = tmp_path / "dist_ckpt"
    fakes.write_dist_ckpt(dist)
    (dist / "metadata.json").write_text(metadata)
    problems = dist_ckpt_problems(dist)
    assert len(problems) == 1
    assert expected in problems[0]


def test_a_dist_checkpoint_without_its_index_is_incomplete(tmp_path: Path) -> None:
    dist = tmp_path / "dist_ckpt"
    fakes.write_dist_ckpt(dist)
    (dist / ".metadata").unlink()
    assert dist_ckpt_problems(dist) == ["missing .metadata (torch's index of the shard files)"]
    assert dist_ckpt_problems(tmp_path / "absent") == ["missing (the save never started writing shards)"]


def test_an_index_naming_no_shard_is_incomplete(tmp_path: Path) -> None:
    """torch's Metadata with an empty storage_data, pickled as torch pickles it."""
    import pickle

    import torch.distributed.checkpoint.metadata as dcp_metadata

    dist = tmp_path / "dist_ckpt"
    fakes.write_dist_ckpt(dist)
    (dist / ".metadata").write_bytes(pickle.dumps(dcp_metadata.Metadata(state_dict_metadata={}, storage_data={})))
    assert dist_ckpt_problems(dist) == [".metadata records no shard file"]


# --- where a resume starts -------------------------------------------------------------------------------------


def test_an_explicit_resume_path_must_be_complete(tmp_path: Path) -> None:
    good = fakes.write_step(tmp_path, 2)
    bad = fakes.write_step(tmp_path, 4)
    fakes.truncate(fakes.shard(bad))
    decision = resume_decision(tmp_path, resume_from=good)
    assert (decision.ok, decision.step) == (True, 2)
    refused = resume_decision(tmp_path, resume_from=bad)
    assert not refused.ok
    assert f"trainer.resume_from_path={bad} is not a complete checkpoint" in refused.message
    assert f"resume from the newest complete checkpoint, global_step_2: trainer.resume_mode=resume_path " \
        f"trainer.resume_from_path={good}" in refused.message  # fmt: skip


def test_the_way_back_names_the_newest_complete_step(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        fakes.write_step(tmp_path, step)
    fakes.truncate(fakes.shard(tmp_path / "global_step_3"))
    decision = resume_decision(tmp_path)
    assert not decision.ok
    assert "global_step_2: trainer.resume_mode=resume_path" in decision.message
    assert f"(or write 2 to {tmp_path / TRACKER})" in decision.message


def test_no_complete_step_left_says_so(tmp_path: Path) -> None:
    fakes.truncate(fakes.shard(fakes.write_step(tmp_path, 1)))
    decision = resume_decision(tmp_path)
    assert not decision.ok
    assert "no complete checkpoint is left under it" in decision.message


def test_an_unreadable_tracker_is_moved_aside_in_the_fix(tmp_path: Path) -> None:
    fakes.write_step(tmp_path, 1)
    (tmp_path / TRACKER).write_text("garbage")
    decision = resume_decision(tmp_path)
    assert not decision.ok
    assert f"move {tmp_path / TRACKER} aside" in decision.message


def test_metadata_json_is_read_as_json(tmp_path: Path) -> None:
    """The fake writes what megatron-core writes; the rule reads the same key."""
    dist = tmp_path / "dist_ckpt"
    fakes.write_dist_ckpt(dist)
    assert json.loads((dist / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    assert dist_ckpt_problems(dist) == []


# --- reading torch's checkpoint index without torch --------------------------------------------------------------

#: A module the reader cannot import: the index names its classes, as it names torch's where torch is absent.
ABSENT = "checkpoint_writer_not_installed"


def write_index(dist: Path, items: list[tuple[object, ...]], *, slots: bool = False, mapping: type = dict) -> None:
    """A dist checkpoint whose ``.metadata`` pickles ``Metadata(storage_data={index: StorageInfo(...)})`` with classes
    of a module that is not installed. Each item is (relative_path, offset, length); a missing field is left out."""
    import pickle
    import types

    fakes.write_dist_ckpt(dist)
    module = types.ModuleType(ABSENT)

    class StorageInfo:
        def __init__(self, fields: dict[str, object]) -> None:
            self.__dict__.update(fields)

    if slots:

        class Metadata:  # its state pickles as (None, {slot: value})
            __slots__ = ("storage_data",)

    else:

        class Metadata:  # its state pickles as a dict
            pass

    for cls in (StorageInfo, Metadata):
        cls.__module__ = ABSENT
        cls.__qualname__ = cls.__name__
        setattr(module, cls.__name__, cls)
    names = ("relative_path", "offset", "length")
    storage = mapping((f"item{i}", StorageInfo(dict(zip(names, item, strict=False)))) for i, item in enumerate(items))
    metadata = Metadata()
    if items or slots:
        metadata.storage_data = storage
    sys.modules[ABSENT] = module
    try:
        data = pickle.dumps(metadata, protocol=2)
    finally:
        del sys.modules[ABSENT]
    (dist / ".metadata").write_bytes(data)


def shard_of(dist: Path, name: str, size: int) -> None:
    (dist / name).write_bytes(b"\0" * size)


@pytest.mark.parametrize("slots", [False, True], ids=["dict-state", "slots-state"])
def test_the_index_is_read_without_importing_what_it_names(tmp_path: Path, slots: bool) -> None:
    import collections

    dist = tmp_path / "dist_ckpt"
    write_index(dist, [("a.distcp", 0, 8)], slots=slots, mapping=collections.OrderedDict)
    shard_of(dist, "a.distcp", 8)
    assert dist_ckpt_problems(dist) == []
    assert ABSENT not in sys.modules
    shard_of(dist, "a.distcp", 7)
    assert dist_ckpt_problems(dist) == ["shard a.distcp is 7 bytes, .metadata records items up to byte 8: truncated"]


def test_a_shard_must_reach_the_end_of_its_last_item_in_any_order(tmp_path: Path) -> None:
    dist = tmp_path / "dist_ckpt"
    write_index(dist, [("a.distcp", 60, 40), ("a.distcp", 10, 20), ("b.distcp", 0, 5)])
    shard_of(dist, "a.distcp", 100)
    shard_of(dist, "b.distcp", 5)
    assert dist_ckpt_problems(dist) == []
    shard_of(dist, "a.distcp", 99)
    assert dist_ckpt_problems(dist) == ["shard a.distcp is 99 bytes, .metadata records items up to byte 100: truncated"]
    shard_of(dist, "a.distcp", 100)
    (dist / "b.distcp").unlink()
    assert dist_ckpt_problems(dist) == ["missing shard b.distcp"]


def test_an_empty_item_needs_no_byte(tmp_path: Path) -> None:
    dist = tmp_path / "dist_ckpt"
    write_index(dist, [("empty.distcp", 0, 0)])
    shard_of(dist, "empty.distcp", 0)
    assert dist_ckpt_problems(dist) == []


def test_items_without_a_path_offset_and_length_are_skipped(tmp_path: Path) -> None:
    """Only (str, int, int) items place bytes in a file; anything else in the index is not a storage record."""
    dist = tmp_path / "dist_ckpt"
    write_index(
        dist, [("a.distcp", "0", 10), (None, 0, 10), ("b.distcp", 0, 10.0), ("c.distcp", 0), ("d.distcp", 0, 4)]
    )
    shard_of(dist, "d.distcp", 4)
    assert dist_ckpt_problems(dist) == []


def test_an_index_without_storage_data_says_what_it_found(tmp_path: Path) -> None:
    dist = tmp_path / "dist_ckpt"
    write_index(dist, [])
    assert dist_ckpt_problems(dist) == [
        ".metadata cannot be read (ValueError: no storage_data mapping in the pickled metadata (found NoneType)): "
        "truncated?"
    ]


def test_a_truncated_index_names_the_unpicklers_error(tmp_path: Path) -> None:
    import pickle

    dist = tmp_path / "dist_ckpt"
    fakes.write_dist_ckpt(dist)
    fakes.truncate(dist / ".metadata")
    try:
        pickle.loads((dist / ".metadata").read_bytes())
    except Exception as exc:  # what any unpickler meets in these bytes
        expected = type(exc).__name__
    (problem,) = dist_ckpt_problems(dist)
    assert problem.startswith(f".metadata cannot be read ({expected}: ")


# --- messages a user acts on -------------------------------------------------------------------------------------


def test_every_missing_file_of_a_dist_checkpoint_is_named(tmp_path: Path) -> None:
    dist = tmp_path / "dist_ckpt"
    fakes.write_dist_ckpt(dist)
    (dist / "common.pt").unlink()
    assert dist_ckpt_problems(dist) == ["missing common.pt"]
    (dist / "metadata.json").unlink()
    assert dist_ckpt_problems(dist) == [
        "no metadata.json (megatron-core writes it after every shard: the save did not finish)"
    ]


def test_a_bad_backend_and_a_bad_common_file_are_both_named(tmp_path: Path) -> None:
    dist = tmp_path / "dist_ckpt"
    fakes.write_dist_ckpt(dist)
    (dist / "metadata.json").write_text('{"sharded_backend": "zarr"}')
    fakes.truncate(dist / "common.pt")
    problems = dist_ckpt_problems(dist)
    assert [p.split(" ")[0] for p in problems] == ["metadata.json", "common.pt"]


def test_a_step_named_otherwise_has_no_step_number(tmp_path: Path) -> None:
    step = fakes.write_step(tmp_path, 3)
    state = inspect_step(step.rename(tmp_path / "latest"))
    assert (state.step, state.complete) == (-1, True)
    assert inspect_step(tmp_path / "global_step_3x").step == -1
    assert inspect_step(fakes.write_step(tmp_path, 4)).step == 4


def test_a_step_describes_every_problem(tmp_path: Path) -> None:
    step = fakes.write_step(tmp_path, 3)
    (step / "data.pt").unlink()
    (step / "actor").rename(step / "elsewhere")
    state = inspect_step(step)
    assert state.describe() == f"{step}: {'; '.join(state.problems)}"
    assert len(state.problems) == 2


def test_a_garbage_tracker_shows_its_first_40_characters(tmp_path: Path) -> None:
    (tmp_path / TRACKER).write_text("x" * 60)
    found = read_tracker(tmp_path)
    assert isinstance(found, str)
    assert f"holds {'x' * 40!r}, not a step number" in found


def test_the_resume_messages(tmp_path: Path) -> None:
    """Each decision says what it found and, when it refuses, the fix; no fix names a path that is not there."""
    assert resume_decision(tmp_path).message == f"no checkpoint under {tmp_path}: starts from step 0"
    two = fakes.write_step(tmp_path, 2)
    assert resume_decision(tmp_path).message == f"resumes from {two} (complete)"
    assert resume_decision(tmp_path, resume_from=two).message == f"resumes from {two} (complete)"
    (tmp_path / TRACKER).write_text("4")
    missing = resume_decision(tmp_path).message
    assert "aside (e.g. mv" not in missing  # global_step_4 does not exist: nothing to move aside
    assert "Fix: resume from the newest complete checkpoint, global_step_2" in missing
    assert missing.endswith(
        "To start again from step 0 on purpose, move the global_step_* directories aside or set "
        "trainer.resume_mode=disable."
    )


def test_untracked_checkpoints_are_listed(tmp_path: Path) -> None:
    fakes.write_step(tmp_path, 2, track=False)
    three = fakes.write_step(tmp_path, 3, track=False)
    (three / "data.pt").unlink()
    message = resume_decision(tmp_path).message
    assert f"ignore them ({tmp_path / 'global_step_2'} complete; {three}: missing data.pt" in message


def test_no_complete_checkpoint_left_says_how_to_start_over(tmp_path: Path) -> None:
    (fakes.write_step(tmp_path, 1) / "data.pt").unlink()
    message = resume_decision(tmp_path).message
    assert message.endswith(
        "Fix: no complete checkpoint is left under it; to start again from step 0 on purpose, move the "
        "global_step_* directories and the tracker aside (or set trainer.resume_mode=disable)."
    )


def test_a_refused_resume_path_lists_its_problems_and_the_way_back(tmp_path: Path) -> None:
    good = fakes.write_step(tmp_path, 1)
    bad = fakes.write_step(tmp_path, 2)
    (bad / "data.pt").unlink()
    (bad / "actor").rename(bad / "elsewhere")
    decision = resume_decision(tmp_path, resume_from=bad)
    assert decision.step is None
    assert decision.message.startswith(
        f"trainer.resume_from_path={bad} is not a complete checkpoint: {'; '.join(inspect_step(bad).problems)}. Fix: "
    )
    assert f"trainer.resume_from_path={good} (or write 1 to {tmp_path / TRACKER})" in decision.message


def test_the_tracker_is_dated_by_when_verl_wrote_it(tmp_path: Path) -> None:
    """A poll sees the tracker later than verl wrote it: the step's start is measured from the write."""
    import os

    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    os.utime(tmp_path / "latest_checkpointed_iteration.txt", (1000.0, 1234.5))
    assert tracker_written_at(tmp_path) == 1234.5
