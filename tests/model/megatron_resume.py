"""Run as a script by test_megatron_resume.py: one actor step, verl's MegatronCheckpointManager save, the next step
(``save`` mode, the uninterrupted run); or the checkpoint manager's load and that next step (``resume`` mode).

megatron-core's DeepSeek-V3 GPTModel from the converted dist checkpoint, Megatron DDP, the DistributedOptimizer and
its LR scheduler built by verl's functions, on the CPU (one rank, one thread: deterministic). Usage:
megatron_resume.py WEIGHTS_DIR CHECKPOINT_DIR save|resume|resume-shared-step OUT_JSON (the last without the
CPU replacement that gives each Adam state its own step after a load). Writes the step's loss, grad norm, learning rate
and a digest of every parameter."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

LR = 1e-3


def main(weights: Path, checkpoint: Path, mode: str, out: Path) -> None:
    import torch

    torch.set_num_threads(1)
    from megatron.core import tensor_parallel
    from transformers import AutoConfig, AutoTokenizer
    from verl.models.mcore import get_mcore_forward_fn
    from verl.utils.checkpoint.megatron_checkpoint_manager import MegatronCheckpointManager
    from verl.utils.megatron.optimizer import (
        get_megatron_optimizer,
        get_megatron_optimizer_param_scheduler,
        init_megatron_optim_config,
    )
    from verl.utils.model import load_mcore_dist_weights

    from r1_ascend.cpu import mcore as mcore_cpu
    from r1_ascend.patches.prelude import apply_once
    from r1_ascend.rehearse.config import CPU_TRANSFORMER_OVERRIDES
    from r1_ascend.testing.verl_config import compose_trainer
    from r1_ascend.weights import model_check

    apply_once()
    mcore_cpu.install()
    if mode == "resume-shared-step":  # megatron-core's own load: one step tensor shared by every Adam state
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

        DistributedOptimizer.load_state_dict = DistributedOptimizer.load_state_dict.__wrapped__
    model_check.init_single_rank("gloo")
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    hf_dir = weights / "hf-bf16"
    hf_config = AutoConfig.from_pretrained(str(hf_dir))
    actor, tf_config = model_check.build_actor(hf_config, torch.float32, dict(CPU_TRANSFORMER_OVERRIDES))
    load_mcore_dist_weights(actor, str(weights / "mcore"), is_value_model=False)
    config = compose_trainer(
        f"actor_rollout_ref.actor.optim.lr={LR}",
        "actor_rollout_ref.actor.optim.clip_grad=1.0",
        "actor_rollout_ref.actor.optim.total_training_steps=10",
    )
    optim = config.actor_rollout_ref.actor.optim
    optimizer = get_megatron_optimizer(model=actor, config=init_megatron_optim_config(optim))
    scheduler = get_megatron_optimizer_param_scheduler(optimizer=optimizer, config=optim)
    manager = MegatronCheckpointManager(
        config=config.actor_rollout_ref,
        checkpoint_config=config.actor_rollout_ref.actor.checkpoint,
        model_config=hf_config,
        transformer_config=tf_config,
        role="actor",
        model=actor,
        arch=hf_config.architectures[0],
        hf_config=hf_config,
        param_dtype=torch.float32,
        share_embeddings_and_output_weights=False,
        processing_class=AutoTokenizer.from_pretrained(str(hf_dir)),
        optimizer=optimizer,
        optimizer_scheduler=scheduler,
        use_distributed_optimizer=True,
        use_dist_checkpointing=True,
    )
    forward = get_mcore_forward_fn(hf_config)

    def step(seed: int) -> dict[str, float]:
        ids, mask, positions = model_check.token_batch(int(hf_config.vocab_size), 4, 48, seed)
        for chunk in actor:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        logits = forward(actor[0], ids, mask, positions, {})
        targets = mask[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits[:, :-1][targets], ids[:, 1:][targets])
        loss.backward()
        for chunk in actor:
            chunk.finish_grad_sync()
        ok, grad_norm, _ = optimizer.step()
        scheduler.step(1)
        lr = optimizer.param_groups[0]["lr"]
        return {"loss": float(loss), "grad_norm": float(grad_norm), "ok": bool(ok), "lr": lr}

    if mode == "save":
        step(seed=1)
        manager.save_checkpoint(str(checkpoint), global_step=1)
    else:
        manager.load_checkpoint(str(checkpoint))
    result = step(seed=2)
    digest = hashlib.sha256()
    for param in actor[0].parameters():
        digest.update(param.detach().numpy().tobytes())
    result["params_sha256"] = digest.hexdigest()
    result["params"] = {name: p.detach().double().sum().item() for name, p in actor[0].named_parameters()}
    out.write_text(json.dumps(result) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
