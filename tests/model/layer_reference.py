"""Run as a script by test_model_check_layers.py: the layer-truncated models of ``check-model --layers N`` against
references built another way, in fp32 on the CPU.

Reference: each full model loaded as the whole check loads it (verl's loader; transformers' ``from_pretrained``),
then cut to its first N layers by hand. The truncated builds (fewer layers configured, only those layers read) must
give the same logits bit for bit: the same weights reach the same layers.

Usage: layer_reference.py WEIGHTS_DIR N OUT_JSON. Writes the max |logit difference| of each pair, and how far the
truncated logits are from the full model's (a cut that changes nothing would make the comparison empty).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(weights: Path, layers: int, out: Path) -> None:
    import torch
    from verl.utils.megatron_utils import unwrap_model

    from r1_ascend.cpu import mcore as mcore_cpu
    from r1_ascend.patches.prelude import apply_once
    from r1_ascend.rehearse.config import CPU_TRANSFORMER_OVERRIDES
    from r1_ascend.weights import model_check

    apply_once()
    mcore_cpu.install()
    model_check.init_single_rank("gloo")
    hf_dir, mcore = weights / "hf-bf16", weights / "mcore"
    overrides = dict(CPU_TRANSFORMER_OVERRIDES)
    actor, reference, config = model_check.build_models(hf_dir, mcore, torch.float32, overrides, layers)
    full_actor, full_reference, full_config = model_check.build_models(hf_dir, mcore, torch.float32, overrides)
    batch = model_check.token_batch(int(config.vocab_size), 4, 48, 0)
    truncated = model_check.score(actor, reference, config, batch)
    full = model_check.score(full_actor, full_reference, full_config, batch)
    unwrap_model(full_actor[0]).decoder.layers = unwrap_model(full_actor[0]).decoder.layers[:layers]
    full_reference.model.layers = full_reference.model.layers[:layers]
    cut = model_check.score(full_actor, full_reference, full_config, batch)
    mask = batch[1]
    result = {
        "megatron_vs_cut": float((truncated[0] - cut[0])[mask].abs().max()),
        "transformers_vs_cut": float((truncated[1] - cut[1])[mask].abs().max()),
        "truncated_vs_full": float((truncated[0] - full[0])[mask].abs().max()),
        "megatron_layers": len(unwrap_model(actor[0]).decoder.layers),
        "transformers_layers": len(reference.model.layers),
    }
    out.write_text(json.dumps(result) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
