"""Export what the rehearsal trained: ``convert-weights to-hf`` on the final checkpoint, then transformers loads the
result strictly and generates from it.

This is the path a user takes to evaluate a trained checkpoint, run on the rehearsal's own dist checkpoint (written
by verl's ``MegatronCheckpointManager`` with optimizer state, not by the converter), so a layout the converter does
not read back fails here rather than after a multi-day run.

``python -m r1_ascend.rehearse.export HF_DIR`` (the check alone) prints a JSON line: the parameters loaded, the
keys missing or unexpected (both must be empty), and the greedy answer to one toy-task prompt.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


class ExportError(RuntimeError):
    """The trained checkpoint did not convert, load or generate; the message says which and where the log is."""


def check_hf(hf_dir: Path, prompt: str = "What is 2 + 3?", max_new_tokens: int = 8) -> dict[str, object]:
    """Load ``hf_dir`` with transformers (strict: no missing or unexpected key) and answer ``prompt`` greedily."""
    import torch
    from transformers import AutoTokenizer, DeepseekV3ForCausalLM

    model, info = DeepseekV3ForCausalLM.from_pretrained(
        str(hf_dir), torch_dtype=torch.float32, output_loading_info=True
    )
    problems = {key: value for key, value in info.items() if value}
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt"
    )
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.eos_token_id,
        )
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "loading_problems": {key: sorted(map(str, value)) for key, value in problems.items()},
        "prompt": prompt,
        "answer": tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True),
    }


def export(checkpoint: Path, out: Path, log: Path) -> dict[str, object]:
    """``r1-ascend convert-weights to-hf CHECKPOINT OUT``, then :func:`check_hf` in a process of its own."""
    convert = [sys.executable, "-m", "r1_ascend.cli", "convert-weights", "to-hf", str(checkpoint), str(out), "--quiet"]
    check = [sys.executable, "-m", "r1_ascend.rehearse.export", str(out)]
    with log.open("w") as sink:
        for cmd in (convert, check):
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=sink, text=True, check=False)
            sink.write(done.stdout)
            if done.returncode != 0:
                raise ExportError(f"{' '.join(cmd[2:5])} failed ({done.returncode}); log: {log}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["loading_problems"]:
        raise ExportError(f"transformers did not load {out} strictly: {result['loading_problems']}; log: {log}")
    return {"hf_dir": str(out), **result}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m r1_ascend.rehearse.export HF_DIR", file=sys.stderr)
        return 2
    print(json.dumps(check_hf(Path(args[0]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
