"""Planted rollout faults (``r1_ascend.rehearse.rollout_faults``): each changes what the CPU rollout engine computes
in exactly the documented way, and only in the sync it is planted in. Here the engine without vLLM's model (no
torch.distributed world): the export-stream, MLA and configuration faults; the faults planted in vLLM's loader or
parameters say they need it. In vLLM's model: tests/model/test_vllm_deepseek_load.py and test_weight_sync_check.py;
the guard's view on the real model path: tests/model/test_rollout_guard_faults.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vllm import SamplingParams

from r1_ascend.cpu import engine as cpu_engine
from r1_ascend.cpu.engine import CPUStandInLLM
from r1_ascend.patches.impl.rollout_memory import mla_impls
from r1_ascend.rehearse import rollout_faults, weight_faults
from r1_ascend.rehearse.inputs import write_model

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("faults") / "model")


def _engine(model_dir: Path, monkeypatch: pytest.MonkeyPatch, spec: str | None = None) -> CPUStandInLLM:
    if spec is None:
        monkeypatch.delenv("R1_ASCEND_REHEARSE_ROLLOUT_FAULT", raising=False)
    else:
        monkeypatch.setenv("R1_ASCEND_REHEARSE_ROLLOUT_FAULT", spec)
    monkeypatch.setattr(cpu_engine, "ENGINE_HOOKS", [rollout_faults.attach_from_env])  # as the rehearsal's workers
    return CPUStandInLLM(str(model_dir), dtype="float32", max_model_len=64, seed=0)


def _weights(llm: CPUStandInLLM, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(p.shape, generator=g) * 0.05 for n, p in llm.model.named_parameters()}


def _sync(llm: CPUStandInLLM, weights: dict[str, torch.Tensor]) -> None:
    """What the overlay's update_weights does: load, then re-derive the MLA matrices."""
    llm.load_weights(iter(weights.items()))


def _logits(llm: CPUStandInLLM) -> torch.Tensor:
    with torch.no_grad():
        return llm.model(input_ids=torch.tensor([PROMPTS[0]])).logits


@pytest.mark.parametrize("spec", ["stale-layers", "stale-layers@0", "stale-layers@x", "no-such-fault@2"])
def test_bad_specs_are_refused(spec: str) -> None:
    with pytest.raises((ValueError, KeyError), match=r"NAME@SYNC|unknown rollout fault"):
        rollout_faults.parse_spec(spec)


def test_the_previous_syncs_tensors_sent_in_their_sync_only(model_dir: Path, monkeypatch) -> None:
    llm = _engine(model_dir, monkeypatch, "previous-sync-sent@2")
    first, second, third = (_weights(llm, s) for s in (1, 2, 3))
    _sync(llm, first)
    _sync(llm, second)
    assert all(torch.equal(p, first[n]) for n, p in llm.model.named_parameters()), "the stream carried sync 1's"
    _sync(llm, third)
    assert all(torch.equal(p, third[n]) for n, p in llm.model.named_parameters()), "planted once"
    assert llm.fault.planted_in == 2


def test_export_faults_change_exactly_their_tensors(model_dir: Path) -> None:
    """What each export fault does to the stream: the bias left out, gate and up exchanged in the dense and shared
    MLPs (never the routed experts), each layer's kv_a_layernorm named with the next layer's index."""
    weights = {
        "model.layers.0.mlp.gate_proj.weight": torch.ones(2),
        "model.layers.0.mlp.up_proj.weight": torch.zeros(2),
        "model.layers.1.mlp.shared_experts.gate_proj.weight": torch.ones(2),
        "model.layers.1.mlp.shared_experts.up_proj.weight": torch.zeros(2),
        "model.layers.1.mlp.experts.0.gate_proj.weight": torch.ones(2),
        "model.layers.1.mlp.experts.0.up_proj.weight": torch.zeros(2),
        "model.layers.1.mlp.gate.e_score_correction_bias": torch.ones(2),
        "model.layers.0.self_attn.kv_a_layernorm.weight": torch.full((2,), 0.0),
        "model.layers.1.self_attn.kv_a_layernorm.weight": torch.full((2,), 1.0),
    }
    assert "model.layers.1.mlp.gate.e_score_correction_bias" not in weight_faults.without_bias(weights)
    swapped = weight_faults.gate_up_exchanged(weights)
    for prefix in ("model.layers.0.mlp.", "model.layers.1.mlp.shared_experts."):
        assert torch.equal(swapped[prefix + "gate_proj.weight"], torch.zeros(2))
    assert torch.equal(swapped["model.layers.1.mlp.experts.0.gate_proj.weight"], torch.ones(2))
    shifted = weight_faults.mla_norms_shifted(weights, 2)
    assert torch.equal(shifted["model.layers.1.self_attn.kv_a_layernorm.weight"], torch.zeros(2))
    assert torch.equal(shifted["model.layers.0.self_attn.kv_a_layernorm.weight"], torch.ones(2))


