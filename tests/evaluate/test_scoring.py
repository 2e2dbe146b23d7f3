"""Each sample is scored by the recipe's reward, called as verl's naive reward manager calls it; empty, truncated
and malformed-row samples are counted wrong with their reason, the reward's own verdict kept."""

from __future__ import annotations

import ast
import inspect

from r1_ascend.data.template import build_prompt
from r1_ascend.evaluate.generation import LENGTH, STOP, Completion
from r1_ascend.evaluate.problems import Problem
from r1_ascend.evaluate.scoring import (
    EMPTY_RESPONSE,
    MALFORMED_ROW,
    TRUNCATED,
    malformed_samples,
    reward_fn,
    score_sample,
)

from .conftest import boxed

PROBLEM = Problem("aime24", 3, "val.parquet:3", build_prompt("What is 2 + 3?"), "5", {"index": 3, "split": "test"})


def test_the_reward_is_the_file_verl_loads_for_the_recipe() -> None:
    from r1_ascend.recipe import deepscaler_reward

    assert reward_fn() is deepscaler_reward.compute_score


def test_right_wrong_and_equivalent_answers_are_the_rewards_verdict() -> None:
    score = reward_fn()
    right = score_sample(PROBLEM, 0, Completion(boxed("5"), STOP, 20), score)
    assert (right.correct, right.reason, right.reward["acc"]) == (True, "", 1.0)
    equivalent = score_sample(PROBLEM, 1, Completion(boxed("5.0"), STOP, 20), score)
    assert equivalent.correct
    wrong = score_sample(PROBLEM, 2, Completion(boxed("6"), STOP, 20), score)
    assert (wrong.correct, wrong.reason) == (False, "wrong_answer")
    no_think = score_sample(PROBLEM, 3, Completion("\\boxed{5}", STOP, 5), score)
    assert (no_think.correct, no_think.reason) == (False, "no_think_close")


def test_empty_and_truncated_responses_count_wrong_with_the_reward_kept() -> None:
    score = reward_fn()
    empty = score_sample(PROBLEM, 0, Completion("  \n", STOP, 1), score)
    assert (empty.correct, empty.reason, empty.reward["acc"]) == (False, EMPTY_RESPONSE, 0.0)
    truncated = score_sample(PROBLEM, 1, Completion(boxed("5"), LENGTH, 32768), score)
    assert (truncated.correct, truncated.reason) == (False, TRUNCATED)
    assert truncated.reward["acc"] == 1.0  # the reward alone would have accepted it
    assert (truncated.finish_reason, truncated.tokens) == (LENGTH, 32768)


def test_a_malformed_rows_samples_are_all_wrong_and_say_why() -> None:
    bad = Problem("amc", 0, "val.parquet:7", None, "5", malformed="no prompt")
    results = malformed_samples(bad, 3)
    assert [(r.sample, r.correct, r.reward) for r in results] == [(0, False, None), (1, False, None), (2, False, None)]
    assert {r.reason for r in results} == {f"{MALFORMED_ROW}: no prompt"}


def _naive_manager_keywords() -> tuple[list[str], set[str]]:
    """The keyword names verl 0.6.1's NaiveRewardManager passes to compute_score, and the keys it adds to
    extra_info, read from its source."""
    from verl.workers.reward_manager.naive import NaiveRewardManager

    tree = ast.parse(inspect.getsource(NaiveRewardManager.__call__).lstrip())
    calls = [
        node for node in ast.walk(tree) if isinstance(node, ast.Call) and ast.unparse(node.func) == "self.compute_score"
    ]
    assert len(calls) == 1
    added = {
        node.targets[0].slice.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Subscript)
        and ast.unparse(node.targets[0].value) == "extra_info"
    }
    return [k.arg for k in calls[0].keywords], added


def test_the_call_has_verls_keywords_and_values() -> None:
    calls = []

    def recording(**kwargs):
        calls.append(kwargs)
        return {"score": 1.0, "acc": 1.0, "fail_reason": ""}

    result = score_sample(PROBLEM, 0, Completion("anything", STOP, 3), recording)
    assert result.correct
    keywords, added = _naive_manager_keywords()
    (call,) = calls
    assert list(call) == keywords
    assert call["data_source"] == "aime24"
    assert call["solution_str"] == "anything"
    assert call["ground_truth"] == "5"
    assert set(call["extra_info"]) == {"index", "split"} | added


def test_a_bare_float_reward_and_a_dict_without_acc_are_read_as_verl_reads_them() -> None:
    """verl accepts a float from compute_score, and a dict whose accuracy is only its ``score``."""
    text = boxed("5")
    for value, correct in ((1.0, True), (0.0, False)):
        result = score_sample(PROBLEM, 4, Completion(text, STOP, 9), lambda value=value, **_: value)
        assert result.reward == {"score": value, "acc": value}
        assert (result.sample, result.response, result.correct) == (4, text, correct)
        assert result.reason == ("" if correct else "wrong_answer")
    only_score = score_sample(PROBLEM, 0, Completion(text, STOP, 9), lambda **_: {"score": 1.0})
    assert only_score.correct
    neither = score_sample(PROBLEM, 0, Completion(text, STOP, 9), lambda **_: {"fail_reason": ""})
    assert (neither.correct, neither.reason) == (False, "wrong_answer")
    rejected = score_sample(PROBLEM, 0, Completion(text, STOP, 9), lambda **_: {"acc": 0.0, "score": 1.0})
    assert (rejected.correct, rejected.reason) == (False, "wrong_answer"), "acc decides when present"


def test_a_malformed_rows_samples_have_no_response() -> None:
    bad = Problem("amc", 0, "val.parquet:7", None, "5", malformed="no prompt")
    assert [r.response for r in malformed_samples(bad, 2)] == ["", ""]
