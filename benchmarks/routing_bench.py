"""How a DeepSeek-V3 checkpoint routes the prompts its runs read: experts used and expert-parallel shares per layer.

Measured with transformers' ``DeepseekV3ForCausalLM`` alone (no megatron-core, no project model code) on the two
prompt sets of ``r1_ascend.launch.routing_prompts`` (the shipped DeepScaleR sample in the R1 template, and the
rehearsal's toy task), every token of every prompt. Prints, per set and MoE layer: the experts that received any
token, the busiest expert over the mean, and each expert-parallel rank's share of the routed tokens.

    python benchmarks/routing_bench.py outputs/quickstart/weights/hf-bf16 [--ep 2] [--dtype float32]

Without a directory it makes the quickstart's checkpoint in a temporary directory first.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from r1_ascend.launch.routing_prompts import prompt_sets
from r1_ascend.weights.router_balance import routed_tokens


def measure(hf_dir: Path, ep: int, dtype: torch.dtype) -> None:
    from transformers import DeepseekV3ForCausalLM

    model = DeepseekV3ForCausalLM.from_pretrained(str(hf_dir), torch_dtype=dtype).eval()
    print(f"{hf_dir} ({dtype}), {ep} expert-parallel ranks")
    print(f"  {'prompts':<8} {'layer':>5} {'experts used':>13} {'busiest/mean':>13}  EP shares")
    for name, prompts in prompt_sets().items():
        started = time.perf_counter()
        loads = routed_tokens(model, prompts)
        tokens = sum(map(len, prompts))
        for layer, load in loads.items():
            shares = " ".join(f"{share:.2f}" for share in load.rank_shares(ep))
            used = f"{load.experts_used} / {load.experts}"
            print(f"  {name:<8} {layer:>5} {used:>13} {load.max_over_mean:>13.2f}  {shares}")
        print(f"  ({len(prompts)} {name} prompts, {tokens} tokens, {time.perf_counter() - started:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hf_dir", nargs="?", type=Path, help="an HF DeepSeek-V3 directory with the tiny tokenizer")
    parser.add_argument("--ep", type=int, default=2, help="expert-parallel ranks (the rehearsal's actor: 2)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.hf_dir is not None:
        measure(args.hf_dir, args.ep, dtype)
        return 0
    from r1_ascend.rehearse.inputs import make_weights

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, _ = make_weights(Path(tmp))
        measure(hf_dir, args.ep, dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
