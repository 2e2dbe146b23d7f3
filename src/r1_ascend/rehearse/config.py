"""The rehearsal's run configuration: the smoke config (grpo_deepseekv3_smoke) with a few overrides, built here only.

Every difference from the smoke config is listed in :func:`overrides` with its reason; extend the rehearsal by
adding to that list (e.g. a guard's ``+r1_ascend.<key>=...`` switch or ``actor_rollout_ref.rollout.*`` options).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from r1_ascend import envs
from r1_ascend.patches.rules.rollout_guard import GuardConfig
from r1_ascend.rehearse.inputs import Inputs

#: TransformerConfig overrides a CPU actor needs (verl passes ``override_transformer_config`` through): build on the
#: CPU (verl's converter sets use_cpu_initialization False), and no fused CUDA kernels.
CPU_TRANSFORMER_OVERRIDES: dict[str, bool] = {
    "use_cpu_initialization": True,
    "masked_softmax_fusion": False,
    "persist_layer_norm": False,
    "bias_activation_fusion": False,
    "bias_dropout_fusion": False,
    "apply_rope_fusion": False,
    "gradient_accumulation_fusion": False,
}

CONFIG_NAME = "grpo_deepseekv3_smoke"
STANDINS_MODULE = "r1_ascend.rehearse.worker_hooks"


#: The run configuration whose rollout guard settings the rehearsal runs with: the 671B run's (the smoke config's
#: are the same, tests/patches/test_verl_rollout_guard.py), its absolute levels as caps and the levels it calibrates
#: from its own first steps (docs/rollout_guard.md "Levels"); no CPU-only levels.
GUARD_CONFIG_NAME = "grpo_deepseekv3_671b"


def guard_config() -> GuardConfig:
    """The shipped guard settings the rehearsal runs with (``GUARD_CONFIG_NAME``), as the guard reads them."""
    from omegaconf import OmegaConf

    from r1_ascend.launch.overlays import overlay_path

    return GuardConfig.from_config(OmegaConf.load(overlay_path(GUARD_CONFIG_NAME)))


@dataclass(frozen=True)
class Plan:
    """What the rehearsal runs: cluster shape and schedule (checkpoint every ``save_freq`` steps)."""

    nodes: int = 2
    npus_per_node: int = 1
    total_steps: int = 10
    save_freq: int = 5
    test_freq: int = 5
    prompts_per_step: int = 8
    samples_per_prompt: int = 8
    response_length: int = 8
    actor_ep: int = 2
    #: the actor's pipeline stages (megatron-core PP; the world divided by it is the actor's data parallelism)
    actor_pp: int = 1
    #: the rollout's data-parallel engines (vLLM DP: TP = world / DP, EP over every rollout rank); above 1 the
    #: overlay's vllm_dp_ep_groups builds vLLM's DP and EP groups across the engines
    rollout_dp: int = 1
    lr: float = 3e-3
    #: megatron-core's moe_router_bias_update_rate (verl's DeepSeek-V3 converter: 0.001; see overrides())
    bias_update_rate: float = 0.05
    #: trainer.max_actor_ckpt_to_keep (None: every checkpoint of the run is kept)
    max_ckpt_to_keep: int | None = None
    #: the mean reward of the last 3 steps must exceed that of the first 3 by this much (None: not checked)
    min_reward_rise: float | None = 0.25
    #: seeds the data order, the actor's Megatron RNG and the rollout's sampling (None: the configs' own seeds)
    seed: int | None = None
    #: ``NAME@SYNC``: the CPU rollout engine plants that fault (r1_ascend.rehearse.rollout_faults); None: none
    rollout_fault: str | None = None
    #: a rollout fault of the engine's configuration: the run's engine is built with its ``hf_overrides``; None: none
    engine_fault: str | None = None
    #: ``dead-expert@LAYER:EXPERT``: the actor's and reference's model get that fault once loaded; None: none
    actor_fault: str | None = None
    #: the trainer permutes each training batch's rewards across its responses (a control that must not learn)
    shuffle_rewards: bool = False
    #: ``STAGE@STEP``: the workers wait on entering that stage of that step until the process fault is planted
    #: (R1_ASCEND_REHEARSE_HOLD); None: no wait
    hold_at: str | None = None
    #: Hydra overrides on top of the rehearsal's own (``rehearse --fault NAME key=value ...``), e.g. a feature off
    overrides: tuple[str, ...] = ()

    @property
    def world(self) -> int:
        return self.nodes * self.npus_per_node

    @property
    def sequences_per_rank(self) -> int:
        """The sequences of one step each actor data-parallel rank trains on (the world / the pipeline stages)."""
        return max(1, self.prompts_per_step * self.samples_per_prompt // (self.world // self.actor_pp))


#: The batch of a run that plants a checkpoint, process or MoE fault: what it checks (the stop, its message, the
#: resume, an expert without tokens) needs no learning, and a quarter of the sequences makes each of its steps about
#: half as long (the weight sync and the device-side bookkeeping stay).
FAULT_BATCH = {"prompts_per_step": 4, "samples_per_prompt": 4}


def node_ip(index: int) -> str:
    """The loopback address of simulated node ``index`` (the head is node 0)."""
    return f"127.0.0.{index + 2}"


#: The watchdog's settings in the rehearsal: 6 missed heartbeats (a loaded 2-core host delays a beat by seconds)
#: and a stage limit 10x the longest stage of a healthy rehearsal (the first init_model, about a minute).
WATCHDOG = {"silence_s": 30, "stage_s": 600, "poll_s": 2}


def overrides(plan: Plan, inputs: Inputs, out: Path) -> list[str]:
    """Hydra overrides on top of the smoke config (each line: what and why)."""
    world = plan.world
    return [
        # inputs made by the rehearsal: the quickstart's converted smoke checkpoint and the toy task
        f"actor_rollout_ref.model.path={inputs.model}",
        f"actor_rollout_ref.actor.megatron.dist_checkpointing_path={inputs.dist_ckpt}",
        f"data.train_files={inputs.parquet('train')}",
        f"data.val_files={inputs.parquet('val')}",
        "custom_reward_function.path=pkg://r1_ascend.rehearse.toy_task",
        # cluster: NODES x NPUS_PER_NODE fake NPUs instead of one 16-die node
        f"trainer.nnodes={plan.nodes}",
        f"trainer.n_gpus_per_node={plan.npus_per_node}",
        # layouts that fit the small world: actor EP 2 (the alltoall dispatcher over gloo), PP 1 unless asked (the
        # layers split evenly over the stages); rollout TP = world / rollout DP (DP 1: one vLLM instance, the DP/EP
        # groups patch exports VLLM_DP_SIZE=1; DP > 1: it builds vLLM's DP and EP groups over gloo)
        f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={plan.actor_pp}",
        f"actor_rollout_ref.actor.megatron.expert_model_parallel_size={plan.actor_ep}",
        "~actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage",
        "~actor_rollout_ref.actor.megatron.override_transformer_config.pipeline_num_transformer_layers",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={world // plan.rollout_dp}",
        # megatron-core on the CPU: build on the host, no CUDA fusions (r1_ascend.cpu.mcore); activation
        # recompute restores CUDA RNG states, so it is off
        # (verl's reference config takes the actor's override_transformer_config)
        *(
            f"+actor_rollout_ref.actor.megatron.override_transformer_config.{key}={str(value).lower()}"
            for key, value in CPU_TRANSFORMER_OVERRIDES.items()
        ),
        "~actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity",
        "~actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method",
        "~actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers",
        # the toy task learns in ten steps at this rate (benchmarks/toy_task_bench.py sized it)
        f"actor_rollout_ref.actor.optim.lr={plan.lr}",
        # the expert bias must keep the routing balanced against what this lr does to the hidden states: Adam moves
        # every weight by about lr per step, 3000 times the 671B config's 1e-6, and at verl's 0.001 the bias fell
        # behind (an expert-parallel rank down to 7 % of a layer's tokens once the policy had converged); at 0.05
        # every rank kept at least a fifth in every layer and step (docs/launch.md, "Toy task")
        "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_bias_update_rate="
        f"{plan.bias_update_rate}",
        # host offload of parameters and grads: device memory management, nothing to gain on the host
        "actor_rollout_ref.actor.megatron.param_offload=false",
        "actor_rollout_ref.actor.megatron.grad_offload=false",
        "actor_rollout_ref.ref.megatron.param_offload=false",
        # minutes, not hours: a small batch, short responses, a few steps
        f"data.train_batch_size={plan.prompts_per_step}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={plan.prompts_per_step}",
        # one micro batch per rank and pass: on the host each extra micro batch costs a whole pipeline-schedule pass
        # (about a second for this model), and the step's sequences fit many times over
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={plan.sequences_per_rank}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={plan.sequences_per_rank}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={plan.sequences_per_rank}",
        "actor_rollout_ref.rollout.val_kwargs.n=2",
        f"actor_rollout_ref.rollout.n={plan.samples_per_prompt}",
        f"data.max_response_length={plan.response_length}",
        "data.val_max_samples=4",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.actor.megatron.override_transformer_config.seq_length={512 + plan.response_length}",
        f"trainer.total_training_steps={plan.total_steps}",
        f"trainer.save_freq={plan.save_freq}",
        f"trainer.test_freq={plan.test_freq}",
        "trainer.val_before_train=false",
        "trainer.resume_mode=auto",
        f"trainer.max_actor_ckpt_to_keep={plan.max_ckpt_to_keep or plan.total_steps}",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        # Ray: the device stand-ins after the overlay's prelude in every worker; the lifecycle record directory
        # the run watchdog at CPU scale: a stage of this run takes seconds, a lost worker must stop it within a minute
        *(f"r1_ascend.watchdog.{key}={value}" for key, value in WATCHDOG.items()),
        # a planted fault of the engine's configuration: the rollout engine's own config overrides, as a user sets them
        *engine_fault_overrides(plan.engine_fault, inputs.model),
        *seed_overrides(plan.seed),
        *(
            [
                f"+ray_kwargs.ray_init.runtime_env.env_vars.{envs.R1_ASCEND_REHEARSE_ROLLOUT_FAULT}='{plan.rollout_fault}'"
            ]
            if plan.rollout_fault
            else []
        ),
        # the driver on the head node's raylet, as on a cluster: the simulated nodes share one host and so one Ray
        # session directory, whose node_ip_address.json names the node started last; a driver connecting without
        # an address of its own attaches to that node's raylet, and losing that node took the driver's actors
        # (the TaskRunner, "Owner's node has crashed") with it
        f"+ray_kwargs.ray_init._node_ip_address={node_ip(0)}",
        *(
            [f"+ray_kwargs.ray_init.runtime_env.env_vars.{envs.R1_ASCEND_REHEARSE_ACTOR_FAULT}='{plan.actor_fault}'"]
            if plan.actor_fault
            else []
        ),
        *(
            [f"+ray_kwargs.ray_init.runtime_env.env_vars.{envs.R1_ASCEND_REHEARSE_SHUFFLE_REWARDS}='1'"]
            if plan.shuffle_rewards
            else []
        ),
        *(
            [f"+ray_kwargs.ray_init.runtime_env.env_vars.{envs.R1_ASCEND_REHEARSE_HOLD}='{plan.hold_at}'"]
            if plan.hold_at
            else []
        ),
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES={STANDINS_MODULE}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{envs.R1_ASCEND_REHEARSE_DIR}={out / 'lifecycle'}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR={out / 'tensorboard'}",
        "+ray_kwargs.ray_init.runtime_env.env_vars.RAY_DEDUP_LOGS='0'",
    ]


def engine_fault_overrides(name: str | None, model_dir: Path) -> list[str]:
    """``actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides`` giving the engine the configuration of the
    rollout fault ``name`` (r1_ascend.rehearse.rollout_faults), from the model's config.json; none for None."""
    if name is None:
        return []
    import json

    from r1_ascend.rehearse import rollout_faults

    fault = rollout_faults.get(name)
    if fault.engine_overrides is None:
        msg = f"rollout fault {name!r} is not a fault of the engine's configuration (it is planted in a weight sync)"
        raise ValueError(msg)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    key = "+actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides"
    return [f"{key}.{field}={json.dumps(value)}" for field, value in fault.engine_overrides(config).items()]


def seed_overrides(seed: int | None) -> list[str]:
    """Another seed: another data order, actor RNG and rollout sampling (verl passes no rollout seed: the CPU engine
    reads it from the runtime environment)."""
    if seed is None:
        return []
    return [
        f"data.seed={seed}",
        f"actor_rollout_ref.actor.megatron.seed={seed}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{envs.R1_ASCEND_REHEARSE_SEED}={seed}",
    ]


def driver_command(python: str, plan: Plan, inputs: Inputs, out: Path, extra: Sequence[str] = ()) -> list[str]:
    """The recipe's real entry point, as scripts/run_grpo_smoke_npu.sh runs it; ``extra`` overrides replace the
    rehearsal's own for the same key (Hydra refuses a key given twice)."""
    command = [python, "-m", "r1_ascend.recipe.main_grpo", "--config-name", CONFIG_NAME]
    return with_overrides([*command, *overrides(plan, inputs, out)], [*plan.overrides, *extra])


def with_overrides(command: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``command`` with the Hydra overrides ``extra`` appended, replacing any it has for the same keys."""
    keys = {item.split("=", 1)[0] for item in extra}
    return [item for item in command if "=" not in item or item.split("=", 1)[0] not in keys] + list(extra)
