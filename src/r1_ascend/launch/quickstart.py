"""``r1-ascend quickstart``: the whole preparation chain on the shipped sample and a tiny model, ending in preflight.

Stages: prepare the sample data (train + AIME24/AMC/MATH-500 validation parquet), generate a synthetic DeepSeek-V3
shaped FP8 checkpoint with the smoke model's structure, convert it (FP8 -> BF16 + config fix -> Megatron dist
checkpoint), give it a tokenizer built offline, preflight the smoke configuration against the outputs and print
the exact launch command, or what is still missing before it can run. Every stage is idempotent: a rerun reuses
finished outputs. ``scripts/quickstart.sh`` is the entry point that also sets up the
CPU environment, or starts the cluster run on an Ascend node.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from r1_ascend.launch.overlays import SMOKE_OVERLAY
from r1_ascend.launch.routing_prompts import calibration_sets
from r1_ascend.launch.smoke_model import SMOKE_CONVERT_LAYOUT, sample_path, smoke_overrides

DEFAULT_OUTPUT = Path("outputs/quickstart")
SMOKE_ENV = {"NNODES": "1", "NPUS_PER_NODE": "16"}


def _stage(index: int, total: int, title: str, action: Callable[[], str]) -> None:
    start = time.monotonic()
    print(f"[{index}/{total}] {title} ...", flush=True)
    detail = action()
    print(f"[{index}/{total}] {title}: done in {time.monotonic() - start:.1f} s{f' ({detail})' if detail else ''}")


def prepare_data(out: Path) -> str:
    from r1_ascend.data.prepare import prepare, prepare_val

    train = prepare([sample_path()], out, overwrite=True)
    val = prepare_val(out, overwrite=True)
    return f"{train.rows_written} train rows, {val.rows_written} validation rows in {out}"


def make_checkpoint(out: Path, dims: str) -> str:
    """The synthetic FP8 checkpoint. With the tiny dimensions its routers are balanced on the prompts its runs read
    (r1_ascend.launch.routing_prompts), so every expert and every expert-parallel rank gets tokens; DeepSeek-V3's
    dimensions (5.7 B parameters) are too large to calibrate on a host, and start with a zero expert bias that the
    run's own bias update moves."""
    from r1_ascend.weights.tiny import make_tiny

    if (out / "config.json").is_file() and (out / "model.safetensors.index.json").is_file():
        return f"reused {out}"
    shard = 400_000 if dims == "tiny" else 4 * 1024**3
    prompts = calibration_sets() if dims == "tiny" else ()
    made = make_tiny(out, config_overrides=smoke_overrides(dims), max_shard_bytes=shard, routing_prompts=prompts)
    balanced = f", routers balanced on {sum(map(len, prompts))} prompts" if prompts else ""
    return f"{made.total_size / 1e6:.1f} MB FP8 checkpoint in {out}{balanced}"


def convert(src: Path, out: Path) -> str:
    from r1_ascend.weights.cli import main as weights_main

    layers = ",".join(str(n) for n in SMOKE_CONVERT_LAYOUT["pp_layers"])
    argv = ["all", str(src), str(out), "--pp", str(SMOKE_CONVERT_LAYOUT["pp"]), "--ep", str(SMOKE_CONVERT_LAYOUT["ep"])]
    code = weights_main([*argv, "--pp-layers", layers, "--quiet"])
    if code != 0:
        msg = f"r1-ascend convert-weights {' '.join(argv)} failed with exit code {code}"
        raise RuntimeError(msg)
    return f"HF BF16 in {out / 'hf-bf16'}, Megatron dist checkpoint in {out / 'mcore'}"


def add_tokenizer(model_dir: Path) -> str:
    """The synthetic checkpoint's tokenizer (verl loads it first), checked by encoding a real prompt."""
    from tokenizers import Tokenizer

    from r1_ascend.data.template import render_deepseek_v3
    from r1_ascend.launch.tiny_tokenizer import TOKENIZER_FILES, write_tiny_tokenizer

    config_file = model_dir / "tokenizer_config.json"
    # the converter copies the synthetic checkpoint's tokenizer_config.json stub (no chat template): not a tokenizer
    reused = all((model_dir / name).is_file() for name in TOKENIZER_FILES) and "chat_template" in json.loads(
        config_file.read_text(encoding="utf-8")
    )
    if not reused:
        write_tiny_tokenizer(model_dir)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    vocab_limit = int(json.loads((model_dir / "config.json").read_text(encoding="utf-8"))["vocab_size"])
    ids = tokenizer.encode(render_deepseek_v3([{"role": "user", "content": "What is 1 + 1?"}])).ids
    if not ids or max(ids) >= vocab_limit:
        msg = f"the tokenizer in {model_dir} produces ids outside the model's vocabulary ({vocab_limit})"
        raise RuntimeError(msg)
    state = "reused" if reused else "wrote"
    return f"{state} a {tokenizer.get_vocab_size()}-token byte-level tokenizer in {model_dir}"


