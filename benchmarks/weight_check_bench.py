"""The weight-sync check's cost per sync in the CPU rehearsal, as a share of the whole weight sync.

Runs ``r1-ascend rehearse --lr 0 --steps N`` (verl's real loop: 2 simulated nodes, actor EP 2, rollout TP 2 / EP 2,
one launch, nothing killed) and reads what patch ``verl_weight_sync_check`` recorded for every sync of every worker
(``weight_checked`` in the lifecycle records): the whole sync (verl's ``rollout_mode``: resume the weights, verl's
``per_tensor_generator`` export through vLLM's ``load_weights`` into the engine, the MLA re-derivation, offload the
actor, resume the KV cache; then the check's verification), and the check's own parts: the actor's prediction, the
fingerprints of the stream as it enters vLLM's loader, the verification. Both are measured in the same run, the
second inside the first.

    python benchmarks/weight_check_bench.py --weights outputs/quickstart/weights --steps 3
    python benchmarks/weight_check_bench.py --estimate     # the 671B arithmetic only

``--estimate`` prints the check's cost on one die of DeepSeek-V3 671B at the shipped layout (rollout TP 2 x DP 128 /
EP 256, actor PP 8 / EP 32): the elements each die fingerprints, counted from the HF <-> Megatron mapping and the
ownership rule's splits, times the bytes each fingerprint moves, over an A3 die's memory bandwidth; the kernels it
launches; its collectives; against the 67.6 s reshard of verl's r1_ascend (PR #3427). The figures are recorded in
docs/benchmarks.md ("Weight-sync check").
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: DeepSeek-V3's sizes (config.json of deepseek-ai/DeepSeek-V3; docs/weights.md)
DSV3 = {
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "first_k_dense_replace": 3,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
ROLLOUT_TP, ROLLOUT_EP, ACTOR_PP, ACTOR_EP = 2, 256, 8, 32
#: Bytes of memory traffic per bf16 element (patches/rules/weight_fingerprint.py): the product with b (read 2,
#: write 2), its row sum (read 2), the plain sum (read 2), |x| and its sum (read 2, write 2, read 2), the checksum's
#: products and row sums (read 2, write 2, read 2). Received regions take all; engine and actor regions no |x|.
BYTES_RECEIVED, BYTES_ENGINE, BYTES_ACTOR = 20, 14, 14
#: Kernels launched per region fingerprint (the same file: 8 for the fp32 sums, 6 for the checksum, views and stack).
KERNELS = 17
HBM_BYTES_S = 1.6e12  # an A3 (Ascend 910C) die's HBM bandwidth: 3.2 TB/s per package of two dies
DISPATCH_S = 8e-6  # host time per eager kernel launch with TASK_QUEUE_ENABLE=2 (assumed, not measured here)
COLLECTIVE_S = 0.025  # a small gloo all-reduce over 256 ranks: 2 x 255 ring steps of about 50 us (assumed)
RESHARD_S = 67.6  # verl's r1_ascend (PR #3427): the reshard of one step at 671B


def estimate() -> None:
    """The check's cost per sync on one die at 671B (module docstring), printed with its arithmetic."""
    from r1_ascend.patches.rules.mcore_mapping import hf_sources

    sources = hf_sources(DSV3)
    replicated = ("layernorm.weight", "q_a_proj.weight", "kv_a_proj_with_mqa.weight", "mlp.gate.weight")
    replicated += ("e_score_correction_bias", "model.norm.weight")
    routed_total = dense_total = 0
    rollout_dense = 0
    regions = 0
    for name, source in sources.items():
        n = 1
        for size in source.shape:
            n *= size
        if ".mlp.experts." in name:
            routed_total += n
            continue
        dense_total += n
        whole = name.endswith(replicated)
        rollout_dense += n if whole else n // ROLLOUT_TP
        regions += 1
    layers = DSV3["num_hidden_layers"]
    heads, lora = DSV3["num_attention_heads"], DSV3["kv_lora_rank"]
    mla = layers * heads * (DSV3["qk_nope_head_dim"] + DSV3["v_head_dim"]) * lora // ROLLOUT_TP
    expert_regions = (layers - DSV3["first_k_dense_replace"]) * 3 * (DSV3["n_routed_experts"] // ROLLOUT_EP)
    rollout = rollout_dense + routed_total // ROLLOUT_EP
    formula = dense_total // ROLLOUT_TP + routed_total // ROLLOUT_EP
    actor = dense_total // ACTOR_PP + routed_total // (ACTOR_PP * ACTOR_EP)
    slots = regions + expert_regions + 2 * layers
    actor_regions = (
        regions + (layers - DSV3["first_k_dense_replace"]) * 3 * DSV3["n_routed_experts"] // ACTOR_EP
    ) // ACTOR_PP
    traffic = rollout * (BYTES_RECEIVED + BYTES_ENGINE) + mla * (BYTES_RECEIVED + BYTES_ENGINE) + actor * BYTES_ACTOR
    device = traffic / HBM_BYTES_S
    kernels = (2 * slots + 2 * actor_regions) * KERNELS
    host = kernels * DISPATCH_S
    collectives = 3 * COLLECTIVE_S
    total = max(device, host) + collectives
    print(f"671B: {dense_total:,} non-expert + {routed_total:,} routed-expert parameters")
    print(
        f"rollout die: {formula:,} (non-expert / TP {ROLLOUT_TP} + experts / EP {ROLLOUT_EP}); by the rule's splits "
        f"(replicated linears and norms whole) {rollout:,}; MLA matrices {mla:,}"
    )
    print(f"actor die: {actor:,} (non-expert / PP {ACTOR_PP} + experts / (PP {ACTOR_PP} x EP {ACTOR_EP}))")
    print(
        f"memory traffic: ({rollout:,} + {mla:,}) x ({BYTES_RECEIVED} + {BYTES_ENGINE}) B + {actor:,} x "
        f"{BYTES_ACTOR} B = {traffic / 1e9:.0f} GB; at {HBM_BYTES_S / 1e12:.1f} TB/s {device:.3f} s"
    )
    print(
        f"kernels: 2 x ({slots:,} rollout + {actor_regions:,} actor regions) x {KERNELS} = {kernels:,}; at "
        f"{DISPATCH_S * 1e6:.0f} us each {host:.3f} s (overlapping the device's work)"
    )
    print(f"collectives: 3 small all-reduces over 256 ranks, {collectives:.3f} s")
    print(
        f"per sync: {total:.3f} s = {100 * total / RESHARD_S:.2f} % of the {RESHARD_S} s reshard "
        f"(bandwidth alone {100 * (device + collectives) / RESHARD_S:.2f} %)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", type=Path, help="the quickstart's converted weights (default: made by the run)")
    parser.add_argument("--steps", type=int, default=3, help="training steps = weight syncs (default 3)")
    parser.add_argument("--output-dir", type=Path, help="keep the rehearsal here (default: a temporary directory)")
    parser.add_argument("--estimate", action="store_true", help="print the 671B estimate only")
    args = parser.parse_args(argv)
    if args.estimate:
        estimate()
        return 0

    from r1_ascend.rehearse.lifecycle import read_lifecycle

    with tempfile.TemporaryDirectory() as tmp:
        out = args.output_dir or Path(tmp) / "rehearse"
        cmd = [sys.executable, "-m", "r1_ascend.cli", "rehearse", "--lr", "0", "--steps", str(args.steps)]
        cmd += ["--output-dir", str(out)] + (["--weights", str(args.weights)] if args.weights else [])
        started = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print((done.stdout + done.stderr)[-4000:], file=sys.stderr)
            return done.returncode
        print(f"rehearsal of {args.steps} steps: {time.perf_counter() - started:.0f} s")
        checks = sorted(
            (e for e in read_lifecycle(out / "lifecycle") if e["event"] == "weight_checked"),
            key=lambda e: (e["sync"], e["rank"]),
        )
    if not checks:
        print("no weight_checked record: is verl_weight_sync_check switched off?", file=sys.stderr)
        return 1
    print(
        f"{'sync':>4} {'rank':>4} {'sync s':>8} {'check s':>8} {'predict':>8} {'receive':>8} {'verify':>8} {'share':>7}"
    )
    shares = []
    for e in checks:
        whole = float(e["sync_s"]) + float(e["verify_s"])
        check = float(e["predict_s"]) + float(e["receive_s"]) + float(e["verify_s"])
        shares.append(check / whole)
        print(
            f"{e['sync']:>4} {e['rank']:>4} {whole:>8.3f} {check:>8.3f} {e['predict_s']:>8.3f} {e['receive_s']:>8.3f} "
            f"{e['verify_s']:>8.3f} {100 * check / whole:>6.1f}%"
        )
    wholes = [float(e["sync_s"]) + float(e["verify_s"]) for e in checks]
    costs = [float(e["predict_s"]) + float(e["receive_s"]) + float(e["verify_s"]) for e in checks]
    print(
        f"per sync and rank: the whole sync {statistics.median(wholes):.3f} s (median), the check "
        f"{statistics.median(costs):.3f} s; share {100 * statistics.median(shares):.1f} % (median), "
        f"{100 * min(shares):.1f}-{100 * max(shares):.1f} %; {checks[0]['slots']} engine tensors and "
        f"{checks[0]['shares']} shares checked per rank, mismatches {sum(e['mismatches'] for e in checks)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
