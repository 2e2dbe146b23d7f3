"""The run configurations (Hydra overlays in ``recipe/config``) and how to compose them without importing verl.

The overlays name ``pkg://verl.trainer.config`` as their search path, which is what the recipe entry point uses.
Resolving a ``pkg://`` path imports the package (and with it ``verl``, torch ...), so the preflight replaces it with
the ``file://`` path of the installed verl's config directory, found without importing verl.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any

from r1_ascend.patches.rules import rollout_guard, watchdog

#: The overlay the launcher runs when ``R1_ASCEND_CONFIG`` is not set.
DEFAULT_OVERLAY = "grpo_deepseekv3_671b"
SMOKE_OVERLAY = "grpo_deepseekv3_smoke"
QWEN_OVERLAY = "grpo_qwen25_7b"

#: Keys an overlay may set although verl 0.6.1's config schema does not declare them. They live in verl's free-form
#: dicts and are consumed by MindSpeed (``override_transformer_config`` goes to ``mindspeed.megatron_adaptor.repatch``
#: and to Megatron's TransformerConfig, which drops names it does not know) or by vLLM / vllm-ascend
#: (``engine_kwargs.vllm``). On the command line they need a leading ``+``. docs/launch.md lists them too (a test
#: checks that every key here is documented there).
_OTC = "actor_rollout_ref.actor.megatron.override_transformer_config"
EXTENSION_KEYS: Mapping[str, str] = {
    f"{_OTC}.num_layers_in_first_pipeline_stage": "Megatron-core: decoder layers on the first pipeline stage",
    f"{_OTC}.num_layers_in_last_pipeline_stage": "Megatron-core: decoder layers on the last pipeline stage",
    f"{_OTC}.pipeline_num_transformer_layers": "MindSpeed: decoder layers per pipeline stage, [[n0], [n1], ...]",
    f"{_OTC}.multi_head_latent_attention": "MindSpeed: DeepSeek MLA attention",
    f"{_OTC}.use_flash_attn": "MindSpeed: NPU fused flash attention",
    f"{_OTC}.moe_grouped_gemm": "Megatron-core/MindSpeed: grouped GEMM for the local experts",
    f"{_OTC}.moe_token_dispatcher_type": "Megatron-core: MoE token dispatcher (alltoall)",
    f"{_OTC}.use_fused_rotary_pos_emb": "MindSpeed: fused rotary position embedding kernel",
    f"{_OTC}.use_fused_swiglu": "MindSpeed: fused SwiGLU kernel",
    f"{_OTC}.rope_scaling_type": "MindSpeed: RoPE scaling type (yarn, as DeepSeek-V3's rope_scaling.type)",
    f"{_OTC}.yarn_scaling_factor": "MindSpeed: YaRN factor (DeepSeek-V3 rope_scaling.factor = 40)",
    f"{_OTC}.rope_scaling_mscale": "MindSpeed: YaRN mscale (rope_scaling.mscale)",
    f"{_OTC}.rope_scaling_mscale_all_dim": "MindSpeed: YaRN mscale_all_dim (rope_scaling.mscale_all_dim)",
    f"{_OTC}.seq_length": "MindSpeed: sequence length it sizes rotary tables for (= prompt + response)",
    f"{_OTC}.swap_optimizer": "MindSpeed: keep optimizer states in host memory, swap them in per step",
    "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.ascend_scheduler_config.enabled": (
        "vllm-ascend: use the Ascend scheduler (chunked prefill off unless enable_chunked_prefill is set next to it)"
    ),
    "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.ascend_scheduler_config.enable_chunked_prefill": (
        "vllm-ascend: chunked prefill under the Ascend scheduler"
    ),
    "actor_rollout_ref.rollout.engine_kwargs.vllm.enable_expert_parallel": (
        "vLLM: shard MoE experts over all rollout ranks (EP = DP x TP) instead of replicating them per DP rank"
    ),
    "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.refresh": (
        "vllm-ascend: rebuild the global AscendConfig from this additional_config (the DP/EP patch created a default)"
    ),
    "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config.enabled": (
        "vllm-ascend: TorchAir graph mode (required for DeepSeek unless enforce_eager)"
    ),
    "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config.use_cached_graph": (
        "vllm-ascend: reuse graphs cached on disk (off: the rollout weights are re-allocated every step)"
    ),
    "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config.graph_batch_sizes_init": (
        "vllm-ascend: derive graph batch sizes automatically (off: graph_batch_sizes is given)"
    ),
    "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config.graph_batch_sizes": (
        "vllm-ascend: decode batch sizes captured as TorchAir graphs (must contain max_num_seqs)"
    ),
    "r1_ascend.onpolicy_logprob_shortcut": (
        "r1-ascend: skip the old-log-prob pass on an exactly on-policy update (patch verl_onpolicy_logprob)"
    ),
    f"{rollout_guard.CONFIG_KEY}.enabled": (
        "r1-ascend: compare rollout and actor log-probs each step, stop on a mismatch (patch verl_rollout_guard)"
    ),
    **{
        f"{rollout_guard.CONFIG_KEY}.{level}.{name}": (
            f"r1-ascend: the guard {'warns' if level == 'warn' else 'stops the run'} when the step's {name} is above "
            f"this ({rollout_guard.UNITS[name]}; default {defaults[name]:g}, docs/rollout_guard.md)"
        )
        for level, defaults in (("warn", rollout_guard.DEFAULT_WARN), ("stop", rollout_guard.DEFAULT_STOP))
        for name in rollout_guard.GATED
    },
    f"{rollout_guard.CONFIG_KEY}.calibration.steps": (
        "r1-ascend: the first this many healthy steps of a run measure its baseline, at the absolute levels "
        f"(default {rollout_guard.DEFAULT_CALIBRATION_STEPS}; 0: no calibration)"
    ),
    **{
        f"{rollout_guard.CONFIG_KEY}.calibration.{what}.{name}": (
            f"r1-ascend: the calibrated {what.split('_')[0]} level of {name} is this x max(baseline, floor) "
            f"(default {defaults[name]:g})"
            if what != "floor"
            else f"r1-ascend: the least baseline of {name} ({rollout_guard.UNITS[name]}; default {defaults[name]:g})"
        )
        for what, defaults in (
            ("warn_factor", rollout_guard.DEFAULT_WARN_FACTOR),
            ("stop_factor", rollout_guard.DEFAULT_STOP_FACTOR),
            ("floor", rollout_guard.DEFAULT_FLOOR),
        )
        for name in rollout_guard.GATED
    },
    f"{rollout_guard.CONFIG_KEY}.calibration.on_resume": (
        "r1-ascend: restore (the baseline saved with the checkpoint) or recalibrate on resume (default restore)"
    ),
    f"{rollout_guard.CONFIG_KEY}.escalate_after": (
        f"r1-ascend: this many warned steps in a row stop the run (default {rollout_guard.DEFAULT_ESCALATE_AFTER}; "
        "0: never)"
    ),
    f"{watchdog.CONFIG_KEY}.enabled": "r1-ascend: stop a run whose worker is lost or stuck, naming it (the watchdog)",
    f"{watchdog.CONFIG_KEY}.silence_s": "r1-ascend: a worker without a heartbeat this long is lost (seconds)",
    f"{watchdog.CONFIG_KEY}.stage_s": "r1-ascend: a stage this long on every worker is a hang (seconds)",
    f"{watchdog.CONFIG_KEY}.poll_s": "r1-ascend: how often the driver reads the heartbeats (seconds)",
}

#: The keys in which the smoke overlay may differ from the 671B overlay (everything else must be identical, so the
#: smoke test exercises the same settings as the real run).
SMOKE_DIFFERENCES: frozenset[str] = frozenset(
    {
        "data.max_prompt_length",
        "data.max_response_length",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config.graph_batch_sizes",
        "data.train_batch_size",
        "data.val_max_samples",
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size",
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size",
        f"{_OTC}.recompute_num_layers",
        f"{_OTC}.num_layers_in_first_pipeline_stage",
        f"{_OTC}.num_layers_in_last_pipeline_stage",
        f"{_OTC}.pipeline_num_transformer_layers",
        f"{_OTC}.seq_length",
        "actor_rollout_ref.rollout.n",
        "actor_rollout_ref.rollout.max_num_seqs",
        "actor_rollout_ref.rollout.max_num_batched_tokens",
        "trainer.nnodes",
        "trainer.experiment_name",
        "trainer.total_training_steps",
        "trainer.test_freq",
        "trainer.save_freq",
        "trainer.log_val_generations",
        "trainer.default_local_dir",  # interpolates experiment_name
    }
)


class OverlayError(ValueError):
    """An overlay name, override or the installed verl config cannot be used."""


def config_dir() -> Path:
    """``recipe/config`` as installed (a real directory: the package is installed from a source tree or wheel)."""
    return Path(str(files("r1_ascend.recipe").joinpath("config")))


def overlay_names() -> list[str]:
    return sorted(p.stem for p in config_dir().glob("*.yaml"))


def overlay_path(name: str) -> Path:
    path = config_dir() / f"{name}.yaml"
    if not path.is_file():
        msg = f"unknown run configuration {name!r}; available: {', '.join(overlay_names())} (in {config_dir()})"
        raise OverlayError(msg)
    return path


def verl_config_dir() -> Path:
    """The installed verl's ``trainer/config`` directory, located without importing verl (which imports torch)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        msg = "verl is not installed; install the pinned stack (verl 0.6.1) first (README 'Install')"
        raise OverlayError(msg)
    for root in spec.submodule_search_locations:
        candidate = Path(root) / "trainer" / "config"
        if (candidate / "ppo_megatron_trainer.yaml").is_file():
            return candidate
    msg = f"verl at {list(spec.submodule_search_locations)} has no trainer/config/ppo_megatron_trainer.yaml"
    raise OverlayError(msg)


