"""``verdicts.model_summary``: the actor the rehearsal reports (class, parameters per expert-parallel rank, layout),
read from the workers' ``model`` records."""

from __future__ import annotations

import pytest

from r1_ascend.rehearse.progress import RehearsalError
from r1_ascend.rehearse.verdicts import model_summary

GPT = "megatron.core.models.gpt.gpt_model.GPTModel"


def record(ep_rank: int, parameters: int, cls: str = GPT, **layout: int) -> dict[str, object]:
    return {
        "event": "model",
        "cls": cls,
        "ep_rank": ep_rank,
        "parameters": parameters,
        **{"tp": 1, "ep": 2, "pp": 1, "dp": 2, **layout},
    }


def test_without_a_model_record_the_stand_ins_are_named() -> None:
    with pytest.raises(RehearsalError, match=r"no worker recorded the model it built \(stand-ins not installed\?\)"):
        model_summary([{"event": "generate"}])


def test_the_class_layout_and_each_ep_ranks_parameters_are_reported() -> None:
    events = [{"event": "release"}, record(0, 3_793_344), record(1, 3_793_344), record(0, 3_793_344)]
    assert model_summary(events) == {
        "class": GPT,
        "parameters_per_rank": [3_793_344],
        "layout": {"tp": 1, "ep": 2, "pp": 1, "dp": 2},
    }


def test_ranks_holding_different_parameter_counts_are_all_listed_in_order() -> None:
    summary = model_summary([record(1, 900), record(0, 700), record(2, 800)])
    assert summary["parameters_per_rank"] == [700, 800, 900]


def test_the_first_records_class_and_layout_win_and_other_classes_are_left_out() -> None:
    events = [record(0, 500, tp=2), record(1, 600, cls="other.Model", tp=4), record(1, 550)]
    summary = model_summary(events)
    assert summary["class"] == GPT
    assert summary["parameters_per_rank"] == [500, 550]
    assert summary["layout"] == {"tp": 2, "ep": 2, "pp": 1, "dp": 2}