def smoke_paths(out: Path) -> dict[str, str]:
    return {
        "MODEL_PATH": str((out / "weights" / "hf-bf16").resolve()),
        "DIST_CKPT_DIR": str((out / "weights" / "mcore").resolve()),
        "DATA_DIR": str((out / "data").resolve()),
        "OUTPUT_DIR": str((out / "run").resolve()),
    }


def path_overrides(paths: dict[str, str]) -> list[str]:
    """The Hydra overrides the run scripts derive from MODEL_PATH / DIST_CKPT_DIR / DATA_DIR / OUTPUT_DIR."""
    return [
        f"trainer.default_local_dir={paths['OUTPUT_DIR']}/checkpoints/{SMOKE_OVERLAY}",
        f"actor_rollout_ref.model.path={paths['MODEL_PATH']}",
        f"actor_rollout_ref.actor.megatron.dist_checkpointing_path={paths['DIST_CKPT_DIR']}",
        f"data.train_files={paths['DATA_DIR']}/train.parquet",
        f"data.val_files={paths['DATA_DIR']}/val.parquet",
    ]


def preflight(paths: dict[str, str]) -> tuple[list[str], str]:
    """Run the preflight; returns what still blocks a launch (errors, warnings, skipped checks) and a summary."""
    from r1_ascend.launch.checks import ERROR, SKIPPED, WARNING
    from r1_ascend.launch.preflight import format_findings, format_memory, format_plan, run_checks

    run, findings = run_checks(SMOKE_OVERLAY, path_overrides(paths), env=SMOKE_ENV)
    for line in (*format_plan(run), *format_memory(run), *format_findings(findings)):
        print(f"    {line}")
    counts = {level: sum(f.level == level for f in findings) for level in (ERROR, WARNING, SKIPPED)}
    blocking = [f"{f.check}: {f.message}" for f in findings if f.level in (ERROR, WARNING, SKIPPED)]
    summary = f"{counts[ERROR]} error(s), {counts[WARNING]} warning(s), {counts[SKIPPED]} skipped"
    return blocking, summary


def launch_command(paths: dict[str, str]) -> str:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in paths.items())
    return f"{env} bash scripts/run_grpo_smoke_npu.sh"


def main(argv: list[str] | None = None) -> int:
    from r1_ascend.cli import plain_help

    parser = argparse.ArgumentParser(prog="r1-ascend quickstart", description=plain_help(__doc__))
    parser.add_argument(
        "--output-dir", type=Path, default=DEFAULT_OUTPUT, help=f"where everything goes (default {DEFAULT_OUTPUT})"
    )
    parser.add_argument(
        "--model-dims",
        choices=("tiny", "deepseek-v3"),
        default="tiny",
        help="tiny (CPU, seconds) or DeepSeek-V3's real dimensions (~5.7 B params, for the NPU smoke run)",
    )
    args = parser.parse_args(argv)
    out: Path = args.output_dir
    start = time.monotonic()
    paths = smoke_paths(out)
    try:
        _stage(1, 5, "prepare the sample data", lambda: prepare_data(out / "data"))
        _stage(2, 5, "generate the synthetic FP8 checkpoint", lambda: make_checkpoint(out / "fp8", args.model_dims))
        _stage(3, 5, "convert weights (FP8 -> BF16 -> Megatron)", lambda: convert(out / "fp8", out / "weights"))
        model_dir = out / "weights" / "hf-bf16"
        _stage(4, 5, "add a tokenizer (byte-level BPE, built offline)", lambda: add_tokenizer(model_dir))
        result: dict[str, list[str]] = {}

        def _preflight() -> str:
            result["blocking"], text = preflight(paths)
            return text

        _stage(5, 5, f"preflight {SMOKE_OVERLAY}", _preflight)
    except Exception as exc:
        print(f"quickstart: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    total = time.monotonic() - start
    if result["blocking"]:
        print(f"quickstart: the outputs are not ready to launch ({total:.1f} s); still to fix:", file=sys.stderr)
        for item in result["blocking"]:
            print(f"  - {item}", file=sys.stderr)
        print(f"Once fixed, the launch command is: {launch_command(paths)}", file=sys.stderr)
        return 1
    print(f"quickstart: all stages passed in {total:.1f} s. Launch the smoke run on one A3 node (16 dies) with:")
    print(f"  {launch_command(paths)}")
    print("and the full DeepSeek-V3 671B run on 16 A3 nodes with scripts/ray_start_npu.sh (docs/launch.md).")
    return 0
