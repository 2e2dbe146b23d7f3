"""One evaluation: check the inputs, render the prompts, generate, score, write the outputs.

The checks of the model directory, the data and the output directory come first and import nothing heavy, so a
wrong path fails in a fraction of a second with the fix in the message. Each set is generated in one backend call
(vLLM schedules all its samples together), scored, and its samples appended to ``samples.jsonl`` before the next
set starts; ``evaluation.json`` and ``evaluation.md`` are written at the end.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from r1_ascend.atomic import atomic_write_json, atomic_write_text
from r1_ascend.evaluate import backends, tables
from r1_ascend.evaluate import generation as gen
from r1_ascend.evaluate.problems import Problem, read_problems
from r1_ascend.evaluate.prompts import load_tokenizer, prompt_ids
from r1_ascend.evaluate.scoring import malformed_samples, reward_fn, score_sample

REWARD_NAME = "r1_ascend.recipe.deepscaler_reward.compute_score"
COUNTING = (
    "a sample is correct when the reward's acc is 1 and the response ended before max_new_tokens; the samples of a "
    "malformed row, empty responses and truncated responses count as wrong"
)
INDEX_NAME = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
_SHARD = re.compile(r".*-\d+-of-\d+\.safetensors$")


class InputError(ValueError):
    """The model directory, the data or the output directory cannot be used (the message says how to fix it)."""


@dataclass(frozen=True)
class EvalOptions:
    model_dir: Path
    output_dir: Path
    data: tuple[Path, ...] = ()  # empty: prepare the shipped validation sets into output_dir/data
    samples: int = 64
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 32768
    seed: int = 0
    limit: int | None = None
    pass_k: tuple[int, ...] = ()  # empty: (samples,)
    backend: str = gen.AUTO
    tensor_parallel_size: int | None = None
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    trust_remote_code: bool = False
    overwrite: bool = False

    @property
    def ks(self) -> tuple[int, ...]:
        return self.pass_k or (self.samples,)


def check_model_dir(path: Path) -> None:
    """An HF checkpoint directory: config.json, complete safetensors weights and tokenizer files."""
    export = f"export it first: r1-ascend convert-weights to-hf {path} OUT_DIR, then evaluate OUT_DIR"
    if not path.exists():
        msg = (
            f"model directory {path} does not exist; give the directory `r1-ascend convert-weights to-hf "
            "CKPT/global_step_N OUT_DIR` wrote, or any HF checkpoint directory (config.json, *.safetensors, tokenizer)"
        )
        raise InputError(msg)
    if not path.is_dir():
        msg = f"model directory {path} is a file; give the HF checkpoint directory that holds config.json"
        raise InputError(msg)
    if (path / "dist_ckpt").is_dir() or (path / "actor").is_dir() or _is_dist_checkpoint(path):
        msg = f"{path} is a Megatron checkpoint, not an HF one; {export}"
        raise InputError(msg)
    if not (path / "config.json").is_file():
        msg = f"{path} has no config.json; give an HF checkpoint directory (r1-ascend convert-weights to-hf writes one)"
        raise InputError(msg)
    weights = sorted(p.name for p in path.glob("*.safetensors"))
    if not weights:
        msg = f"{path} holds no *.safetensors weights; give an HF checkpoint directory (to-hf writes safetensors)"
        raise InputError(msg)
    index = path / INDEX_NAME
    if index.is_file():
        try:
            named = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            msg = f"{index} is not a safetensors index ({exc}); copy or export the checkpoint again"
            raise InputError(msg) from None
        missing = sorted(named - set(weights))
        if missing:
            msg = f"{index} names {len(missing)} missing weight file(s) ({', '.join(missing[:3])}); copy them"
            raise InputError(msg)
    elif any(_SHARD.match(name) for name in weights):
        msg = (
            f"{path} has sharded weights but no {INDEX_NAME}: an interrupted `r1-ascend convert-weights to-hf` "
            "(rerun the same command; it resumes and writes the index last) or an incomplete copy"
        )
        raise InputError(msg)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        msg = (
            f"{path} has no tokenizer ({' / '.join(TOKENIZER_FILES)}); copy the base model's tokenizer files into it "
            "(to-hf copies them from the checkpoint's huggingface/ folder or from --hf-dir)"
        )
        raise InputError(msg)


def _is_dist_checkpoint(path: Path) -> bool:
    metadata = path / "metadata.json"
    if not metadata.is_file():
        return False
    try:
        return "sharded_backend" in json.loads(metadata.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def check_output_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        msg = f"--output-dir {out} exists and is not a directory"
        raise InputError(msg)
    names = (tables.JSON_NAME, tables.MARKDOWN_NAME, tables.SAMPLES_NAME)
    existing = [name for name in names if (out / name).exists()]
    if existing and not overwrite:
        msg = f"{out} already holds {', '.join(existing)}; pass --overwrite to replace them, or another --output-dir"
        raise InputError(msg)


def data_files(options: EvalOptions) -> list[Path]:
    """The parquet files to read: the given ones, or the shipped sets prepared into ``output_dir/data``."""
    if options.data:
        return list(options.data)
    from r1_ascend.data.prepare import DataError, prepare_val

    out = options.output_dir / "data"
    try:
        prepare_val(out, overwrite=True)
    except DataError as exc:
        msg = f"cannot prepare the shipped validation sets in {out}: {exc}"
        raise InputError(msg) from None
    return [out / "val.parquet"]


def render(tokenizer: Any, problems: list[Problem]) -> tuple[list[Problem], dict[int, list[int]]]:
    """Token ids per usable problem; a row the chat template cannot render becomes malformed (listed, not lost)."""
    from jinja2 import TemplateError

    ids: dict[int, list[int]] = {}
    kept = []
    for problem in problems:
        if problem.malformed is None:
            try:
                ids[problem.index] = prompt_ids(tokenizer, problem)
            except (TemplateError, ValueError, TypeError, KeyError) as exc:
                problem = replace(problem, malformed=f"the chat template cannot render the prompt ({exc})")
        kept.append(problem)
    return kept, ids


def evaluate(options: EvalOptions, *, out: TextIO | None = None, err: TextIO | None = None) -> dict[str, Any]:
    """Run one evaluation and write its outputs; returns the ``evaluation.json`` document."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    start = time.monotonic()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    check_model_dir(options.model_dir)
    check_output_dir(options.output_dir, options.overwrite)
    paths = data_files(options)
    sets = read_problems(paths, options.limit)
    options.output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(options.model_dir, trust_remote_code=options.trust_remote_code)
    rendered = {name: render(tokenizer, problems) for name, problems in sets.items()}
    lengths = [len(ids) for _, by_index in rendered.values() for ids in by_index.values()]
    from r1_ascend.doctor import npu_devices

    backend_name = backends.choose_backend(options.backend, bool(npu_devices()))
    spec = gen.BackendSpec(
        options.model_dir,
        tokenizer,
        options.seed,
        max(lengths, default=1) + options.max_new_tokens,
        trust_remote_code=options.trust_remote_code,
        tensor_parallel_size=options.tensor_parallel_size,
        engine_kwargs=options.engine_kwargs,
    )
    total_problems = sum(len(p) for p in sets.values())
    print(
        f"r1-ascend evaluate: {total_problems} problems in {len(sets)} set(s) from {', '.join(map(str, paths))}; "
        f"{options.samples} samples each on the {backend_name} backend",
        file=err,
        flush=True,
    )
    backend = backends.BACKENDS[backend_name](spec) if lengths else None
    engine = _engine(backend)
    if engine is not None and engine["memory"]:
        print(f"r1-ascend evaluate: vLLM memory plan: {engine['memory']}", file=err, flush=True)
    sampling = gen.SamplingOptions(options.samples, options.temperature, options.top_p, options.max_new_tokens)
    compute_score = reward_fn()
    runs = []
    with (options.output_dir / tables.SAMPLES_NAME).open("w", encoding="utf-8") as samples_file:
        for name, (problems, by_index) in rendered.items():
            run = _run_set(name, problems, by_index, backend, sampling, options.seed, compute_score, err)
            for problem_run in run.problems:
                for result in problem_run.samples:
                    record = tables.sample_record(name, problem_run.problem, result)
                    samples_file.write(json.dumps(record, ensure_ascii=False) + "\n")
            samples_file.flush()
            runs.append(run)
    meta = {
        "model": str(options.model_dir.resolve()),
        "backend": backend_name,
        "data": [str(p.resolve()) for p in paths],
        "settings": {
            "samples": options.samples,
            "temperature": options.temperature,
            "top_p": options.top_p,
            "max_new_tokens": options.max_new_tokens,
            "seed": options.seed,
            "limit": options.limit,
            "pass_k": list(options.ks),
        },
        "reward": REWARD_NAME,
        "counting": COUNTING,
        "engine": engine,
        "started": started,
        "elapsed_s": round(time.monotonic() - start, 3),
    }
    doc = tables.document(runs, n=options.samples, ks=options.ks, meta=meta)
    atomic_write_json(options.output_dir / tables.JSON_NAME, doc)
    atomic_write_text(options.output_dir / tables.MARKDOWN_NAME, tables.markdown(doc))
    print(tables.summary_table(doc), file=out)
    listed = tables.counted_wrong_lines(doc)
    if listed:
        print(
            f"counted wrong whatever the reward said (malformed row, empty or truncated response): {len(listed)} "
            f"problem(s), listed in {tables.MARKDOWN_NAME}",
            file=out,
        )
    for name in (tables.JSON_NAME, tables.MARKDOWN_NAME, tables.SAMPLES_NAME):
        print(f"wrote {options.output_dir / name}", file=out)
    return doc


