"""``r1-ascend convert-weights <step>``: the weight-preparation steps, each also callable from Python."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from r1_ascend.parallel import Layout
from r1_ascend.weights.errors import WeightsError


def _layout_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Megatron layout (chunking only: the checkpoint loads at any TP/PP/EP)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    g.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (default 1)")
    g.add_argument("--ep", type=int, default=1, help="expert-parallel size (default 1)")
    g.add_argument(
        "--pp-layers", default="", help="layers per stage, e.g. 6,8,8,8,8,8,8,7 (default: Megatron's even split)"
    )


def _layout(args: argparse.Namespace) -> Layout:
    layers = tuple(int(x) for x in args.pp_layers.split(",") if x.strip())
    return Layout(tp=args.tp, pp=args.pp, ep=args.ep, pp_layers=layers)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true", help="delete a non-empty output directory and start over")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


#: The conversion steps: help, source help, output (name, help), --workers help.
_CONVERSIONS: dict[str, tuple[str, str, tuple[str, str], str]] = {
    "fp8-to-bf16": (
        "dequantise a block-FP8 HF checkpoint to BF16 (streaming, resumable)",
        "HF FP8 checkpoint directory (read only)",
        ("dst", "output directory (new, empty, or an interrupted run to resume)"),
        "shards converted in parallel (processes)",
    ),
    "to-megatron": (
        "HF (BF16 or FP8) -> Megatron-core torch_dist checkpoint",
        "HF checkpoint directory (BF16, or FP8: dequantised on the fly)",
        ("dst", "output dist-checkpoint directory"),
        "processes writing rank files in parallel",
    ),
    "all": (
        "fp8-to-bf16 (MTP dropped) + fix-config + to-megatron into OUT/{hf-bf16,mcore}",
        "HF FP8 checkpoint directory",
        ("out", "output directory"),
        "parallel processes for each step",
    ),
    "to-hf": (
        "verl Megatron training checkpoint -> HF BF16 safetensors (streaming, resumable)",
        "verl checkpoint: global_step_N, global_step_N/actor, or its dist_ckpt",
        ("dst", "output HF directory (new, empty, or an interrupted run to resume)"),
        "output shards written in parallel (processes)",
    ),
}


def _step(sub: Any, name: str, help_text: str, src: str, dst: tuple[str, str], workers: str) -> argparse.ArgumentParser:
    """A conversion step: a source, an output (its name and help) and a number of worker processes."""
    p = sub.add_parser(name, help=help_text)
    p.add_argument("src", type=Path, help=src)
    p.add_argument(dst[0], type=Path, help=dst[1])
    p.add_argument("--workers", type=int, default=1, help=workers)
    return p


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="r1-ascend convert-weights",
        description="Prepare DeepSeek-V3 weights for verl's Megatron backend on Ascend. Reruns resume.",
    )
    sub = parser.add_subparsers(dest="step", required=True, metavar="STEP")

    steps = {name: _step(sub, name, *spec) for name, spec in _CONVERSIONS.items()}
    p = steps["fp8-to-bf16"]
    p.add_argument("--drop-mtp", action="store_true", help="also drop the MTP layer (as fix-config does)")
    p.add_argument("--verify", action="store_true", help="re-read every output tensor and compare with the source")
    p = steps["to-megatron"]
    p.add_argument("--no-extra-state", action="store_true", help="omit the empty TE _extra_state objects")
    _layout_args(p)
    p = steps["all"]
    p.add_argument("--verify", action="store_true", help="check both outputs against the source afterwards")
    _layout_args(p)
    p = steps["to-hf"]
    p.add_argument("--hf-dir", type=Path, help="config + tokenizer directory (default: the checkpoint's huggingface/)")
    p.add_argument("--shard-size-gb", type=float, default=2.0, help="output shard size (default 2 GB)")
    for p in steps.values():
        _common(p)

    p = sub.add_parser("fix-config", help="config edits + drop MTP tensors, in place, on a BF16 checkpoint")
    p.add_argument("path", type=Path, help="BF16 HF checkpoint directory")
    p.add_argument("--copy-side-files-from", type=Path, help="copy tokenizer/code files (never index or config)")

    p = sub.add_parser(
        "make-tiny",
        help="write a tiny synthetic DeepSeek-V3-shaped FP8 checkpoint (routers balanced on the shipped prompts)",
    )
    p.add_argument("out", type=Path, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size-bytes", type=int, default=0, help="instead of the tiny config, aim for this many bytes")
    p.add_argument("--shard-bytes", type=int, default=0, help="max bytes per shard (default: 400 kB tiny, 256 MB)")

    p = sub.add_parser("verify", help="check an output against its source")
    p.add_argument("kind", choices=["bf16", "megatron"], help="which output to check")
    p.add_argument("output", type=Path, help="the BF16 directory, or the Megatron checkpoint directory")
    p.add_argument("source", type=Path, help="the FP8 source (bf16) or the HF checkpoint it came from (megatron)")
    p.add_argument("--drop-mtp", action="store_true", help="bf16: the output had the MTP layer dropped")
    p.add_argument("--tp", type=int, default=1, help="megatron: load with this TP (spawns tp*ep gloo processes)")
    p.add_argument("--ep", type=int, default=1, help="megatron: load with this EP")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return _run(args)
    except WeightsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a write failing mid-run (disk full, storage gone read-only): no traceback
        where = f" ({exc.filename})" if exc.filename else ""
        print(
            f"error: {exc.strerror or exc}{where}. Fix the storage problem and rerun the same command; "
            "finished files are kept and the run resumes.",
            file=sys.stderr,
        )
        return 1


def _run(args: argparse.Namespace) -> int:
    quiet = getattr(args, "quiet", False)
    # the options every conversion step takes (see pipeline.StepOptions)
    options = {"workers": getattr(args, "workers", 1), "overwrite": getattr(args, "overwrite", False)}
    options["progress"] = not quiet
    if args.step == "fp8-to-bf16":
        from r1_ascend.weights.dequant import convert_fp8_to_bf16

        r = convert_fp8_to_bf16(args.src, args.dst, drop_mtp=args.drop_mtp, verify=args.verify, **options)
        print(f"{r.out_dir}: {r.shards_written} shards written, {r.shards_skipped} already complete")
    elif args.step == "fix-config":
        from r1_ascend.weights.config_fix import fix_checkpoint

        f = fix_checkpoint(args.path, copy_side_files_from=args.copy_side_files_from)
        print(f"{args.path}: config fixed, {f.mtp_tensors_dropped} MTP tensors dropped")
    elif args.step == "to-megatron":
        from r1_ascend.weights.mcore_writer import convert_hf_to_megatron

        m = convert_hf_to_megatron(args.src, args.dst, _layout(args), extra_state=not args.no_extra_state, **options)
        print(f"{m.out_dir}: {m.tensors} tensors, {m.extra_states} extra states" + (" (already done)" * m.skipped))
    elif args.step == "all":
        from r1_ascend.weights.pipeline import convert_all

        p = convert_all(args.src, args.out, _layout(args), verify=args.verify, **options)
        print(f"actor_rollout_ref.model.path={p.hf_bf16}")
        print(f"actor_rollout_ref.actor.megatron.dist_checkpointing_path={p.mcore}")
    elif args.step == "to-hf":
        from r1_ascend.weights.to_hf import convert_megatron_to_hf

        shard_bytes = int(args.shard_size_gb * 1e9)
        h = convert_megatron_to_hf(args.src, args.dst, hf_dir=args.hf_dir, max_shard_bytes=shard_bytes, **options)
        print(f"{h.out_dir}: {h.shards_written} shards written, {h.shards_skipped} already complete")
    elif args.step == "make-tiny":
        from r1_ascend.weights.tiny import config_for_size, make_tiny

        if args.size_bytes:
            t = make_tiny(
                args.out,
                seed=args.seed,
                max_shard_bytes=args.shard_bytes or 256_000_000,
                config_overrides=config_for_size(args.size_bytes),
                fast=True,
            )
        else:
            from r1_ascend.launch.routing_prompts import calibration_sets

            shard = args.shard_bytes or 400_000
            t = make_tiny(args.out, seed=args.seed, max_shard_bytes=shard, routing_prompts=calibration_sets())
        print(f"{t.path}: {len(set(t.weight_map.values()))} shards, {t.total_size} bytes")
    elif args.step == "verify":
        if args.kind == "bf16":
            from r1_ascend.weights.dequant import verify_bf16

            n = verify_bf16(args.source, args.output, drop_mtp=args.drop_mtp)
        else:
            from r1_ascend.weights.mcore_verify import verify_megatron

            n = verify_megatron(args.output, args.source, [Layout(tp=args.tp, ep=args.ep)])
        print(f"{args.output}: {n} entries match {args.source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
