"""``r1-ascend evaluate MODEL_DIR``: pass@1 and pass@k on AIME24 / AMC / MATH-500 with the recipe's reward.

The defaults are the DeepSeek-R1 report's evaluation setup (DeepSeek-AI, "DeepSeek-R1: Incentivizing Reasoning
Capability in LLMs via Reinforcement Learning", arXiv:2501.12948, "Evaluation Setup"; the release's model card
states the same values): at most 32,768 generated tokens, temperature 0.6, top-p 0.95 and 64 samples per question
(the paper says 4 to 64 depending on the test set's size; 64 is what it uses for AIME 2024's cons@64 and what the
model card states for pass@1); pass@1 is the mean over problems of correct / 64.

Exit codes: 0 done; 2 usage error, or a model directory, data file or output directory that cannot be used.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from r1_ascend.evaluate import generation as gen
from r1_ascend.evaluate.problems import EvalDataError
from r1_ascend.evaluate.prompts import PromptError
from r1_ascend.evaluate.run import EvalOptions, InputError, evaluate
from r1_ascend.evaluate.vllm_backend import EngineConfigError

EXIT_OK, EXIT_ERROR = 0, 2
#: DeepSeek-R1 report (arXiv:2501.12948, "Evaluation Setup").
R1_SAMPLES, R1_TEMPERATURE, R1_TOP_P, R1_MAX_NEW_TOKENS = 64, 0.6, 0.95, 32768
R1_CITATION = "DeepSeek-R1 report, arXiv:2501.12948, Evaluation Setup"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"expected a positive integer, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        msg = f"expected a number in (0, 1], got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0.0:
        msg = f"expected a temperature >= 0 (0 = greedy), got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        msg = f"expected a JSON object such as '{{\"enforce_eager\": true}}', got {text!r} ({exc})"
        raise argparse.ArgumentTypeError(msg) from None
    if not isinstance(value, dict):
        msg = f"expected a JSON object of vllm.LLM keyword arguments, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="r1-ascend evaluate",
        description=(
            "Sample an HF checkpoint (a `convert-weights to-hf` export or any HF directory: config.json, safetensors, "
            "tokenizer) on the validation sets with the R1 prompt the training rollout used, score every sample with "
            "the recipe's reward (r1_ascend.recipe.deepscaler_reward.compute_score, called as verl's reward manager "
            "calls it) and report per set pass@1 (mean over problems of correct / n) and pass@k (unbiased estimator "
            f"of Chen et al. 2021; k = n: any sample correct). Defaults follow the {R1_CITATION}: "
            f"{R1_SAMPLES} samples, temperature {R1_TEMPERATURE}, top-p {R1_TOP_P}, {R1_MAX_NEW_TOKENS} new tokens."
        ),
        epilog="Outputs in --output-dir: evaluation.json, evaluation.md, samples.jsonl. Exit codes: 0 ok, 2 error.",
    )
    parser.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="HF checkpoint directory")
    parser.add_argument(
        "--data",
        nargs="+",
        type=Path,
        metavar="PARQUET",
        help="prepared validation parquet file(s) (r1-ascend prepare-data --val), rows grouped into sets by "
        "data_source; default: the shipped aime24, amc and math500 sets, prepared into OUTPUT_DIR/data",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        metavar="DIR",
        help="where the outputs go (default: outputs/evaluate/<model directory name>); put it in the run directory "
        "for r1-ascend report to show it",
    )
    sampling = parser.add_argument_group(f"sampling (defaults: {R1_CITATION})")
    sampling.add_argument(
        "--samples",
        type=_positive_int,
        default=R1_SAMPLES,
        metavar="N",
        help="samples per problem (default %(default)s)",
    )
    sampling.add_argument("--temperature", type=_temperature, default=R1_TEMPERATURE, help="(default %(default)s)")
    sampling.add_argument("--top-p", type=_probability, default=R1_TOP_P, help="(default %(default)s)")
    sampling.add_argument(
        "--max-new-tokens",
        type=_positive_int,
        default=R1_MAX_NEW_TOKENS,
        metavar="N",
        help="generation limit per sample; a sample that reaches it counts as wrong (default %(default)s)",
    )
    sampling.add_argument(
        "--seed",
        type=int,
        default=0,
        help="problem i is sampled from seed + i * N (vLLM: its sample j from seed + i * N + j); default 0",
    )
    parser.add_argument(
        "--pass-k",
        type=_positive_int,
        action="append",
        metavar="K",
        help="report pass@K (repeatable; K <= --samples); default: K = --samples",
    )
    parser.add_argument("--limit", type=_positive_int, metavar="ROWS", help="evaluate only each set's first ROWS rows")
    parser.add_argument(
        "--backend",
        choices=[gen.AUTO, gen.VLLM, gen.TRANSFORMERS],
        default=gen.AUTO,
        help="vllm (NPU, vLLM 0.9.1 + vllm-ascend) or transformers (CPU); auto: vllm where /dev/davinci* exists",
    )
    engine = parser.add_argument_group("vLLM engine")
    engine.add_argument(
        "--tensor-parallel-size",
        type=_positive_int,
        metavar="TP",
        help="NPU dies the model is split over (default: every NPU of this node); more than one node's NPUs run "
        "over Ray; DeepSeek-V3 671B in BF16 needs 32 (2 A3 nodes)",
    )
    engine.add_argument(
        "--vllm-kwargs",
        type=_json_object,
        default={},
        metavar="JSON",
        help="vllm.LLM keyword arguments replacing the defaults, e.g. '{\"enforce_eager\": true}'",
    )
    parser.add_argument("--trust-remote-code", action="store_true", help="let transformers / vLLM run the model's code")
    parser.add_argument("--overwrite", action="store_true", help="replace the outputs of an earlier evaluation")
    return parser


def options_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> EvalOptions:
    ks = tuple(dict.fromkeys(args.pass_k or ()))
    too_large = [k for k in ks if k > args.samples]
    if too_large:
        parser.error(f"--pass-k {too_large[0]} is more than the {args.samples} samples per problem (--samples)")
    output_dir = args.output_dir or Path("outputs") / "evaluate" / (args.model_dir.resolve().name or "model")
    return EvalOptions(
        model_dir=args.model_dir,
        output_dir=output_dir,
        data=tuple(args.data or ()),
        samples=args.samples,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        limit=args.limit,
        pass_k=ks,
        backend=args.backend,
        tensor_parallel_size=args.tensor_parallel_size,
        engine_kwargs=args.vllm_kwargs,
        trust_remote_code=args.trust_remote_code,
        overwrite=args.overwrite,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
        options = options_from(args, parser)
    except SystemExit as exc:  # argparse exits 2 on usage errors and 0 on --help
        return int(exc.code or 0)
    try:
        evaluate(options)
    except (InputError, EvalDataError, PromptError, EngineConfigError, OSError) as exc:
        print(f"r1-ascend evaluate: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