def _run_set(
    name: str,
    problems: Sequence[Problem],
    by_index: dict[int, list[int]],
    backend: gen.Backend | None,
    sampling: gen.SamplingOptions,
    seed: int,
    compute_score: Any,
    err: TextIO,
) -> tables.SetRun:
    usable = [p for p in problems if p.malformed is None]
    requests = [gen.Request(tuple(by_index[p.index]), seed + p.index * sampling.n) for p in usable]
    progress = gen.SampleProgress(name, len(requests) * sampling.n, stream=err)
    completions = backend.generate(requests, sampling, progress) if requests and backend is not None else []
    progress.close()
    if len(completions) != len(requests) or any(len(c) != sampling.n for c in completions):
        msg = f"set {name}: the backend returned {[len(c) for c in completions]} samples for {len(requests)} prompts"
        raise RuntimeError(msg)
    generated = {p.index: c for p, c in zip(usable, completions, strict=True)}
    run = tables.SetRun(name)
    for problem in problems:
        if problem.malformed is not None:
            results = malformed_samples(problem, sampling.n)
        else:
            results = [score_sample(problem, j, c, compute_score) for j, c in enumerate(generated[problem.index])]
        run.problems.append(tables.ProblemRun(problem, results))
    return run


def _engine(backend: gen.Backend | None) -> dict[str, Any] | None:
    kwargs = getattr(backend, "kwargs", None)
    plan = getattr(backend, "plan", None)
    if kwargs is None:
        return None
    return {"kwargs": kwargs, "memory": None if plan is None else plan.describe(int(kwargs["max_model_len"]))}
