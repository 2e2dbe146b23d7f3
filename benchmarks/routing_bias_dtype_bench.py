"""How many tokens change experts when the routers' expert bias is held in bf16 instead of float32.

The checkpoint and Megatron's router keep ``e_score_correction_bias`` in float32. vllm-ascend 0.9.1's DeepSeek
model creates it in the model dtype unless torchair's super kernel is on (``vllm_ascend/models/deepseek_v2.py:295``),
so in eager mode the rollout routes with a bf16 bias while the actor routes with the float32 one: a token whose
biased scores are within the rounding of a tie picks another expert in the rollout than in training.

Measured with transformers' ``DeepseekV3ForCausalLM`` in float32 (so only the bias differs) on the prompt sets of
``r1_ascend.launch.routing_prompts``, every token: per MoE layer, the tokens whose chosen experts differ between the
float32 bias and the same bias rounded to bf16, and the largest rounding of a bias entry.

    python benchmarks/routing_bias_dtype_bench.py [HF_DIR]

Without a directory it makes the quickstart's checkpoint in a temporary directory first.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from r1_ascend.launch.routing_prompts import prompt_sets


def changed_choices(router: torch.nn.Module, hidden: torch.Tensor) -> tuple[int, int]:
    """(tokens whose top-k experts differ with the bias rounded to bf16, tokens) for one router's input."""
    scores = torch.nn.functional.linear(hidden.reshape(-1, hidden.shape[-1]), router.weight).sigmoid()
    exact = router.get_topk_indices(scores).sort(dim=-1).values
    kept = router.e_score_correction_bias.data.clone()
    try:
        router.e_score_correction_bias.data = kept.to(torch.bfloat16).float()
        rounded = router.get_topk_indices(scores).sort(dim=-1).values
    finally:
        router.e_score_correction_bias.data = kept
    return int((exact != rounded).any(dim=-1).sum()), int(scores.shape[0])


def measure(hf_dir: Path) -> None:
    from transformers import DeepseekV3ForCausalLM
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    model = DeepseekV3ForCausalLM.from_pretrained(str(hf_dir), torch_dtype=torch.float32).eval()
    routers = {name: module for name, module in model.named_modules() if isinstance(module, DeepseekV3TopkRouter)}
    counts = {name: [0, 0] for name in routers}

    def record(name: str) -> object:
        def hook(router: torch.nn.Module, inputs: tuple[torch.Tensor, ...], _output: object) -> None:
            changed, tokens = changed_choices(router, inputs[0])
            counts[name][0] += changed
            counts[name][1] += tokens

        return hook

    for name, router in routers.items():
        router.register_forward_hook(record(name))
    started = time.perf_counter()
    with torch.no_grad():
        for prompts in prompt_sets().values():
            for prompt in prompts:
                model(torch.tensor([prompt]))
    print(f"{hf_dir}: routers' expert bias float32 -> bf16, float32 model")
    print(f"  {'router':<26} {'tokens changed':>15} {'share':>8} {'bias max':>9} {'max rounding':>13}")
    for name, (changed, tokens) in counts.items():
        bias = routers[name].e_score_correction_bias.data
        rounding = float((bias - bias.to(torch.bfloat16).float()).abs().max())
        share, largest = 100 * changed / max(tokens, 1), float(bias.abs().max())
        print(f"  {name:<26} {changed:>7} / {tokens:<6} {share:>7.2f}% {largest:>9.3f} {rounding:>13.2e}")
    print(f"  ({time.perf_counter() - started:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hf_dir", nargs="?", type=Path, help="an HF DeepSeek-V3 directory with the tiny tokenizer")
    args = parser.parse_args(argv)
    if args.hf_dir is not None:
        measure(args.hf_dir)
        return 0
    from r1_ascend.rehearse.inputs import make_weights

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, _ = make_weights(Path(tmp))
        measure(hf_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
