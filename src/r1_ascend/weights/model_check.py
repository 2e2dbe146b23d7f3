"""``r1-ascend check-model``: does the Megatron actor compute the same model as the rollout engine?

The actor (megatron-core's ``GPTModel``, built the way verl 0.6.1 builds it: ``hf_to_mcore_config`` ->
``make_megatron_module``, weights from the Megatron dist checkpoint through verl's ``load_mcore_dist_weights``) and
an implementation that shares no code with it (transformers' ``DeepseekV3ForCausalLM`` from the HF checkpoint)
score the same token batch (right- and left-padded rows, through verl's packed-sequence forward). Any difference
in the converter's layouts, the config conversion (group-limited routing, yarn rope) or the checkpoint shows up as
a logit gap long before it shows up in a reward curve.

Without ``--dist-ckpt`` the Megatron model starts from its own initialisation and its weights reach transformers
through verl's ``per_tensor_generator`` (the actor -> rollout weight export), so the check covers the export
instead of the converter. One process, TP = EP = PP = 1: for models that fit one device (the smoke model), or on
the CPU with ``--cpu`` (megatron-core's device-only calls replaced, r1_ascend.cpu.mcore). The overlay is
applied first, as in every process of a run, so the actor gets the run's config conversion; its switches
(``R1_ASCEND_DISABLE``) apply here too.

Exit status: 0 when the gaps are within the tolerances of the dtype, 1 otherwise, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from r1_ascend.ports import unused_local_port

#: Tolerances by dtype: max |logit gap| and mean |Δ log-prob| (nats) over valid tokens. fp32 is exact up to
#: reduction order; bf16 is measured (docs/benchmarks.md) and given a margin.
TOLERANCES: dict[str, tuple[float, float]] = {"fp32": (1e-4, 1e-5), "bf16": (0.1, 0.01)}

#: ``--layers`` without a value: the dense layers plus one MoE layer (layer_check.default_layers). Not a string,
#: which argparse would pass through ``type``; not a number a user could type.
DEFAULT_LAYERS = object()


@dataclass(frozen=True)
class Gap:
    """Megatron vs transformers on one batch."""

    dtype: str
    tokens: int
    max_logit_gap: float
    mean_abs_logprob_gap: float
    argmax_agreement: float
    megatron_parameters: int
    layers: int  # decoder layers compared (all of them unless --layers)

    def within(self) -> bool:
        max_logit, mean_lp = TOLERANCES[self.dtype]
        return self.max_logit_gap <= max_logit and self.mean_abs_logprob_gap <= mean_lp


def init_single_rank(backend: str) -> None:
    """One-rank torch.distributed and Megatron parallel state (TP = PP = EP = 1), unless already initialised."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(unused_local_port()))
        dist.init_process_group(backend, rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=1)


def build_actor(
    hf_config: Any, dtype: Any, overrides: dict[str, Any], *, wrap_with_ddp: bool = True
) -> tuple[list[Any], Any]:
    """megatron-core's GPTModel as verl's actor builds it (DDP-wrapped unless asked not to; Float16Module in bf16)."""
    from verl.models.mcore import hf_to_mcore_config
    from verl.utils.megatron_utils import McoreModuleWrapperConfig, make_megatron_module

    tf_config = hf_to_mcore_config(hf_config, dtype, **overrides)
    wrap = McoreModuleWrapperConfig(
        is_value_model=False, share_embeddings_and_output_weights=False, wrap_with_ddp=wrap_with_ddp
    )
    return make_megatron_module(wrap_config=wrap, tf_config=tf_config, hf_config=hf_config), tf_config


def export_weights(actor: list[Any], hf_config: Any, tf_config: Any, dtype: Any) -> dict[str, Any]:
    """The actor's weights under HF names, through verl's actor -> rollout export."""
    from verl.models.mcore import get_mcore_weight_converter
    from verl.utils.megatron_utils import per_tensor_generator

    converter = get_mcore_weight_converter(hf_config, dtype)
    mapping = {"qkv_layer_name": "self_attention.linear_qkv.", "gate_proj_layer_name": "linear_fc1."}
    return dict(per_tensor_generator(actor, hf_config, converter, tf_config, mapping))


