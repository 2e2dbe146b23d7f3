"""One rank of ``test_vllm_deepseek_load.py``: build vLLM's DeepSeek-V3 class on the CPU, load the tiny checkpoint's
HF tensors through its ``load_weights`` and report what each parameter holds against the source tensors.

Usage: python vllm_deepseek_child.py MODEL_DIR WORLD RANK PORT OUT_JSON
One build, then one load per case: ``healthy``, and the planted layout faults ``w13-swap`` (every expert's gate and
up exchanged in the weights handed over), ``transposed-expert`` (one expert's down_proj transposed) and
``wrong-ep-rank`` (each MoE layer's expert map shifted by one while the weights load: experts land in another
rank's or slot's place, and are read back through the layer's own map, as its kernels route).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from r1_ascend.testing import npu_stub

npu_stub.install()

import torch  # noqa: E402

from r1_ascend.cpu import vllm_deepseek  # noqa: E402
from r1_ascend.weights.tiny import bf16_state_dict  # noqa: E402


def planted(state: dict[str, torch.Tensor], fault: str) -> dict[str, torch.Tensor]:
    state = dict(state)
    if fault == "w13-swap":
        for name in [n for n in state if ".experts." in n and n.endswith("gate_proj.weight")]:
            up = name.replace("gate_proj", "up_proj")
            state[name], state[up] = state[up], state[name]
    elif fault == "transposed-expert":
        name = next(n for n in state if ".experts.0.down_proj.weight" in n)
        state[name] = state[name].t().contiguous()
    return state


CASES = ("healthy", "w13-swap", "transposed-expert", "wrong-ep-rank")


def load_case(model: torch.nn.Module, source: dict[str, torch.Tensor], fault: str, world: int) -> dict[str, object]:
    maps = {module: module.expert_map for module in model.modules() if hasattr(module, "expert_map")}
    if fault == "wrong-ep-rank":
        for module in maps:
            experts = module.global_num_experts
            current = module.expert_map if module.expert_map is not None else torch.arange(experts)
            module.expert_map = torch.roll(current, 1)
    report: dict[str, object] = {}
    try:
        loaded = model.load_weights(iter(planted(source, fault).items()))
    except Exception as error:  # the report names what the loader refused
        report["load_error"] = f"{type(error).__name__}: {error}"
        loaded = None
    # the kernels route by the layer's own expert map: read back with it, whatever the loader used
    for module, expert_map in maps.items():
        module.expert_map = expert_map
    # the read-back is a collective: every rank reads back only if every rank loaded
    refused = torch.tensor([int(loaded is None)])
    torch.distributed.all_reduce(refused)
    if loaded is None or int(refused) > 0:
        report.setdefault("load_error", "refused on another rank")
    else:
        report["unloaded"] = sorted(name for name, _ in model.named_parameters() if name not in loaded)
        tensors = vllm_deepseek.hf_tensors(model)
        report["experts"] = sorted(name for name in tensors if ".experts." in name)
        report["differ"] = sorted(
            name for name, tensor in tensors.items() if not torch.equal(tensor, source[name].to(tensor.dtype))
        )
        report["missing"] = sorted(name for name in source if name not in tensors)
        report["held"] = {
            name: [expert for expert, slot in enumerate(module.expert_map.tolist()) if slot >= 0]
            for name, module in model.named_modules()
            if getattr(module, "expert_map", None) is not None
        }
    return report


def main() -> None:
    model_dir, world, rank, port, out = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    config = vllm_deepseek.vllm_config(model_dir, torch.bfloat16, tensor_parallel_size=world, expert_parallel=world > 1)
    vllm_deepseek.init_groups(config, world, rank, f"tcp://127.0.0.1:{port}")
    model = vllm_deepseek.build(config)
    source = bf16_state_dict(json.loads((model_dir / "config.json").read_text()), 0)
    report: dict[str, object] = {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "dtypes": {name: str(param.dtype) for name, param in model.named_parameters()},
    }
    for case in CASES:
        report[case] = load_case(model, source, case, world)
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