def test_mla_not_recomputed_keeps_the_previous_matrices_and_changes_the_logits(model_dir: Path, monkeypatch) -> None:
    llm = _engine(model_dir, monkeypatch, "mla-not-recomputed@2")
    reference = _engine(model_dir, monkeypatch)
    first, second = _weights(llm, 1), _weights(llm, 2)
    for engine in (llm, reference):
        _sync(engine, first)
    impl = mla_impls(llm.runner.forward_context)[0]
    kept = impl.W_UV.clone()
    for engine in (llm, reference):
        _sync(engine, second)
    assert torch.equal(impl.W_UV, kept), "the derived matrices are the first sync's"
    assert torch.equal(
        dict(llm.model.named_parameters())["model.layers.0.self_attn.kv_b_proj.weight"],
        second["model.layers.0.self_attn.kv_b_proj.weight"],
    ), "kv_b_proj itself was loaded"
    assert not torch.allclose(_logits(llm), _logits(reference)), "the engine decodes through the stale copies"
    _sync(llm, second)
    torch.testing.assert_close(_logits(llm), _logits(reference))  # the next sync re-derives them again


@pytest.mark.parametrize(
    "name", ["converter-gate-up", "converter-mla-norm", "stale-bias", "routing-ungrouped", "yarn-off"]
)
def test_every_fault_changes_the_engines_output(model_dir: Path, monkeypatch, name: str) -> None:
    llm = _engine(model_dir, monkeypatch, f"{name}@2")
    reference = _engine(model_dir, monkeypatch)
    first, weights = _weights(llm, 1), _weights(llm, 2)
    for engine in (llm, reference):
        _sync(engine, first)
        engine.generate([{"prompt_token_ids": p} for p in PROMPTS], SamplingParams(max_tokens=2, temperature=0))
        _sync(engine, weights)
    long = [list(range(3, 60))]  # yarn changes rotations that only matter further into the context
    with torch.no_grad():
        ours = llm.model(input_ids=torch.tensor(long)).logits
        theirs = reference.model(input_ids=torch.tensor(long)).logits
    assert not torch.allclose(ours, theirs, atol=1e-6), name
    assert llm.fault.planted_in == 2


def test_a_per_expert_fault_needs_a_generation_first(model_dir: Path, monkeypatch) -> None:
    llm = _engine(model_dir, monkeypatch)
    with pytest.raises(ValueError, match="sync after a generation"):
        rollout_faults.typical_expert(llm, [])


def test_sampler_unpatched_keeps_the_tokens_and_reports_raw_logit_log_probs(model_dir: Path, monkeypatch) -> None:
    """Planted in sync 2: from then on the same tokens as a healthy engine, reported with vLLM's unpatched log-probs
    (those of the logits before temperature), and the engine's record names upstream's forward."""
    from r1_ascend.patches import apply_one, spec_by_name

    apply_one(spec_by_name("verl_rollout_guard"))  # as in every rollout worker
    llm = _engine(model_dir, monkeypatch, "sampler-unpatched@2")
    reference = _engine(model_dir, monkeypatch)
    weights = _weights(llm, 1)
    params = SamplingParams(n=2, max_tokens=6, temperature=0.5, logprobs=0, ignore_eos=True)

    def generate(engine: CPUStandInLLM) -> tuple[list[list[int]], list[float]]:
        engine.generator.manual_seed(3)
        completions = [
            c for o in engine.generate([{"prompt_token_ids": p} for p in PROMPTS], params) for c in o.outputs
        ]
        return [list(c.token_ids) for c in completions], [c.cumulative_logprob for c in completions]

    for sync in (1, 2):
        for engine in (llm, reference):
            _sync(engine, weights)
        ours, theirs = generate(llm), generate(reference)
        assert ours[0] == theirs[0]
        assert (ours[1] == theirs[1]) == (sync == 1)
        assert llm.sampler_calls.take()["patched_by"] == ["verl_rollout_guard" if sync == 1 else "upstream"]
    raw = _logits(llm)[0, len(PROMPTS[0]) - 1].log_softmax(-1)
    scaled = (_logits(llm)[0, len(PROMPTS[0]) - 1] / 0.5).log_softmax(-1)
    first = llm.generate([{"prompt_token_ids": PROMPTS[0]}], params)[0].outputs[0]
    token = first.token_ids[0]
    assert first.logprobs[0][token].logprob == pytest.approx(float(raw[token]), abs=1e-5)
    assert float(raw[token]) != pytest.approx(float(scaled[token]), abs=1e-3)


IN_VLLM = sorted(
    name for name, f in rollout_faults.FAULTS.items() if f.where == "loader" or f.name.startswith("expert-")
)


def test_a_fault_of_vllms_loader_or_parameters_says_it_needs_vllms_model(model_dir: Path, monkeypatch) -> None:
    """Planted in vLLM's own load_weights or parameters: an engine built without vLLM's model (no torch.distributed
    world) cannot carry it, and says so instead of loading healthy weights. Planted in vLLM's model: tests/model/
    test_vllm_deepseek_load.py and test_weight_sync_check.py; judged by the guard: test_rollout_guard_faults.py."""
    llm = _engine(model_dir, monkeypatch)
    weights = _weights(llm, 1)
    _sync(llm, weights)
    llm.generate([{"prompt_token_ids": p} for p in PROMPTS], SamplingParams(max_tokens=2, temperature=0))
    assert llm.model.vllm_loader.model is None
    for name in IN_VLLM:
        with pytest.raises(rollout_faults.RolloutFaultError, match="R1_ASCEND_ROLLOUT_VLLM_LOADER"):
            rollout_faults.sync(llm, weights, fault=rollout_faults.get(name), probe=PROMPTS)
        assert llm.model.vllm_loader.change is None, name
    assert len(IN_VLLM) >= 10, IN_VLLM