def token_batch(vocab: int, rows: int, length: int, seed: int) -> tuple[Any, Any, Any]:
    """Random ids with one right-padded and one left-padded row, as verl's batches are; positions from the mask."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length), generator=generator)
    mask = torch.ones(rows, length, dtype=torch.bool)
    if rows > 1:
        mask[1, length * 3 // 4 :] = False
    if rows > 2:
        mask[2, : length // 8] = False
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def build_models(
    hf_dir: Path,
    dist_ckpt: Path | None,
    dtype: Any,
    overrides: dict[str, Any],
    layers: int | None = None,
) -> tuple[list[Any], Any, Any]:
    """The actor and transformers' model with the same weights: whole, or only the first ``layers`` layers."""
    from transformers import AutoConfig, DeepseekV3ForCausalLM

    from r1_ascend.weights import layer_check

    hf_config = AutoConfig.from_pretrained(str(hf_dir))
    if layers is not None:
        hf_config = layer_check.truncated_config(hf_config, layers)
    metadata = layer_check.check_dist_layers(dist_ckpt, layers) if layers and dist_ckpt else None
    if metadata is not None:
        overrides = {**overrides, "perform_initialization": False}  # every weight is read from the checkpoint
    # DDP's fp32 gradient buffers would double a truncated 671B model's memory; the forward does not use them
    actor, tf_config = build_actor(hf_config, dtype, overrides, wrap_with_ddp=layers is None)
    if dist_ckpt is not None and metadata is not None:
        layer_check.load_dist_layers(actor, dist_ckpt, layers, metadata)
        reference = layer_check.load_hf_layers(hf_dir, hf_config, dtype)
    elif dist_ckpt is not None:
        from verl.utils.model import load_mcore_dist_weights

        load_mcore_dist_weights(actor, str(dist_ckpt), is_value_model=False)
        reference = DeepseekV3ForCausalLM.from_pretrained(str(hf_dir), torch_dtype=dtype)
    else:
        reference = DeepseekV3ForCausalLM(hf_config).to(dtype)
        named = export_weights(actor, hf_config, tf_config, dtype)
        missing, unexpected = reference.load_state_dict(named, strict=False)
        if missing or unexpected:
            raise ValueError(f"the actor's export does not match transformers: missing {missing}, extra {unexpected}")
    return actor, reference, hf_config