@contextmanager
def libyaml_parser() -> Iterator[None]:
    """Parse YAML with libyaml inside OmegaConf's own loader while composing (a third of the composition time).

    OmegaConf's loader is PyYAML's pure-Python ``SafeLoader`` plus its own float resolver, no timestamps and a
    duplicate-key refusal. This puts libyaml's parser (the ``CSafeLoader`` front end) under that same loader class,
    so resolution and construction are OmegaConf's; a test checks every shipped configuration composes identically.
    """
    import yaml
    from omegaconf import _utils

    original = _utils.get_yaml_loader
    if not getattr(yaml, "__with_libyaml__", False):
        yield
        return

    def with_libyaml() -> Any:
        base = original()

        def init(self: Any, stream: Any) -> None:
            yaml.cyaml.CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

        return type("LibyamlOmegaConfLoader", (yaml.cyaml.CParser, base), {"__init__": init})

    _utils.get_yaml_loader = with_libyaml
    try:
        yield
    finally:
        _utils.get_yaml_loader = original


def compose(name: str, overrides: Sequence[str] = ()) -> Any:
    """The full config of overlay ``name`` with command-line style ``overrides`` (an OmegaConf ``DictConfig``).

    Same semantics as the recipe entry point: unknown keys need a ``+``, values are YAML.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overlay_path(name)
    searchpath = f"hydra.searchpath=[file://{verl_config_dir()}]"
    try:
        with libyaml_parser(), initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            return hydra_compose(name, overrides=[searchpath, *overrides])
    except (HydraException, OmegaConfBaseException) as exc:
        msg = f"cannot compose run configuration {name!r} with overrides {list(overrides)}: {exc}"
        raise OverlayError(msg) from exc


def flatten(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``("a.b.c", leaf)`` pairs of a nested mapping; lists are leaves."""
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from flatten(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], tree


def overlay_leaf_keys(name: str) -> list[str]:
    """The dotted keys an overlay file itself sets (``hydra`` and ``defaults`` excluded)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(overlay_path(name)), resolve=False)
    assert isinstance(raw, dict)
    raw.pop("hydra", None)
    raw.pop("defaults", None)
    return [key for key, _ in flatten(raw)]
