"""The prompts a synthetic checkpoint's routers are balanced on and measured on: what the runs made from it read.

Two sets, tokenised as verl tokenises them (``apply_chat_template`` of the tiny tokenizer, generation prompt on):

- ``sample``: the shipped DeepScaleR sample in the R1 template, as ``r1-ascend prepare-data`` writes it (the smoke
  configuration's training data);
- ``toy``: the rehearsal's toy task, training and validation prompts (what its rollout and actor read).

The tiny tokenizer (:mod:`r1_ascend.launch.tiny_tokenizer`) is trained on the shipped sample with a fixed vocabulary,
so the ids are the same for every model that carries it.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

#: Sample prompts the quickstart balances on (the first in prepare-data's order). Most of a sample prompt is the R1
#: template every prompt shares, so 32 of them cover what all 320 add and keep the calibration to seconds.
CALIBRATION_SAMPLE_PROMPTS = 32


def _tokenizer(work: Path) -> Any:
    from transformers import AutoTokenizer

    from r1_ascend.launch.tiny_tokenizer import MAX_VOCAB, write_tiny_tokenizer

    (work / "config.json").write_text(json.dumps({"vocab_size": MAX_VOCAB, "bos_token_id": 0, "eos_token_id": 1}))
    write_tiny_tokenizer(work)
    return AutoTokenizer.from_pretrained(str(work))


def prompt_sets() -> dict[str, list[list[int]]]:
    """``{"sample": ..., "toy": ...}``: every prompt of each set as token ids."""
    import pyarrow.parquet as pq

    from r1_ascend.data.prepare import prepare
    from r1_ascend.launch.smoke_model import sample_path
    from r1_ascend.rehearse import toy_task

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tokenizer = _tokenizer(work)
        prepare([sample_path()], work / "data", overwrite=True)
        sample_rows = pq.read_table(work / "data" / "train.parquet").to_pylist()
    rows = {"sample": sample_rows, "toy": toy_task.rows("train") + toy_task.rows("val")}
    return {
        name: [
            list(tokenizer.apply_chat_template(list(row["prompt"]), add_generation_prompt=True, tokenize=True))
            for row in set_rows
        ]
        for name, set_rows in rows.items()
    }


def calibration_sets() -> list[list[list[int]]]:
    """The sets the quickstart's checkpoint is balanced on: the first sample prompts and every toy prompt."""
    sets = prompt_sets()
    return [sets["sample"][:CALIBRATION_SAMPLE_PROMPTS], sets["toy"]]
