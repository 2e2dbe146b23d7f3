"""The reward inside verl 0.6.1's own reward managers: token batches in, per-token reward and extra-info lists out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from r1_ascend.recipe.reward import SCORE_KEYS, compute_score, compute_score_batch

# (response, ground truth, expected acc) -- the expectation is the protocol's, written by hand.
CASES = [
    ("<think>1+1 is 2</think> <answer> The final answer is \\boxed{2}. </answer>", "2", 1.0),
    ("<think>guess</think> <answer> \\boxed{3} </answer>", "2", 0.0),
    ("the answer is \\boxed{2}", "2", 0.0),  # no </think>
    ("<think>so \\boxed{2}</think> I am not sure.", "2", 0.0),  # box only in the reasoning
    ("</think> \\boxed{\\frac{1}{2}}", "0.5", 1.0),  # prompt already opened <think>
]
PROMPT = "<｜User｜>What is 1+1?<｜Assistant｜>"


@pytest.fixture(scope="module")
def byte_tokenizer():
    """A byte-level BPE tokenizer: decoding gives back exactly the text that was encoded, as a real one does."""
    from transformers import PreTrainedTokenizerFast

    from r1_ascend.launch.tiny_tokenizer import train_byte_level

    model = train_byte_level([PROMPT] + [response for response, _, _ in CASES], 400, ["[PAD]"])
    return PreTrainedTokenizerFast(tokenizer_object=model, pad_token="[PAD]")


def _batch(tokenizer):
    """A DataProto laid out as verl's rollout leaves it: left-padded prompts, right-padded responses."""
    from verl import DataProto

    pad = tokenizer.pad_token_id
    prompt = tokenizer.encode(PROMPT)
    responses = [tokenizer.encode(response) for response, _, _ in CASES]
    assert [tokenizer.decode(ids) for ids in responses] == [response for response, _, _ in CASES]
    width = max(map(len, responses)) + 3
    prompts = torch.tensor([prompt] * len(CASES))
    response_ids = torch.full((len(CASES), width), pad)
    response_mask = torch.zeros((len(CASES), width), dtype=torch.long)
    for row, ids in enumerate(responses):
        response_ids[row, : len(ids)] = torch.tensor(ids)
        response_mask[row, : len(ids)] = 1
    attention_mask = torch.cat([torch.ones_like(prompts), response_mask], dim=1)
    data = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": response_ids,
            "input_ids": torch.cat([prompts, response_ids], dim=1),
            "attention_mask": attention_mask,
        },
        non_tensors={
            "data_source": np.array(["deepscaler"] * len(CASES), dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": truth} for _, truth, _ in CASES], dtype=object),
            "extra_info": np.array([{"index": row} for row in range(len(CASES))], dtype=object),
        },
    )
    return data, [len(ids) for ids in responses]


def _check(output: dict, lengths: list[int]) -> None:
    rewards = output["reward_tensor"]
    for row, (_, _, acc) in enumerate(CASES):
        assert rewards[row, lengths[row] - 1].item() == acc, CASES[row][0]
        assert rewards[row].sum().item() == acc  # only the last response token carries the score
    info = output["reward_extra_info"]
    assert set(info) == set(SCORE_KEYS)
    assert list(info["acc"]) == [acc for _, _, acc in CASES]
    assert [reason == "" for reason in info["fail_reason"]] == [acc == 1.0 for _, _, acc in CASES]


def test_naive_reward_manager_scores_decoded_responses(byte_tokenizer) -> None:
    from verl.workers.reward_manager.naive import NaiveRewardManager

    data, lengths = _batch(byte_tokenizer)
    manager = NaiveRewardManager(byte_tokenizer, num_examine=0, compute_score=compute_score)
    _check(manager(data, return_dict=True), lengths)


def test_batch_reward_manager_scores_decoded_responses(byte_tokenizer) -> None:
    from verl.workers.reward_manager.batch import BatchRewardManager

    data, lengths = _batch(byte_tokenizer)
    manager = BatchRewardManager(byte_tokenizer, num_examine=0, compute_score=compute_score_batch, timeout_s=5.0)
    _check(manager(data, return_dict=True), lengths)
