"""``lifecycle.check_sampling``: every generation sampled through vLLM's ``Sampler.forward`` as the overlay replaced it.

Records are built as ``r1_ascend.rehearse.worker_hooks`` writes them: a ``generate`` record, then after the
generation a ``sampled`` record with the engine's ``SamplerCalls``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from r1_ascend.rehearse.lifecycle import CYCLE, SAMPLER_PATCH, LifecycleError, check_sampling

PIDS = (101, 102)


def records(pids: tuple[int, ...] = PIDS, cycles: int = 3, calls: int = 24) -> list[dict[str, Any]]:
    """Healthy records of ``pids``: the build's release, then ``cycles`` whole cycles, each generation sampled."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for pid in pids:
        names = ["release"]
        for _ in range(cycles):
            for name in CYCLE:
                names.append(name)
                if name == "generate":
                    names.append("sampled")
        for name in names:
            t += 0.01
            event: dict[str, Any] = {"t": t, "pid": pid, "event": name}
            if name == "sampled":
                event.update(calls=calls, patched_by=[SAMPLER_PATCH])
            events.append(event)
    return events


def sampled_indices(events: list[dict[str, Any]]) -> list[int]:
    return [i for i, e in enumerate(events) if e["event"] == "sampled"]


def test_healthy_records_pass_with_their_counts() -> None:
    assert check_sampling(records(), set()) == (
        f"6 generations sampled by vLLM's Sampler.forward as {SAMPLER_PATCH} replaced it (144 calls)"
    )


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"patched_by": ["upstream"]}, "upstream"),
        ({"patched_by": [SAMPLER_PATCH, "upstream"]}, "upstream"),
        ({"patched_by": ["another_patch"]}, "another_patch"),
        ({"patched_by": []}, r"\[\]"),
        ({"calls": 0}, "called 0 times"),
    ],
)
def test_a_generation_not_sampled_by_the_overlays_sampler_fails(fields: dict[str, Any], why: str) -> None:
    events = records()
    events[sampled_indices(events)[2]].update(fields)
    with pytest.raises(LifecycleError, match=rf"worker pid 101 generated with .*{why}.*before temperature"):
        check_sampling(events, set())


def test_no_sampling_record_at_all_fails() -> None:
    events = [e for e in records() if e["event"] != "sampled"]
    with pytest.raises(LifecycleError, match="recorded no sampling before its 'release'"):
        check_sampling(events, set())
    with pytest.raises(LifecycleError, match="no worker recorded how a generation sampled"):
        check_sampling([e for e in events if e["event"] != "generate"], set())


def test_a_sampling_record_without_a_generation_fails() -> None:
    events = records()
    extra = {**events[sampled_indices(events)[0]], "t": events[0]["t"] - 1}
    with pytest.raises(LifecycleError, match="worker pid 101 recorded sampling with no generation before it"):
        check_sampling([extra, *events], set())


def test_the_last_generation_of_a_killed_worker_may_lack_its_sampling_a_finished_one_may_not() -> None:
    events = records()
    last_of_101 = max(i for i in sampled_indices(events) if events[i]["pid"] == 101)
    cut = events[:last_of_101] + [e for e in events[last_of_101 + 1 :] if e["pid"] != 101]
    assert check_sampling(cut, {101}).startswith("5 generations")
    with pytest.raises(LifecycleError, match=r"workers \[101\] recorded a last generation without its sampling"):
        check_sampling(cut, set())


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_generation_left_without_its_sampling_fails_unless_the_worker_was_killed_there(
    data: st.DataObject,
) -> None:
    """Drop any one ``sampled`` record: the check fails, except for a killed worker whose record ends right there (the
    kill came during that generation)."""
    events = records()
    index = data.draw(st.sampled_from(sampled_indices(events)))
    pid = events[index]["pid"]
    killed = data.draw(st.sets(st.sampled_from(PIDS)))
    truncate = data.draw(st.booleans())
    kept = events[:index] + [e for e in events[index + 1 :] if not (truncate and e["pid"] == pid)]
    if pid in killed and truncate:
        check_sampling(kept, killed)
    else:
        with pytest.raises(LifecycleError, match=rf"{pid}.*(without its sampling|no sampling before)"):
            check_sampling(kept, killed)


def test_one_sampler_call_is_enough_and_a_record_without_a_count_is_not() -> None:
    """A one-token response calls the sampler once; a record that does not say how often it ran proves nothing."""
    assert check_sampling(records(calls=1), set())
    events = records()
    del events[sampled_indices(events)[0]]["calls"]
    with pytest.raises(LifecycleError, match="called None times"):
        check_sampling(events, set())
