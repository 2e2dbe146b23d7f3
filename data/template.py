"""The R1-Zero prompt protocol: the instruction text, where it goes, and what DeepSeek-V3 finally sees.

The reward (``recipe/reward/``) must check for exactly the markers this instruction asks for, so the markers
are constants here and both sides import them instead of retyping strings.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

# --- Response protocol markers (what the instruction asks the model to write) ---
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
BOXED_OPEN = "\\boxed{"  # one backslash: the model must write \boxed{...}
BOXED = "\\boxed{}"
PROTOCOL_MARKERS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE, BOXED_OPEN)

# --- DeepSeek-V3 special tokens (tokenizer_config.json of deepseek-ai/DeepSeek-V3) ---
# Full-width vertical bars (U+FF5C) and U+2581 "▁", exactly as in the tokenizer vocabulary.
DEEPSEEK_BOS = "<｜begin▁of▁sentence｜>"
DEEPSEEK_EOS = "<｜end▁of▁sentence｜>"
DEEPSEEK_USER = "<｜User｜>"
DEEPSEEK_ASSISTANT = "<｜Assistant｜>"

# The R1-Zero training template (DeepSeek-R1 paper, Table 1), with one sentence added so that the final answer is
# machine-checkable: graders extract the last \boxed{...}. The paper's "User: prompt. Assistant:" tail is not
# part of the instruction: the chat template provides the turn markers.
R1_ZERO_INSTRUCTION = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the "
    f"answer. The reasoning process and answer are enclosed within {THINK_OPEN} {THINK_CLOSE} and "
    f"{ANSWER_OPEN} {ANSWER_CLOSE} tags, respectively, i.e., {THINK_OPEN} reasoning process here {THINK_CLOSE} "
    f"{ANSWER_OPEN} answer here {ANSWER_CLOSE}. Inside {ANSWER_OPEN} {ANSWER_CLOSE}, write the final answer "
    f"in {BOXED}, e.g. {ANSWER_OPEN} The final answer is {BOXED_OPEN}...}}. {ANSWER_CLOSE}"
)


class Placement(enum.StrEnum):
    """Where the instruction goes in the chat list."""

    SYSTEM = "system"  # instruction = system turn, problem = user turn (R1-Zero / r1 recipe default)
    USER = "user"  # one user turn: instruction, a blank line, then the problem (for templates without system)


DEFAULT_PLACEMENT = Placement.SYSTEM
USER_PLACEMENT_SEPARATOR = "\n\n"


def build_prompt(
    problem: str, *, placement: Placement | str = DEFAULT_PLACEMENT, instruction: str = R1_ZERO_INSTRUCTION
) -> list[dict[str, str]]:
    """Chat list for one problem, as verl's ``RLHFDataset`` expects it in the ``prompt`` column."""
    if not isinstance(placement, Placement):
        placement = Placement(placement)
    problem = problem.strip()
    if not instruction:
        return [{"role": "user", "content": problem}]
    if placement is Placement.SYSTEM:
        return [{"role": "system", "content": instruction}, {"role": "user", "content": problem}]
    return [{"role": "user", "content": f"{instruction}{USER_PLACEMENT_SEPARATOR}{problem}"}]


def missing_markers(instruction: str) -> list[str]:
    """Protocol markers a custom instruction never mentions (the reward will then score the model 0)."""
    return [marker for marker in PROTOCOL_MARKERS if marker not in instruction]


def render_deepseek_v3(messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
    """Text the model sees for a system/user/assistant chat under DeepSeek-V3's chat template.

    Re-implements the part of the published template that plain chats exercise (no tool calls): BOS, then all
    system contents (joined by a blank line, as the V3-0324 template does; a single system turn is identical in
    every V3 revision), then each user turn as ``<｜User｜>content`` and each assistant turn as
    ``<｜Assistant｜>content<｜end▁of▁sentence｜>``; with ``add_generation_prompt`` it ends on ``<｜Assistant｜>``.
    """
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    parts = [DEEPSEEK_BOS, system]
    for message in messages:
        if message["role"] == "user":
            parts.append(DEEPSEEK_USER + message["content"])
        elif message["role"] == "assistant":
            parts.append(DEEPSEEK_ASSISTANT + message["content"] + DEEPSEEK_EOS)
    if add_generation_prompt:
        parts.append(DEEPSEEK_ASSISTANT)
    return "".join(parts)


# The same subset as a Jinja chat template, for small stand-in tokenizers (CPU tests, quickstart) that must
# format prompts the way DeepSeek-V3 does. Expects bos_token/eos_token to be DeepSeek's tokens.
DEEPSEEK_V3_CHAT_TEMPLATE_SUBSET = (
    "{{ bos_token }}"
    "{% set ns = namespace(system='', first=true) %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{% if ns.first %}{% set ns.system = m['content'] %}{% set ns.first = false %}"
    "{% else %}{% set ns.system = ns.system + '\\n\\n' + m['content'] %}{% endif %}"
    "{% endif %}{% endfor %}{{ ns.system }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}{{ '" + DEEPSEEK_USER + "' + m['content'] }}"
    "{% elif m['role'] == 'assistant' %}{{ '" + DEEPSEEK_ASSISTANT + "' + m['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + DEEPSEEK_ASSISTANT + "' }}{% endif %}"
)
