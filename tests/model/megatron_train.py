"""Run as a script by test_megatron_train.py: a few steps of megatron-core's DeepSeek-V3 GPTModel from the converted
dist checkpoint, with Megatron DDP and the DistributedOptimizer built by verl's own functions, on the CPU.

Usage: megatron_train.py WEIGHTS_DIR LR STEPS OUT_JSON. Writes the loss and grad norm of each step and the largest
parameter change."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(weights: Path, lr: float, steps: int, out: Path) -> None:
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoConfig
    from verl.models.mcore import get_mcore_forward_fn
    from verl.utils.megatron.optimizer import get_megatron_optimizer, init_megatron_optim_config
    from verl.utils.model import load_mcore_dist_weights

    from r1_ascend.cpu import mcore as mcore_cpu
    from r1_ascend.patches.prelude import apply_once
    from r1_ascend.rehearse.config import CPU_TRANSFORMER_OVERRIDES
    from r1_ascend.weights import model_check

    apply_once()
    mcore_cpu.install()
    model_check.init_single_rank("gloo")
    hf_config = AutoConfig.from_pretrained(str(weights / "hf-bf16"))
    actor, _ = model_check.build_actor(hf_config, torch.float32, dict(CPU_TRANSFORMER_OVERRIDES))
    load_mcore_dist_weights(actor, str(weights / "mcore"), is_value_model=False)
    optim = OmegaConf.create(
        {"lr": lr, "min_lr": 0.0, "clip_grad": 1.0, "weight_decay": 0.0, "optimizer": "adam", "lr_warmup_init": 0.0}
    )
    optimizer = get_megatron_optimizer(model=actor, config=init_megatron_optim_config(optim))
    before = {n: p.detach().clone() for n, p in actor[0].named_parameters()}
    ids, mask, positions = model_check.token_batch(int(hf_config.vocab_size), 4, 48, 0)
    forward = get_mcore_forward_fn(hf_config)
    targets = mask[:, 1:]
    record = []
    for _ in range(steps):
        for chunk in actor:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        logits = forward(actor[0], ids, mask, positions, {})
        loss = torch.nn.functional.cross_entropy(logits[:, :-1][targets], ids[:, 1:][targets])
        loss.backward()
        for chunk in actor:
            chunk.finish_grad_sync()
        ok, grad_norm, _ = optimizer.step()
        record.append({"loss": float(loss), "grad_norm": float(grad_norm), "ok": bool(ok)})
    change = max(float((p.detach() - before[n]).abs().max()) for n, p in actor[0].named_parameters())
    out.write_text(json.dumps({"steps": record, "max_param_change": change}) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
