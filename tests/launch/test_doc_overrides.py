"""Every Hydra override the docs show works on the shipped configuration it is shown for.

An override is a ``key=value`` (``+key=value``, ``++key=value``, ``~key``) inside a code span or block of README.md or
docs/*.md whose first part is a top-level key of the shipped configs (``trainer.``, ``actor_rollout_ref.``,
``r1_ascend.``, ...). It is composed, alone, on the shipped config its context names — in the paragraph, list item or
table row it appears in, the config named last before it, else the first one named after it — or on
``grpo_deepseekv3_671b`` (the run scripts' default) when the context names none, the way the run scripts and preflight
compose it. Hydra refuses a ``+`` on a key the config already has and a plain
override of a key it lacks; either would stop a user at the first command.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from r1_ascend.launch.overlays import OverlayError, compose, overlay_names

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DEFAULT_CONFIG = "grpo_deepseekv3_671b"

CODE_SPAN = re.compile(r"```[^\n]*\n(.*?)```|`([^`\n]+)`", re.S)


@cache
def top_level_keys() -> frozenset[str]:
    return frozenset(key for name in overlay_names() for key in compose(name))


def override_pattern() -> re.Pattern[str]:
    keys = "|".join(sorted(map(re.escape, top_level_keys())))
    return re.compile(
        rf"(?<![\w./$-])((?:\+\+|\+)?(?:{keys})\.[A-Za-z0-9_.@-]+=[^\s`'\"]*|~(?:{keys})\.[A-Za-z0-9_.]+)"
    )


def contexts(text: str) -> list[str]:
    """Paragraphs and list items (blank-line separated), with every table row on its own."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        rows = block.splitlines()
        if rows and all(row.lstrip().startswith("|") for row in rows if row.strip()):
            out.extend(rows)
        else:
            out.append(block)
    return out


def config_for(context: str, position: int) -> str:
    """The config an example at ``position`` of ``context`` is shown for."""
    named = sorted((m.start(), name) for name in overlay_names() for m in re.finditer(re.escape(name), context))
    before = [name for start, name in named if start < position]
    after = [name for start, name in named if start >= position]
    return before[-1] if before else after[0] if after else DEFAULT_CONFIG


def examples() -> list[tuple[str, str, str]]:
    """(where, override, config) for every override shown in the docs."""
    pattern = override_pattern()
    found = []
    for doc in DOCS:
        for context in contexts(doc.read_text(encoding="utf-8")):
            for match in CODE_SPAN.finditer(context):
                code = match.group(1) or match.group(2) or ""
                for override in pattern.findall(code):
                    config = config_for(context, match.start())
                    found.append((f"{doc.relative_to(REPO)}", override.rstrip(".,;:)"), config))
    return found


EXAMPLES = examples()


def test_the_docs_show_overrides_and_the_scan_finds_them():
    shown = {override for _, override, _ in EXAMPLES}
    assert "trainer.total_training_steps=50" in shown  # the README's cluster step
    assert any(o.startswith("+actor_rollout_ref.actor.megatron.override_transformer_config.") for o in shown)
    assert len(EXAMPLES) >= 20


@pytest.mark.parametrize(("where", "override", "config"), EXAMPLES, ids=[f"{w}:{o}" for w, o, _ in EXAMPLES])
def test_each_override_composes_on_its_config(where, override, config):
    try:
        compose(config, [override])
    except OverlayError as exc:
        pytest.fail(f"{where}: `{override}` does not compose on {config}: {exc}")


def test_the_config_an_example_is_shown_for():
    text = "in grpo_qwen25_7b `a=1`; grpo_deepseekv3_smoke `b=2`"
    assert config_for(text, text.index("`a")) == "grpo_qwen25_7b"
    assert config_for(text, text.index("`b")) == "grpo_deepseekv3_smoke"
    row = "| `c=3` | true in grpo_deepseekv3_smoke and grpo_qwen25_7b |"
    assert config_for(row, row.index("`c")) == "grpo_deepseekv3_smoke"
    assert config_for("plain `d=4`", 6) == DEFAULT_CONFIG


def test_a_plus_on_a_key_the_config_sets_is_refused_by_the_composer():
    """The check has teeth: the example the docs once showed is refused."""
    with pytest.raises(OverlayError):
        compose(DEFAULT_CONFIG, ["+actor_rollout_ref.actor.megatron.override_transformer_config.swap_optimizer=True"])
    with pytest.raises(OverlayError):
        compose(DEFAULT_CONFIG, ["trainer.no_such_key=1"])
