"""The R1-Zero prompt: protocol constants, placement, and the exact text DeepSeek-V3's chat template produces."""

from __future__ import annotations

import jinja2
import pytest

from r1_ascend.data import template as t


def test_instruction_states_the_protocol_with_single_backslash() -> None:
    for marker in (t.THINK_OPEN, t.THINK_CLOSE, t.ANSWER_OPEN, t.ANSWER_CLOSE, t.BOXED_OPEN):
        assert marker in t.R1_ZERO_INSTRUCTION
    assert t.BOXED_OPEN == "\\" + "boxed{"
    assert "\\\\boxed" not in t.R1_ZERO_INSTRUCTION  # the predecessor recipe asked for a literal "\\boxed"
    assert t.missing_markers(t.R1_ZERO_INSTRUCTION) == []
    assert t.missing_markers("Think step by step.") == list(t.PROTOCOL_MARKERS)


def test_system_placement_is_default_and_what_the_model_sees() -> None:
    prompt = t.build_prompt("  What is $1+1$?\n")
    assert prompt == [
        {"role": "system", "content": t.R1_ZERO_INSTRUCTION},
        {"role": "user", "content": "What is $1+1$?"},
    ]
    rendered = t.render_deepseek_v3(prompt)
    assert rendered == ("<｜begin▁of▁sentence｜>" + t.R1_ZERO_INSTRUCTION + "<｜User｜>What is $1+1$?<｜Assistant｜>")
    # the prompt ends on the assistant tag: the model has to open <think> itself
    assert not rendered.endswith(t.THINK_OPEN)


def test_user_placement_and_empty_instruction() -> None:
    assert t.build_prompt("Q", placement="user") == [{"role": "user", "content": t.R1_ZERO_INSTRUCTION + "\n\nQ"}]
    assert t.build_prompt("Q", instruction="") == [{"role": "user", "content": "Q"}]
    with pytest.raises(ValueError, match="'middle'"):
        t.build_prompt("Q", placement="middle")


def test_special_tokens_use_fullwidth_bars_and_lower_blocks() -> None:
    for token in (t.DEEPSEEK_BOS, t.DEEPSEEK_EOS, t.DEEPSEEK_USER, t.DEEPSEEK_ASSISTANT):
        assert token.startswith("<\uff5c")
        assert token.endswith("\uff5c>")
    assert "\u2581" in t.DEEPSEEK_BOS
    assert "\u2581" in t.DEEPSEEK_EOS


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        [{"role": "user", "content": "U"}],
        [{"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}],
        [{"role": "user", "content": "U"}, {"role": "system", "content": "S1"}, {"role": "system", "content": "S2"}],
    ],
)
@pytest.mark.parametrize("generation", [True, False])
def test_jinja_subset_matches_python_renderer(messages, generation: bool) -> None:
    """The Jinja template given to stand-in tokenizers renders exactly what render_deepseek_v3 documents."""
    env = jinja2.Environment(autoescape=False)
    rendered = env.from_string(t.DEEPSEEK_V3_CHAT_TEMPLATE_SUBSET).render(
        messages=messages, bos_token=t.DEEPSEEK_BOS, eos_token=t.DEEPSEEK_EOS, add_generation_prompt=generation
    )
    assert rendered == t.render_deepseek_v3(messages, add_generation_prompt=generation)
