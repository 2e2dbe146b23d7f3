"""The vLLM backend at its boundary: ``r1-ascend evaluate --backend vllm`` with ``vllm.LLM`` replaced by a subclass
that records its construction and keeps vLLM 0.9.1's own ``generate`` (request building, ``use_tqdm`` progress,
output ordering) over a recording engine. vLLM has no CPU backend, so nothing below the engine runs here."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import pytest
import yaml

from r1_ascend.evaluate import generation as gen
from r1_ascend.evaluate import vllm_backend
from r1_ascend.evaluate.cli import main
from r1_ascend.evaluate.problems import read_problems
from r1_ascend.evaluate.prompts import load_tokenizer, prompt_ids
from r1_ascend.launch.model_info import ModelInfo

from .conftest import SETS, boxed, user_text


class RecordingEngine:
    """Stands in for vLLM's LLMEngine: records each added request, finishes them all in one step with the
    scripted answer (its problem's right answer) for every sample."""

    model_config = type("ModelConfig", (), {"runner_type": "generate"})()

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.added: list[tuple[str, dict, object]] = []
        self.pending: list[tuple[str, dict, object]] = []

    @classmethod
    def validate_outputs(cls, outputs, output_type):
        return outputs

    def add_request(self, request_id, prompt, params, **_):
        self.added.append((request_id, prompt, params))
        self.pending.append((request_id, prompt, params))

    def get_num_unfinished_requests(self) -> int:
        return len(self.pending)

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def step(self):
        from vllm.outputs import CompletionOutput, RequestOutput

        answers = {user_text(p): a for rows in SETS.values() for p, a in rows}
        outputs = []
        for request_id, prompt, params in reversed(self.pending):  # out of order: vLLM sorts by request id
            text = self.tokenizer.decode(prompt["prompt_token_ids"])
            answer = next(a for u, a in answers.items() if u in text)
            ids = [*self.tokenizer.encode(boxed(answer), add_special_tokens=False), self.tokenizer.eos_token_id]
            samples = [CompletionOutput(j, "", ids, None, None, "stop") for j in reversed(range(params.n))]
            outputs.append(RequestOutput(request_id, None, prompt["prompt_token_ids"], None, samples, True))
        self.pending = []
        return outputs


@pytest.fixture
def recording_llm(monkeypatch: pytest.MonkeyPatch, tiny_hf: Path) -> list:
    """``vllm.LLM`` replaced; the list receives each instance (its ``kwargs`` and ``llm_engine``)."""
    import vllm
    from vllm.utils import Counter

    made = []

    class RecordingLLM(vllm.LLM):
        def __init__(self, **kwargs) -> None:  # vLLM's engine start-up is what cannot run on CPU
            self.kwargs = kwargs
            self.llm_engine = RecordingEngine(load_tokenizer(tiny_hf))
            self.engine_class = RecordingEngine
            self.request_counter = Counter()
            made.append(self)

    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    return made


def test_the_request_is_what_the_options_say(tiny_hf, val_parquet, recording_llm, tmp_path: Path, capsys) -> None:
    data = val_parquet()
    out = tmp_path / "eval"
    argv = [str(tiny_hf), "--data", str(data), "--output-dir", str(out), "--backend", "vllm", "--samples", "3"]
    argv += ["--temperature", "0.7", "--top-p", "0.9", "--max-new-tokens", "100", "--seed", "11"]
    argv += ["--tensor-parallel-size", "2", "--vllm-kwargs", '{"enforce_eager": true}']
    assert main(argv) == 0
    (llm,) = recording_llm
    tokenizer = load_tokenizer(tiny_hf)
    problems = read_problems([data])
    expected_prompts = [prompt_ids(tokenizer, p) for ps in problems.values() for p in ps]
    longest = max(len(ids) for ids in expected_prompts)

    assert llm.kwargs["model"] == str(tiny_hf)
    assert llm.kwargs["tensor_parallel_size"] == 2
    assert llm.kwargs["seed"] == 11
    assert llm.kwargs["dtype"] == "bfloat16"
    assert llm.kwargs["max_model_len"] == llm.kwargs["max_num_batched_tokens"] == longest + 100
    assert llm.kwargs["enable_expert_parallel"] is True  # the tiny model is MoE
    assert llm.kwargs["distributed_executor_backend"] == "ray"  # TP 2 > the 0 NPUs of this machine
    assert llm.kwargs["enforce_eager"] is True  # --vllm-kwargs

    added = llm.llm_engine.added
    assert [prompt["prompt_token_ids"] for _, prompt, _ in added] == expected_prompts
    seeds = [11 + index * 3 for rows in SETS.values() for index in range(len(rows))]  # seed + problem index * n
    assert [params.seed for _, _, params in added] == seeds
    for _, _, params in added:
        assert (params.n, params.temperature, params.top_p, params.max_tokens) == (3, 0.7, 0.9, 100)
        assert params.top_k in (-1, 0)  # vLLM 0.9.1 stores "off" as 0

    # the engine's answers come back in request order: every sample right
    doc = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    assert [(s["name"], s["pass@1"], s["correct_samples"]) for s in doc["sets"]] == [
        ("aime24", 1.0, 9),
        ("amc", 1.0, 6),
        ("math500", 1.0, 3),
    ]
    assert doc["engine"]["kwargs"]["tensor_parallel_size"] == 2
    progress = capsys.readouterr().err
    assert "aime24: 9/9 samples (100%)" in progress  # vLLM's own loop drove the progress line
    assert "vLLM memory plan: TP 2: " in progress


def test_default_tp_is_this_nodes_npus_and_ray_only_beyond_them(tiny_hf) -> None:
    info = ModelInfo(tiny_hf, json.loads((tiny_hf / "config.json").read_text(encoding="utf-8")))
    spec = gen.BackendSpec(tiny_hf, None, 0, 4096)
    kwargs = vllm_backend.engine_kwargs(spec, info, local_devices=16)
    assert kwargs["tensor_parallel_size"] == 16
    assert "distributed_executor_backend" not in kwargs
    wide = vllm_backend.engine_kwargs(gen.BackendSpec(tiny_hf, None, 0, 4096, tensor_parallel_size=32), info, 16)
    assert wide["distributed_executor_backend"] == "ray"
    dense = ModelInfo(tiny_hf, {**info.config, "n_routed_experts": 0})
    assert "enable_expert_parallel" not in vllm_backend.engine_kwargs(spec, dense, 16)


def test_engine_settings_are_the_671b_rollouts() -> None:
    """The Ascend settings mirror the 671B run's rollout engine (its config file), so they cannot drift apart."""
    text = files("r1_ascend.recipe").joinpath("config", "grpo_deepseekv3_671b.yaml").read_text(encoding="utf-8")
    rollout = yaml.safe_load(text)["actor_rollout_ref"]["rollout"]
    run = dict(rollout["engine_kwargs"]["vllm"]["additional_config"])
    run.pop("refresh")
    assert vllm_backend.additional_config(rollout["max_num_seqs"]) == run
    assert rollout["max_num_seqs"] == vllm_backend.MAX_NUM_SEQS
    assert rollout["engine_kwargs"]["vllm"]["enable_expert_parallel"] is True
    assert rollout["enable_prefix_caching"] is False
    assert rollout["enable_chunked_prefill"] is False


def _deepseek_v3() -> ModelInfo:
    from r1_ascend.launch.smoke_model import DEEPSEEK_V3_DIMS
    from r1_ascend.weights.tiny import deepseek_v3_config

    config = deepseek_v3_config(
        **DEEPSEEK_V3_DIMS, num_hidden_layers=61, first_k_dense_replace=3, n_routed_experts=256, n_shared_experts=1
    )
    return ModelInfo(None, config)


def test_671b_in_bf16_does_not_fit_one_node_and_the_error_names_tp_32() -> None:
    """671.03 B parameters x 2 bytes = 1250 GiB: 78.1 GiB per die at TP 16 (one A3 node) against a 57.6 GiB share of
    64 GiB; TP 32 (two nodes) leaves room for KV cache."""
    v3 = _deepseek_v3()
    assert v3.total_params() == 671_026_419_200
    one_node = vllm_backend.memory_plan(v3, 16, 0.9)
    assert one_node.weights_gib == pytest.approx(671_026_419_200 * 2 / 16 / 1024**3)
    with pytest.raises(vllm_backend.EngineConfigError, match=r"use --tensor-parallel-size 32 or more"):
        vllm_backend.check_fits(one_node, v3)
    two_nodes = vllm_backend.memory_plan(v3, 32, 0.9)
    vllm_backend.check_fits(two_nodes, v3)
    # MLA caches (512 + 64) values x 61 layers x 2 bytes per token, on every TP rank
    assert two_nodes.kv_bytes_per_token == 576 * 61 * 2
    assert two_nodes.kv_tokens == int((0.9 * 64 - 671_026_419_200 * 2 / 32 / 1024**3) * 1024**3 // (576 * 61 * 2))


def test_without_the_npu_stack_the_error_points_to_the_cpu_backend(tiny_hf, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError, as without torch_npu
    with pytest.raises(vllm_backend.EngineConfigError, match="use --backend transformers"):
        vllm_backend.VllmBackend(gen.BackendSpec(tiny_hf, None, 0, 4096, tensor_parallel_size=1))
