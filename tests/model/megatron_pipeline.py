"""One rank of ``test_megatron_pipeline.py``: megatron-core's DeepSeek-V3 actor from the converted dist checkpoint at
pipeline-parallel size WORLD (1: the reference; 2: a stage boundary after the first MoE layer), one forward and
backward pass through megatron-core's own schedule (``get_forward_backward_func``: the 1F1B pipeline schedule and
its p2p over gloo at PP 2), then verl's weight export (``per_tensor_generator``, which broadcasts each stage's
tensors to every rank at PP > 1).

Usage: megatron_pipeline.py WEIGHTS_DIR WORLD RANK PORT OUT_JSON. Writes the loss (last stage), each parameter's
gradient norm under its global layer number, and a digest of every exported HF tensor.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

#: The quickstart's checkpoint has four decoder layers (the first dense); at PP 2 the first stage takes the dense and
#: the first MoE layer, set as the 671B config sets its uneven split (``num_layers_in_first_pipeline_stage``).
FIRST_STAGE_LAYERS = 2


def global_name(name: str, offset: int) -> str:
    """A stage's parameter name with its decoder layer numbered as in the whole model."""
    parts = name.split(".")
    for index, part in enumerate(parts[:-1]):
        if part == "layers" and parts[index - 1] == "decoder" and parts[index + 1].isdigit():
            parts[index + 1] = str(int(parts[index + 1]) + offset)
            break
    return ".".join(parts)


def main(weights: Path, world: int, rank: int, port: str, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    from transformers import AutoConfig
    from verl.models.mcore import get_mcore_forward_fn
    from verl.utils.megatron_utils import unwrap_model
    from verl.utils.model import load_mcore_dist_weights

    from r1_ascend.cpu import mcore as mcore_cpu
    from r1_ascend.patches.prelude import apply_once
    from r1_ascend.rehearse.config import CPU_TRANSFORMER_OVERRIDES
    from r1_ascend.weights import model_check

    apply_once()
    mcore_cpu.install()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(1, world, expert_model_parallel_size=1)
    hf_config = AutoConfig.from_pretrained(str(weights / "hf-bf16"))
    overrides = dict(CPU_TRANSFORMER_OVERRIDES)
    if world > 1:
        overrides["num_layers_in_first_pipeline_stage"] = FIRST_STAGE_LAYERS
    actor, tf_config = model_check.build_actor(hf_config, torch.float32, overrides)
    load_mcore_dist_weights(actor, str(weights / "mcore"), is_value_model=False)
    ids, mask, positions = model_check.token_batch(int(hf_config.vocab_size), 4, 48, 0)
    targets = mask[:, 1:]
    forward = get_mcore_forward_fn(hf_config)

    def forward_step(batches, model):
        batch_ids, batch_mask, batch_positions = next(batches)
        output = forward(model, batch_ids, batch_mask, batch_positions, {})

        def loss_func(logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            loss = torch.nn.functional.cross_entropy(logits[:, :-1][targets], batch_ids[:, 1:][targets])
            return loss, {"loss": loss.detach()}

        return output, loss_func

    for chunk in actor:
        chunk.zero_grad_buffer()
    losses = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter([(ids, mask, positions)]),
        model=actor,
        num_microbatches=1,
        seq_length=int(ids.numel()),
        micro_batch_size=1,
        forward_only=False,
    )
    for chunk in actor:
        chunk.finish_grad_sync()
    offset = get_transformer_layer_offset(tf_config)
    grads = {
        global_name(name, offset): float(param.main_grad.norm())
        for chunk in actor
        for name, param in chunk.named_parameters()
        if param.requires_grad
    }
    exported = model_check.export_weights(actor, hf_config, tf_config, torch.float32)
    digest = {
        name: hashlib.sha256(tensor.detach().contiguous().float().numpy().tobytes()).hexdigest()
        for name, tensor in exported.items()
    }
    report = {
        "stage": parallel_state.get_pipeline_model_parallel_rank(),
        "layers": [int(layer.layer_number) for chunk in actor for layer in unwrap_model(chunk).decoder.layers],
        "loss": float(losses[0]["loss"]) if losses else None,
        "grads": grads,
        "exported": digest,
    }
    out.write_text(json.dumps(report), encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], Path(sys.argv[5]))