def score(actor: list[Any], reference: Any, hf_config: Any, batch: tuple[Any, Any, Any]) -> tuple[Any, Any]:
    """Logits of both models on one batch (eval mode, no grad), in fp32."""
    import torch
    from verl.models.mcore import get_mcore_forward_fn

    reference.eval()
    for chunk in actor:
        chunk.eval()
    ids, mask, positions = batch
    forward = get_mcore_forward_fn(hf_config)
    with torch.no_grad():
        megatron_logits = forward(actor[0], ids, mask, positions, {}).float()
        reference_logits = reference(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits.float()
    return megatron_logits, reference_logits


def compare(
    hf_dir: Path,
    dist_ckpt: Path | None = None,
    dtype_name: str = "fp32",
    rows: int = 4,
    length: int = 48,
    seed: int = 0,
    transformer_overrides: dict[str, Any] | None = None,
    layers: int | None = None,
) -> Gap:
    """Build both models, score one batch with each, and measure the gap over the valid tokens."""
    import torch
    from verl.utils.megatron_utils import unwrap_model

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    actor, reference, hf_config = build_models(hf_dir, dist_ckpt, dtype, dict(transformer_overrides or {}), layers)
    ids, mask, positions = token_batch(int(hf_config.vocab_size), rows, length, seed)
    megatron_logits, reference_logits = score(actor, reference, hf_config, (ids, mask, positions))
    gap = (megatron_logits - reference_logits)[mask]
    logprob_gap = (torch.log_softmax(megatron_logits, -1) - torch.log_softmax(reference_logits, -1))[mask]
    agreement = (megatron_logits.argmax(-1) == reference_logits.argmax(-1))[mask].float().mean()
    return Gap(
        dtype=dtype_name,
        tokens=int(mask.sum()),
        max_logit_gap=float(gap.abs().max()),
        mean_abs_logprob_gap=float(logprob_gap.abs().mean()),
        argmax_agreement=float(agreement),
        megatron_parameters=sum(p.numel() for p in unwrap_model(actor[0]).parameters()),
        layers=int(hf_config.num_hidden_layers),
    )


def _parser() -> argparse.ArgumentParser:
    from r1_ascend.cli import plain_help

    parser = argparse.ArgumentParser(prog="r1-ascend check-model", description=plain_help(__doc__.split("\n\n")[0]))
    parser.add_argument("--hf-dir", type=Path, required=True, help="HF BF16 directory (config.json + safetensors)")
    parser.add_argument("--dist-ckpt", type=Path, help="Megatron dist checkpoint made from it (to-megatron)")
    parser.add_argument("--dtype", choices=sorted(TOLERANCES), default="fp32")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (device-only calls replaced)")
    parser.add_argument(
        "--layers",
        type=int,
        nargs="?",
        const=DEFAULT_LAYERS,
        metavar="N",
        help="build both models with only the first N decoder layers and read only those layers' weights "
        "(for checkpoints too large to load whole); without N: first_k_dense_replace + 1 (4 for DeepSeek-V3)",
    )
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the measured gap to this file")
    return parser


def _input_error(args: argparse.Namespace) -> str | None:
    if not (args.hf_dir / "config.json").is_file():
        return f"{args.hf_dir}/config.json not found: --hf-dir must be an HF checkpoint directory"
    if args.dist_ckpt is not None and not (args.dist_ckpt / "metadata.json").is_file():
        return f"{args.dist_ckpt} is not a Megatron dist checkpoint (no metadata.json)"
    return None


def select_layers(args: argparse.Namespace) -> int | None:
    """The layer count ``--layers`` asks for (None: the whole model), checked against both checkpoints' layers,
    with the memory estimate printed before anything is allocated."""
    if args.layers is None:
        return None
    from r1_ascend.weights import layer_check

    config = json.loads((args.hf_dir / "config.json").read_text(encoding="utf-8"))
    layers = layer_check.resolve_layers(None if args.layers is DEFAULT_LAYERS else args.layers, config)
    layer_check.check_hf_layers(args.hf_dir, config, layers)
    if args.dist_ckpt is not None:
        layer_check.check_dist_layers(args.dist_ckpt, layers)
    dtype_bytes = 4 if args.dtype == "fp32" else 2
    layer_check.note(layer_check.estimate(config, layers, dtype_bytes).describe(args.dtype))
    return layers


def _report(result: Gap, dtype_name: str, layers: int | None) -> int:
    max_logit, mean_lp = TOLERANCES[dtype_name]
    what = f"first {layers} layers, " if layers else ""
    if result.within():
        print(f"check-model: the actor and transformers agree within {max_logit} (logits) / {mean_lp} nat ", end="")
        print(f"({what}{dtype_name})")
        return 0
    print(
        f"check-model: the actor and transformers DISAGREE beyond {max_logit} (logits) / {mean_lp} nat "
        f"({what}{dtype_name}): "
        "check group-limited routing (moe_router_num_groups / moe_router_group_topk vs n_group / topk_group), "
        "the yarn rope settings (rope_scaling.factor x original_max_position_embeddings = max_position_embeddings), "
        "and the conversion (r1-ascend convert-weights verify)",
        file=sys.stderr,
    )
    return 1


def main(argv: list[str] | None = None) -> int:
    from r1_ascend.weights.errors import WeightsError

    args = _parser().parse_args(argv)
    problem = _input_error(args)
    try:
        layers = None if problem else select_layers(args)
    except WeightsError as exc:
        problem = str(exc)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from r1_ascend.patches.prelude import apply_once

    apply_once()  # the overlay as the run has it (its switches apply): the actor's config conversion is patched
    overrides: dict[str, Any] = {}
    if args.cpu:
        from r1_ascend.cpu import mcore as mcore_cpu
        from r1_ascend.rehearse.config import CPU_TRANSFORMER_OVERRIDES

        mcore_cpu.install()
        overrides.update(CPU_TRANSFORMER_OVERRIDES)
    init_single_rank("gloo" if args.cpu else "hccl")
    try:
        result = compare(args.hf_dir, args.dist_ckpt, args.dtype, args.rows, args.length, args.seed, overrides, layers)
    except WeightsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if layers is not None:
        from r1_ascend.weights.layer_check import note, peak_rss_gb

        note(f"check-model: peak resident memory {peak_rss_gb():.2f} GB")
    print(json.dumps(asdict(result), indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result)) + "\n", encoding="utf-8")
    return _report(result, args.dtype, layers)


if __name__ == "__main__":
    sys.exit(main())
