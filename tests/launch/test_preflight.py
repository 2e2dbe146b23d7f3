"""Every preflight check: passes on the valid smoke inputs, and fails with its own message on a violation,
including the misconfigurations earlier recipes shipped with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from r1_ascend.launch.checks import ERROR
from r1_ascend.launch.overlays import DEFAULT_OVERLAY, SMOKE_OVERLAY
from r1_ascend.launch.preflight import main, run_checks
from r1_ascend.launch.quickstart import SMOKE_ENV


def _findings(inputs, *extra, env=SMOKE_ENV, config=SMOKE_OVERLAY, paths=None, **kwargs):
    overrides = [*inputs.overrides(**(paths or {})), *extra]
    return run_checks(config, overrides, env=env, **kwargs)


def _errors(findings, check):
    return [f.message for f in findings if f.level == ERROR and f.check == check]


def test_valid_smoke_inputs_pass_every_check(smoke_inputs):
    run, findings = _findings(smoke_inputs)
    assert [f for f in findings if f.level == ERROR] == []
    checks = {f.check for f in findings}
    assert {"paths", "world_size", "vllm_dp_size", "pipeline_split", "expert_parallel", "batch_sizes"} <= checks
    assert {"recipe_config", "rollout_engine", "context_length", "model_config", "data", "checkpoint"} <= checks
    assert {"patches", "memory", "trainer"} <= checks
    assert run.stages == [2, 2]
    assert (run.train.dp, run.rollout.dp, run.rollout.ep) == (8, 8, 16)


def test_paths_must_be_set(smoke_inputs):
    _, findings = _findings(smoke_inputs, "actor_rollout_ref.model.path=null")
    assert "actor_rollout_ref.model.path (env MODEL_PATH)" in _errors(findings, "paths")[0]


def test_world_size_must_match_the_cluster(smoke_inputs):
    _, findings = _findings(smoke_inputs, env={"NNODES": "2", "NPUS_PER_NODE": "16"})
    assert "the cluster is NNODES x NPUS_PER_NODE = 2 x 16 = 32" in _errors(findings, "world_size")[0]


def test_hard_coded_vllm_dp_size_128_on_another_world_is_refused(smoke_inputs):
    # r1_ascend's start script exported VLLM_DP_SIZE=128 whatever the cluster size.
    _, findings = _findings(smoke_inputs, env={**SMOKE_ENV, "VLLM_DP_SIZE": "128"})
    message = _errors(findings, "vllm_dp_size")[0]
    assert "VLLM_DP_SIZE=128" in message
    assert "= DP 8" in message


def test_vllm_dp_size_equal_to_world_over_tp_passes(smoke_inputs):
    _, findings = _findings(smoke_inputs, env={**SMOKE_ENV, "VLLM_DP_SIZE": "8"})
    assert _errors(findings, "vllm_dp_size") == []


def test_rollout_tp_must_divide_the_world(smoke_inputs):
    _, findings = _findings(smoke_inputs, "actor_rollout_ref.rollout.tensor_model_parallel_size=3")
    assert "not divisible by rollout tensor_model_parallel_size 3" in _errors(findings, "vllm_dp_size")[0]


def test_mindspeed_layer_split_must_sum_to_the_model_layers(smoke_inputs):
    otc = "actor_rollout_ref.actor.megatron.override_transformer_config"
    _, findings = _findings(smoke_inputs, f"{otc}.pipeline_num_transformer_layers=[[2],[3]]")
    assert "sum 5" in _errors(findings, "pipeline_split")[0]


def test_megatron_split_with_both_ends_on_two_stages_is_refused(smoke_inputs):
    otc = "actor_rollout_ref.actor.megatron.override_transformer_config"
    _, findings = _findings(smoke_inputs, f"+{otc}.num_layers_in_last_pipeline_stage=2")
    assert "divides by zero" in _errors(findings, "pipeline_split")[0]


def test_uneven_split_that_does_not_fit_is_refused(smoke_inputs):
    otc = "actor_rollout_ref.actor.megatron.override_transformer_config"
    _, findings = _findings(smoke_inputs, f"{otc}.num_layers_in_first_pipeline_stage=4")
    assert "leave 0 layers for 1 middle stages" in _errors(findings, "pipeline_split")[0]


def test_actor_ep_must_divide_the_experts_and_the_world(smoke_inputs):
    _, findings = _findings(smoke_inputs, "actor_rollout_ref.actor.megatron.expert_model_parallel_size=3")
    message = _errors(findings, "expert_parallel")[0]
    assert "does not divide the 16 experts" in message
    assert "PP x EP x expert-TP = 2 x 3 x 1" in message


def test_rollout_ep_must_divide_the_experts(smoke_inputs, tmp_path, model_factory):
    model = model_factory(tmp_path / "m", n_routed_experts=24)
    _, findings = _findings(smoke_inputs, paths={"model": str(model)})
    assert (
        "rollout EP = TP x VLLM_DP_SIZE = 16 does not divide the 24 experts" in _errors(findings, "expert_parallel")[0]
    )


def test_batch_must_divide_by_dp_and_micro_batch(smoke_inputs):
    _, findings = _findings(smoke_inputs, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3")
    assert "actor DP 8 x ppo_micro_batch_size_per_gpu 3 = 24" in _errors(findings, "batch_sizes")[0]


def test_batch_must_divide_by_the_rollout_dp(smoke_inputs):
    _, findings = _findings(
        smoke_inputs,
        "data.train_batch_size=6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=6",
        "actor_rollout_ref.rollout.n=2",
    )
    messages = " ".join(_errors(findings, "batch_sizes"))
    assert "12 sequences are not divisible by the rollout DP size 8" in messages


def test_async_rollout_mode_is_refused(smoke_inputs):
    # The merged r1_ascend recipe ran with verl's async default: no patch took effect, silently.
    _, findings = _findings(smoke_inputs, "actor_rollout_ref.rollout.mode=async")
    assert "actor_rollout_ref.rollout.mode='async'" in _errors(findings, "recipe_config")[0]


def test_batched_tokens_below_model_length_without_chunked_prefill_is_refused(smoke_inputs, tmp_path, model_factory):
    # Earlier recipes: max_num_batched_tokens=1024 with prompt 1024 + response 3072 under the Ascend scheduler.
    model = model_factory(tmp_path / "m", max_position_embeddings=8192)
    otc = "actor_rollout_ref.actor.megatron.override_transformer_config"
    _, findings = _findings(
        smoke_inputs,
        "data.max_prompt_length=1024",
        "data.max_response_length=3072",
        f"{otc}.seq_length=4096",
        "actor_rollout_ref.rollout.max_num_batched_tokens=1024",
        paths={"model": str(model)},
    )
    message = _errors(findings, "rollout_engine")[0]
    assert "max_num_batched_tokens (1024) is smaller than max_model_len (4096)" in message


def test_chunked_prefill_in_the_ascend_scheduler_allows_small_batches(smoke_inputs):
    sched = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.ascend_scheduler_config"
    _, findings = _findings(
        smoke_inputs, "actor_rollout_ref.rollout.max_num_batched_tokens=512", f"+{sched}.enable_chunked_prefill=true"
    )
    assert _errors(findings, "rollout_engine") == []


def test_enforce_eager_with_graph_mode_is_refused(smoke_inputs):
    _, findings = _findings(smoke_inputs, "actor_rollout_ref.rollout.enforce_eager=true")
    assert "enforce_eager=True" in _errors(findings, "rollout_engine")[0]


ENGINE = "actor_rollout_ref.rollout.engine_kwargs.vllm"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        # DeepSeek without TorchAir and without eager: vllm-ascend 0.9.1 raises "ACL Graph does not support deepseek"
        (f"{ENGINE}.additional_config.torchair_graph_config.enabled=false", "ACL Graph does not support deepseek"),
        (f"{ENGINE}.additional_config.torchair_graph_config.graph_batch_sizes=[4]", "does not contain max_num_seqs"),
        (f"{ENGINE}.enable_expert_parallel=false", "enable_expert_parallel is not true"),
        (f"{ENGINE}.additional_config.refresh=false", "additional_config.refresh is not true"),
    ],
)
def test_engine_options_vllm_ascend_would_reject_are_refused(smoke_inputs, override, expected):
    _, findings = _findings(smoke_inputs, override)
    assert any(expected in message for message in _errors(findings, "rollout_engine")), findings


def test_graph_modes_that_keep_parameter_addresses_are_refused(smoke_inputs):
    """The offloading rollout re-allocates weights: TorchAir needs the live-params patch and no cached graphs."""
    env = {**SMOKE_ENV, "R1_ASCEND_DISABLE": "vllm_ascend_torchair_live_params"}
    _, findings = _findings(smoke_inputs, env=env)
    assert any("frozen parameters" in m for m in _errors(findings, "rollout_engine"))
    cached = f"{ENGINE}.additional_config.torchair_graph_config.use_cached_graph=true"
    _, findings = _findings(smoke_inputs, cached)
    assert any("use_cached_graph=true" in m for m in _errors(findings, "rollout_engine"))


def test_rollout_guard_without_rollout_log_probs_is_refused(smoke_inputs):
    _, findings = _findings(smoke_inputs, "actor_rollout_ref.rollout.calculate_log_probs=false")
    assert any("calculate_log_probs=true" in m for m in _errors(findings, "rollout_engine"))
    _, findings = _findings(
        smoke_inputs, "actor_rollout_ref.rollout.calculate_log_probs=false", "r1_ascend.rollout_guard.enabled=false"
    )
    assert _errors(findings, "rollout_engine") == []


def test_dp_requirements_follow_the_dp_patch_switch(smoke_inputs):
    """refresh / expert parallel are needed for the DP/EP groups patch, not when it is switched off."""
    override = f"{ENGINE}.additional_config.refresh=false"
    _, findings = _findings(smoke_inputs, override, env={**SMOKE_ENV, "R1_ASCEND_DISABLE": "vllm_dp_ep_groups"})
    assert not any("refresh is not true" in m for m in _errors(findings, "rollout_engine"))


def test_free_cache_engine_off_is_refused(smoke_inputs):
    _, findings = _findings(smoke_inputs, "actor_rollout_ref.rollout.free_cache_engine=false")
    assert any("free_cache_engine" in m for m in _errors(findings, "recipe_config"))


def test_sequence_longer_than_the_model_context_is_refused(smoke_inputs):
    limit = json.loads((smoke_inputs.model / "config.json").read_text(encoding="utf-8"))["max_position_embeddings"]
    _, findings = _findings(smoke_inputs, f"data.max_response_length={limit}")
    assert f"exceeds the model's max_position_embeddings {limit}" in _errors(findings, "context_length")[0]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"num_nextn_predict_layers": 1}, "num_nextn_predict_layers=1"),
        ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
    ],
)
def test_model_config_must_have_mtp_off_and_no_quantization(smoke_inputs, tmp_path, model_factory, override, expected):
    model = model_factory(tmp_path / "m", **override)
    _, findings = _findings(smoke_inputs, paths={"model": str(model)})
    assert expected in _errors(findings, "model_config")[0]


def test_missing_model_directory_is_reported(smoke_inputs, tmp_path):
    _, findings = _findings(smoke_inputs, paths={"model": str(tmp_path / "nope")})
    assert "does not exist" in _errors(findings, "model_config")[0]


def test_missing_data_file_is_reported(smoke_inputs, tmp_path):
    _, findings = _findings(smoke_inputs, paths={"train": str(tmp_path / "train.parquet")})
    assert "does not exist" in _errors(findings, "data")[0]


def test_data_without_the_verl_schema_is_reported(smoke_inputs, tmp_path):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"data_source": ["x"] * 20, "question": ["1+1"] * 20}), bad)
    _, findings = _findings(smoke_inputs, paths={"train": str(bad)})
    messages = " ".join(_errors(findings, "data"))
    assert "no column 'prompt'" in messages
    assert "reward_model" in messages


def test_train_data_smaller_than_a_batch_is_reported(smoke_inputs):
    _, findings = _findings(
        smoke_inputs, "data.train_batch_size=512", "actor_rollout_ref.actor.ppo_mini_batch_size=512"
    )
    assert "fewer than one batch" in _errors(findings, "data")[0]


def test_missing_checkpoint_directory_is_reported(smoke_inputs, tmp_path):
    _, findings = _findings(smoke_inputs, paths={"ckpt": str(tmp_path / "none")})
    assert "does not exist" in _errors(findings, "checkpoint")[0]


def test_incomplete_checkpoint_is_reported(smoke_inputs, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr"}))
    _, findings = _findings(smoke_inputs, paths={"ckpt": str(ckpt)})
    message = _errors(findings, "checkpoint")[0]
    assert "missing .metadata" in message
    assert "'zarr'" in message
    assert "no *.distcp" in message


def test_checkpoint_of_another_model_is_reported(smoke_inputs, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for name in ("metadata.json", ".metadata", "common.pt", "__0_0.distcp"):
        (ckpt / name).write_bytes((smoke_inputs.ckpt / name).read_bytes())
    (ckpt / ".r1-ascend-to-megatron.json").write_text(json.dumps({"layout": [1, 8, 32, [6, 8, 8, 8, 8, 8, 8, 7]]}))
    _, findings = _findings(smoke_inputs, paths={"ckpt": str(ckpt)})
    assert "converted for 61 decoder layers but the model has 4" in _errors(findings, "checkpoint")[0]


def test_checkpoint_whose_keys_name_other_layers_is_reported(smoke_inputs, tmp_path):
    """No manifest layer list (converted without --pp-layers, or by another tool): the keys tell the layer count."""
    import pickle

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for name in ("metadata.json", "common.pt", "__0_0.distcp"):
        (ckpt / name).write_bytes((smoke_inputs.ckpt / name).read_bytes())
    keys = {f"decoder.layers.{i}.self_attention.linear_proj.weight": i for i in range(3)}
    (ckpt / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": keys, "embedding.word_embeddings": 0}))
    _, findings = _findings(smoke_inputs, paths={"ckpt": str(ckpt)})
    message = _errors(findings, "checkpoint")[0]
    assert "name 3 decoder layers (decoder.layers.0..2) but the model has 4" in message
    assert "not a complete" not in message
    keys = {f"decoder.layers.{i}.self_attention.linear_proj.weight": i for i in range(4)}
    (ckpt / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": keys}))
    _, findings = _findings(smoke_inputs, paths={"ckpt": str(ckpt)})
    assert _errors(findings, "checkpoint") == []


def test_unresolvable_patch_target_is_reported(smoke_inputs, monkeypatch):
    from r1_ascend.patches import source_check

    real = source_check.module_source_path
    monkeypatch.setattr(source_check, "module_source_path", lambda m: None if m.startswith("vllm.v1") else real(m))
    _, findings = _findings(smoke_inputs)
    assert "vllm_engine_kv_cache_configs" in _errors(findings, "patches")[0]


def test_missing_reward_file_is_reported(smoke_inputs):
    _, findings = _findings(smoke_inputs, "custom_reward_function.path=/nonexistent/reward.py")
    assert "does not exist" in _errors(findings, "trainer")[0]


def test_memory_over_the_die_is_reported(smoke_inputs, tmp_path, model_factory):
    from r1_ascend.launch.smoke_model import DEEPSEEK_V3_DIMS

    model = model_factory(
        tmp_path / "dsv3", **DEEPSEEK_V3_DIMS, num_hidden_layers=61, first_k_dense_replace=3, n_routed_experts=256
    )
    mega = "actor_rollout_ref.actor.megatron"
    env = {"NNODES": "16", "NPUS_PER_NODE": "16"}
    ok_run, ok = _findings(smoke_inputs, config=DEFAULT_OVERLAY, env=env, paths={"model": str(model)})
    assert _errors(ok, "memory") == []
    assert [p.phase for p in ok_run.memory] == ["rollout", "update"]
    _, findings = _findings(
        smoke_inputs,
        f"{mega}.param_offload=false",
        f"{mega}.override_transformer_config.swap_optimizer=false",
        f"{mega}.override_transformer_config.recompute_granularity=null",
        config=DEFAULT_OVERLAY,
        env=env,
        paths={"model": str(model)},
    )
    assert any("update" in m and "per die of 59.6 GiB" in m for m in _errors(findings, "memory"))


def test_cli_exit_codes_and_output(smoke_inputs, capsys):
    assert main(["--config", SMOKE_OVERLAY, *smoke_inputs.overrides()]) == 0
    out = capsys.readouterr().out
    assert "Plan" in out
    assert "Memory per die" in out
    assert "preflight: passed" in out
    assert main(["--config", SMOKE_OVERLAY, *smoke_inputs.overrides(), "actor_rollout_ref.rollout.mode=async"]) == 1
    assert main(["--config", "no_such_config"]) == 1


def test_cli_prints_the_guards_levels_in_force(smoke_inputs, capsys):
    """The caps, floors and factors of every gated statistic, the calibration length and the escalation count, as
    the config sets them (here changed on the command line)."""
    from r1_ascend.patches.rules import rollout_guard as guard

    changed = [
        "+r1_ascend.rollout_guard.calibration.steps=7",
        "+r1_ascend.rollout_guard.escalate_after=2",
        "r1_ascend.rollout_guard.stop.kl_k3=0.04",
    ]
    assert main(["--config", SMOKE_OVERLAY, *smoke_inputs.overrides(), *changed]) == 0
    out = capsys.readouterr().out.splitlines()
    start = out.index("Rollout guard (r1_ascend.rollout_guard; docs/rollout_guard.md)")
    rows = {line.split()[0]: line.split()[1:] for line in out[start + 2 : start + 2 + len(guard.GATED)]}
    assert set(rows) == set(guard.GATED)
    assert rows["kl_k3"] == [
        f"{v:g}"
        for v in (
            guard.DEFAULT_WARN["kl_k3"],
            0.04,
            guard.DEFAULT_FLOOR["kl_k3"],
            guard.DEFAULT_WARN_FACTOR["kl_k3"],
            guard.DEFAULT_STOP_FACTOR["kl_k3"],
        )
    ]
    tail = out[start + 2 + len(guard.GATED) :]
    assert tail[0].startswith("  calibration: the first 7 healthy step(s)")
    assert tail[1] == "  escalation: 2 warned steps in a row stop the run"
    assert "compared with the actor's when the engine is built" in tail[2]


def test_cli_imports_no_heavy_stack(smoke_inputs):
    """The upstream checks run verl's config code without ``import verl`` (torch); the time is benchmarked in
    benchmarks/preflight_bench.py, not asserted here."""
    code = (
        "import sys; from r1_ascend.launch.preflight import main; "
        f"rc = main(['--config', {SMOKE_OVERLAY!r}, *{smoke_inputs.overrides()!r}]); "
        "heavy = [m for m in ('torch', 'ray', 'verl', 'vllm', 'vllm_ascend', 'megatron') if m in sys.modules]; "
        "assert not heavy, heavy; sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_resume_from_a_truncated_latest_checkpoint_is_reported(smoke_inputs, tmp_path):
    """The rule the trainer enforces at resume (patch verl_checkpoint_integrity) runs in preflight too."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "patches"))
    import checkpoint_fakes as fakes

    root = tmp_path / "checkpoints"
    fakes.write_step(root, 2)
    _, findings = _findings(smoke_inputs, f"trainer.default_local_dir={root}")
    assert _errors(findings, "checkpoint") == []
    assert any(f"resumes from {root / 'global_step_2'} (complete)" in f.message for f in findings)
    fakes.truncate(fakes.shard(fakes.write_step(root, 4)))
    _, findings = _findings(smoke_inputs, f"trainer.default_local_dir={root}")
    message = _errors(findings, "checkpoint")[0]
    assert "names step 4" in message
    assert "truncated" in message
    assert f"trainer.resume_from_path={root / 'global_step_2'}" in message
    _, findings = _findings(smoke_inputs, f"trainer.default_local_dir={root}", "trainer.resume_mode=disable")
    assert _errors(findings, "checkpoint") == []
