"""Preflight checks that run the pinned stack's own validation on the composed config, before the cluster is taken.

verl runs ``validate_config`` and its dataclass conversions in the driver and the workers, vLLM checks its engine
arguments and Megatron-core its ``TransformerConfig`` when the workers start; some of those refusals come only after
the 671B actor has loaded. Here the same upstream code runs on the composed config in a fraction of a second
(``upstream_verl`` and ``upstream_source`` say how without torch). Where upstream's message names no fix, or
upstream checks too late or not at all, a project rule words the problem: the value found, what is expected and
the exact ``key=value`` override that fixes it. docs/launch.md lists which check comes from where.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import sys
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import OmegaConf

from r1_ascend.launch.checks import ERROR, OK, SKIPPED, Finding, Run
from r1_ascend.launch.divisibility import head_split_problems, largest_head_tp
from r1_ascend.launch.model_info import known_model


@cache
def verl_defaults() -> dict[str, Any]:
    """verl's own full Megatron trainer config (its generated ``_generated_ppo_megatron_trainer.yaml``), unresolved."""
    import yaml

    from r1_ascend.launch.overlays import verl_config_dir

    path = verl_config_dir() / "_generated_ppo_megatron_trainer.yaml"
    if not path.is_file():
        return {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}


def verl_default_keys() -> frozenset[str]:
    """Every dotted key of verl's default config.

    Some sections carry keys their dataclass does not declare (``global_profiler`` has ``steps``); those are verl's,
    not the user's, so the unknown-key rule leaves them alone.
    """
    from r1_ascend.launch.overlays import flatten

    keys: set[str] = set()
    for leaf, _ in flatten(verl_defaults()):
        parts = leaf.split(".")
        keys |= {".".join(parts[: i + 1]) for i in range(len(parts))}
    return frozenset(keys)


@dataclass(frozen=True)
class Problem:
    """One finding of a project rule: ``keys`` are the config keys it is about (to match upstream's messages)."""

    keys: tuple[str, ...]
    message: str


def _resolved(config: Any) -> Any:
    """The config resolved in place, as verl's ``run_ppo`` resolves it before validating (values do not change;
    a copy would cost a few hundred milliseconds on a busy login node)."""
    OmegaConf.resolve(config)
    return config


def _quiet() -> contextlib.ExitStack:
    """Upstream prints progress and warns about unrelated defaults; the preflight shows only its own lines."""
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    return stack


def uses_reference(cfg: Any) -> bool:
    """verl adds the reference-policy worker when the KL is in the loss or in the reward."""
    return bool(cfg.actor_rollout_ref.actor.use_kl_loss) or bool(cfg.algorithm.use_kl_in_reward)


def uses_critic(cfg: Any) -> bool:
    """verl's ``need_critic``: ``critic.enable`` if set, else only for the GAE estimator."""
    enable = cfg.critic.get("enable")
    return bool(enable) if enable is not None else str(cfg.algorithm.adv_estimator) == "gae"


# --- unknown keys in dataclass-backed sections -----------------------------------------------------------------


def _dataclass_nodes(node: Any, path: str) -> Iterator[tuple[str, Any, str]]:
    """``(path, node, _target_)`` for every mapping in the config that names a dataclass with ``_target_``."""
    if isinstance(node, Mapping):
        target = node.get("_target_")
        if isinstance(target, str) and target:
            yield path, node, target
        for key, value in node.items():
            yield from _dataclass_nodes(value, f"{path}.{key}" if path else str(key))


def unknown_key_problems(config: Any, api: Any, verl_keys: frozenset[str]) -> list[Problem]:
    """Keys of a dataclass-backed section that its verl dataclass does not declare.

    Hydra refuses an unknown key unless it is added with ``+`` (and its error message suggests the ``+``), so a
    misspelt ``+actor_rollout_ref.rollout.gpu_memory_utilisation=0.8`` composes, is never read, and verl's
    dataclass conversion refuses it only inside the worker.
    """
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(config, resolve=False)
    problems = []
    for path, node, target in _dataclass_nodes(raw, ""):
        cls = api.resolve_target(target)
        if cls is None:
            continue  # a target no dataclass backs (verl ships one for the ref's megatron section): nothing to check
        declared = {f.name for f in fields(cls)}
        for key in node:
            full = f"{path}.{key}"
            if key in declared or full in verl_keys:
                continue
            value = node[key]
            close = difflib.get_close_matches(str(key), sorted(declared), n=1, cutoff=0.6)
            if close:
                fix = f"drop +{full} and pass {path}.{close[0]}={_render(value)}"
                expected = f"did you mean {close[0]}?"
            else:
                fix = f"drop +{full}"
                expected = f"one of the fields of {cls.__name__}"
            problems.append(
                Problem(
                    (full,),
                    f"{full}={_render(value)} is not a field of verl's dataclass {target} ({expected}); it would be "
                    f"ignored until verl refuses it in the worker. Fix: {fix}",
                )
            )
    return problems


def _render(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Mapping | list):
        return "..."
    return str(value)


# --- micro-batch pairs -------------------------------------------------------------------------------------------

#: The sections whose micro-batch pair verl checks, and when it does.
_MICRO_SECTIONS = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "critic",
    "reward_model",
)


def _section_in_use(cfg: Any, section: str) -> bool:
    if section == "actor_rollout_ref.ref":
        return uses_reference(cfg)
    if section == "critic":
        return uses_critic(cfg)
    if section == "reward_model":
        return bool(cfg.reward_model.enable)
    return True


def _dynamic(cfg: Any, node: Any) -> bool:
    """verl skips the pair checks under dynamic batch sizes (the actor's flag for the rollout and the ref)."""
    if "use_dynamic_bsz" in node:
        return bool(node.use_dynamic_bsz)
    return bool(cfg.actor_rollout_ref.actor.use_dynamic_bsz)


def micro_batch_problems(cfg: Any) -> list[Problem]:
    """Every ``*micro_batch_size`` / ``*micro_batch_size_per_gpu`` pair set twice or not at all where verl reads it."""
    from omegaconf import OmegaConf

    problems = []
    per_gpu_values = {}
    pairs = []
    for section in _MICRO_SECTIONS:
        node = OmegaConf.select(cfg, section)
        if node is None or not _section_in_use(cfg, section) or _dynamic(cfg, node):
            continue
        for key in node:
            per_gpu = f"{key}_per_gpu"
            if str(key).endswith("micro_batch_size") and per_gpu in node:
                pairs.append((section, str(key), node.get(key), node.get(per_gpu)))
                if node.get(per_gpu) is not None:
                    per_gpu_values[str(key)] = node.get(per_gpu)
    for section, key, total, per_gpu in pairs:
        if total is not None and per_gpu is not None:
            problems.append(
                Problem(
                    (f"{section}.{key}", f"{section}.{key}_per_gpu"),
                    f"both {section}.{key}={total} and {section}.{key}_per_gpu={per_gpu} are set; verl accepts "
                    f"exactly one (the per-GPU one; the global one is deprecated). Fix: {section}.{key}=null",
                )
            )
        elif total is None and per_gpu is None:
            suggestion = per_gpu_values.get(key, cfg.actor_rollout_ref.actor.get("ppo_micro_batch_size_per_gpu") or 1)
            problems.append(
                Problem(
                    (f"{section}.{key}", f"{section}.{key}_per_gpu"),
                    f"neither {section}.{key} nor {section}.{key}_per_gpu is set; verl needs exactly one. "
                    f"Fix: {section}.{key}_per_gpu={suggestion}",
                )
            )
    return problems


# --- verl's own conversion and validation -------------------------------------------------------------------------


def _explained(message: str, problems: list[Problem]) -> bool:
    return any(key.rpartition(".")[2] in message for p in problems for key in p.keys)


def check_verl_config(run: Run) -> Iterator[Finding]:
    """verl 0.6.1's dataclass conversions and ``validate_config`` on the composed config, plus the key rules."""
    from omegaconf.errors import OmegaConfBaseException

    from r1_ascend.launch.upstream_verl import UpstreamUnavailable, verl_config_api

    try:
        cfg = _resolved(run.config)
    except OmegaConfBaseException as exc:
        yield Finding("verl_config", ERROR, f"the config does not resolve (as verl's run_ppo resolves it): {exc}")
        return
    problems = micro_batch_problems(cfg)
    verl_keys = verl_default_keys()
    upstream: list[str] = []
    try:
        with verl_config_api() as api, _quiet():
            problems = unknown_key_problems(run.config, api, verl_keys) + problems
            # validate_config converts the actor (and the critic when used) itself; if it stops early, the actor's
            # own conversion still runs, so an actor problem is not hidden behind a batch-size assertion.
            sections = ["actor_rollout_ref.rollout", "algorithm"]
            try:
                api.validate_config(cfg, use_reference_policy=uses_reference(cfg), use_critic=uses_critic(cfg))
            except Exception as exc:
                upstream.append(f"verl.utils.config.validate_config refuses it: {_one_line(exc)}")
                sections += ["actor_rollout_ref.actor", "critic"] if uses_critic(cfg) else ["actor_rollout_ref.actor"]
            for section in sections:
                try:
                    api.omega_conf_to_dataclass(_select(cfg, section))
                except Exception as exc:
                    upstream.append(f"verl's dataclass conversion of {section} refuses it: {_one_line(exc)}")
    except UpstreamUnavailable as exc:
        yield Finding("verl_config", SKIPPED, f"skipped: {exc}")
        return
    for problem in problems:
        confirmed = [u for u in upstream if _explained(u, [problem])]
        suffix = f" ({'; '.join(confirmed)})" if confirmed else ""
        yield Finding("verl_config", ERROR, problem.message + suffix)
    reported: set[str] = set()
    for message in upstream:
        cause = message.partition("refuses it: ")[2]
        if not _explained(message, problems) and cause not in reported:
            reported.add(cause)  # validate_config converts the actor again: one finding per cause
            yield Finding("verl_config", ERROR, message)
    if not problems and not upstream:
        yield Finding(
            "verl_config",
            OK,
            "verl's validate_config and the actor/rollout/algorithm dataclasses accept the config; no unknown keys",
        )


def _select(cfg: Any, path: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, path)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not str(exc) else text


# --- KL estimator names ------------------------------------------------------------------------------------------


def check_kl_type(run: Run) -> Iterator[Finding]:
    """``kl_loss_type`` / ``algorithm.kl_penalty`` against the names verl's ``kl_penalty_forward`` handles.

    verl looks the name up only when it first computes the KL, in the first training step; the accepted names are
    read from the installed ``verl/trainer/ppo/core_algos.py`` (the branches of ``kl_penalty_forward``).
    """
    from r1_ascend.launch.upstream_source import UpstreamSourceError, string_cases

    cfg = run.config
    used = []
    if cfg.actor_rollout_ref.actor.use_kl_loss:
        used.append(("actor_rollout_ref.actor.kl_loss_type", cfg.actor_rollout_ref.actor.kl_loss_type))
    if cfg.algorithm.use_kl_in_reward:
        used.append(("algorithm.kl_penalty", cfg.algorithm.kl_penalty))
    if not used:
        yield Finding("kl_type", SKIPPED, "skipped: no KL term (use_kl_loss and use_kl_in_reward are off)")
        return
    try:
        handled, refused = string_cases("verl.trainer.ppo.core_algos", "kl_penalty_forward", "kl_penalty")
    except UpstreamSourceError as exc:
        yield Finding("kl_type", SKIPPED, f"skipped: {exc}")
        return
    failed = False
    for key, value in used:
        if str(value) in handled:
            continue
        failed = True
        close = difflib.get_close_matches(str(value), sorted(handled), n=1, cutoff=0.0)
        why = "verl raises NotImplementedError for it" if str(value) in refused else "verl does not know it"
        yield Finding(
            "kl_type",
            ERROR,
            f"{key}={value}: {why} (in the first step's KL computation); expected one of {', '.join(sorted(handled))}."
            f" Fix: {key}={close[0] if close else 'low_var_kl'}",
        )
    if not failed:
        yield Finding("kl_type", OK, ", ".join(f"{key}={value}" for key, value in used))


# --- custom reward function --------------------------------------------------------------------------------------


def check_reward_function(run: Run) -> Iterator[Finding]:
    """verl's own reward loader (``get_custom_reward_fn``) on ``custom_reward_function``.

    The loader runs in the driver after the workers were created; here it runs with the same path resolution (the
    working directory), so a run started from the repo root behaves the same.
    """
    from r1_ascend.launch.upstream_source import UpstreamSourceError, load_functions

    reward = run.config.custom_reward_function
    path, name = reward.get("path"), reward.get("name")
    if not path:
        yield Finding("reward_function", SKIPPED, "skipped: custom_reward_function.path not set (verl's default)")
        return
    if not Path(str(path)).expanduser().is_file():
        yield Finding("reward_function", SKIPPED, f"skipped: {path} not found (reported by the trainer check)")
        return
    try:
        loaders = load_functions(
            "verl.trainer.ppo.reward", ["get_custom_reward_fn", "_call_with_kwargs", "_call_with_kwargs_async"]
        )
    except UpstreamSourceError as exc:
        yield Finding("reward_function", SKIPPED, f"skipped: {exc}")
        return
    saved = sys.modules.pop("custom_module", None)
    try:
        with _quiet():
            loaders["get_custom_reward_fn"](
                {"custom_reward_function": {"path": str(Path(str(path)).expanduser()), "name": name}}
            )
    except AttributeError:
        defined = _functions_in(Path(str(path)))
        close = difflib.get_close_matches(str(name), defined, n=1, cutoff=0.0)
        fix = f"custom_reward_function.name={close[0]}" if close else "define the function in the file"
        yield Finding(
            "reward_function",
            ERROR,
            f"custom_reward_function.name={name} is not defined in {path} (verl's get_custom_reward_fn raises "
            f"AttributeError); it defines {', '.join(defined) or 'no functions'}. Fix: {fix}",
        )
        return
    except Exception as exc:
        yield Finding("reward_function", ERROR, f"verl's get_custom_reward_fn cannot load {path}: {_one_line(exc)}")
        return
    finally:
        sys.modules.pop("custom_module", None)
        if saved is not None:
            sys.modules["custom_module"] = saved
    yield Finding("reward_function", OK, f"{name} from {path} (loaded by verl's get_custom_reward_fn)")


def _functions_in(path: Path) -> list[str]:
    module = sys.modules.get("custom_module")
    if module is None:
        import ast

        tree = ast.parse(path.read_text(encoding="utf-8"))
        return sorted(n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    return sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))


# --- VERL_USE_EXTERNAL_MODULES -----------------------------------------------------------------------------------


def check_external_modules(run: Run) -> Iterator[Finding]:
    """The modules every Ray worker imports with ``import verl`` (``VERL_USE_EXTERNAL_MODULES``).

    verl imports them in every worker's first ``import verl``; a misspelt name fails there, on every node.
    """
    from r1_ascend.launch.module_names import closest_module, resolve_module
    from r1_ascend.recipe.runtime_env import EXTERNAL_MODULES, overlay_env_vars

    configured = OmegaConf.select(run.config, _RUNTIME_ENV_KEY) or {}
    value = overlay_env_vars(dict(configured), run.full_env)[EXTERNAL_MODULES]
    modules = value.split(",")
    bad = [(name, why) for name in modules if (why := resolve_module(name))]
    if not bad:
        yield Finding("external_modules", OK, f"{EXTERNAL_MODULES}={value}: every module resolves")
        return
    sources = (
        (f"++{_RUNTIME_ENV_KEY}.{EXTERNAL_MODULES}", configured.get(EXTERNAL_MODULES)),
        (EXTERNAL_MODULES, run.full_env.get(EXTERNAL_MODULES)),
    )
    for name, why in bad:
        where, given = next(((k, str(v)) for k, v in sources if v and name in _names(str(v))), (EXTERNAL_MODULES, ""))
        fixed = [(closest_module(n) or "") if n == name else n for n in _names(given)]
        fix = ",".join(dict.fromkeys(n for n in fixed if n))
        yield Finding(
            "external_modules",
            ERROR,
            f"{EXTERNAL_MODULES} names {name}: {why}; every Ray worker would fail on `import verl`. Expected an "
            f"importable module. Fix: {where}={fix}",
        )


_RUNTIME_ENV_KEY = "ray_kwargs.ray_init.runtime_env.env_vars"


def _names(value: str) -> list[str]:
    """Module names as the recipe merges them (comma-separated, blanks dropped)."""
    return [n.strip() for n in value.split(",") if n.strip()]


# --- vLLM engine arguments ---------------------------------------------------------------------------------------


def check_gpu_memory_utilization(run: Run) -> Iterator[Finding]:
    """vLLM's own ``CacheConfig._verify_args`` (> 1 refused) plus the lower bound vLLM leaves to its profiler."""
    from r1_ascend.launch.upstream_source import UpstreamSourceError, load_functions

    key = "actor_rollout_ref.rollout.gpu_memory_utilization"
    value = run.config.actor_rollout_ref.rollout.gpu_memory_utilization
    fix = f"Fix: {key}={_verl_default(key, 0.5)} (verl's default)"
    try:
        fraction = float(value)
    except (TypeError, ValueError):
        yield Finding("gpu_memory", ERROR, f"{key}={value} is not a number; expected a fraction in (0, 1]. {fix}")
        return
    try:
        verify = load_functions("vllm.config", ["CacheConfig._verify_args"])["CacheConfig._verify_args"]
        verify(SimpleNamespace(cpu_offload_gb=0, gpu_memory_utilization=fraction))
    except UpstreamSourceError as exc:
        yield Finding("gpu_memory", SKIPPED, f"skipped vLLM's own check: {exc}")
    except ValueError as exc:
        yield Finding(
            "gpu_memory",
            ERROR,
            f"{key}={value}: vLLM's CacheConfig refuses it ({exc}); expected a fraction in (0, 1]. {fix}",
        )
        return
    if fraction <= 0:
        yield Finding(
            "gpu_memory",
            ERROR,
            f"{key}={value}: no memory left for the KV cache (vLLM fails when it sizes the cache); expected a "
            f"fraction in (0, 1]. {fix}",
        )
        return
    yield Finding("gpu_memory", OK, f"rollout gpu_memory_utilization {value}")


def _verl_default(key: str, fallback: Any) -> Any:
    """The value verl's default config gives ``key`` (dotted), or ``fallback``."""
    node: Any = verl_defaults()
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return fallback
        node = node[part]
    return node


# --- attention heads vs tensor parallelism -------------------------------------------------------------------------


def model_config_source(run: Run) -> tuple[dict[str, Any] | None, str]:
    """The model's config.json (or the known model's for a shipped run configuration) and where it came from."""
    if run.model is not None:
        return run.model.config, f"{run.model.path}/config.json"
    known = known_model(run.config_name)
    if known is not None:
        label, config = known
        return config, f"{label}, from the table of known models (MODEL_PATH not set)"
    return None, ""


def vllm_head_refusal(heads: int, tp: int) -> str | None:
    """vLLM's own ``ModelConfig.verify_with_parallel_config`` on the head count and rollout TP: its message, or None.

    Runs the installed method (``upstream_source``) on a stand-in holding only what it reads for a single-stage,
    non-expert-parallel engine; anything else it would check needs the engine and is left to vLLM.
    """
    from r1_ascend.launch.upstream_source import UpstreamSourceError, load_functions

    try:
        verify = load_functions("vllm.config", ["ModelConfig.verify_with_parallel_config"])
    except UpstreamSourceError:
        return None
    model = SimpleNamespace(hf_text_config=SimpleNamespace(num_attention_heads=heads), seed=0)
    parallel = SimpleNamespace(
        distributed_executor_backend="mp",
        tensor_parallel_size=tp,
        enable_expert_parallel=False,
        pipeline_parallel_size=1,
    )
    try:
        verify["ModelConfig.verify_with_parallel_config"](model, parallel)
    except (ValueError, ZeroDivisionError) as exc:
        return f"vLLM: {exc}"
    return None


def check_attention_heads(run: Run) -> Iterator[Finding]:
    """Actor TP against Megatron-core's head rules, rollout TP against vLLM's (both fire only in the workers)."""
    config, source = model_config_source(run)
    if config is None or "num_attention_heads" not in config:
        reason = run.model_error or (
            "needs the model's config.json (set MODEL_PATH); the known-model table has no attention heads for "
            f"{run.config_name or 'this configuration'}"
        )
        yield Finding("attention_heads", SKIPPED, f"skipped: {reason}")
        return
    heads = int(config["num_attention_heads"])
    mla = config.get("kv_lora_rank") is not None
    groups = None if mla else int(config.get("num_key_value_heads") or heads)
    cfg = run.config
    actor_key = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"
    sides = [
        (actor_key, "Megatron-core TransformerConfig", groups),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", "vLLM ModelConfig", None),
    ]
    # the reference model (and a critic) build their own Megatron model; report them only where their TP differs
    # from the actor's (the shipped overlays interpolate it, so fixing the actor fixes them)
    for section, used in (("actor_rollout_ref.ref", uses_reference(cfg)), ("critic", uses_critic(cfg))):
        key = f"{section}.megatron.tensor_model_parallel_size"
        if used and OmegaConf.select(cfg, key) not in (None, OmegaConf.select(cfg, actor_key)):
            sides.append((key, "Megatron-core TransformerConfig", groups))
    failed = False
    for key, owner, side_groups in sides:
        tp = int(OmegaConf.select(cfg, key))
        problems = head_split_problems(heads, side_groups, tp)
        if owner.startswith("vLLM"):
            upstream = vllm_head_refusal(heads, tp)
            if upstream and not problems:
                problems = [upstream]
            owner = f"{owner} ({upstream})" if upstream else owner
        if problems:
            failed = True
            good = largest_head_tp(heads, side_groups, tp, run.world)
            yield Finding(
                "attention_heads",
                ERROR,
                f"{key}={tp}: {'; '.join(problems)} ({source}); {owner} refuses it when the workers start. "
                f"Expected a divisor of {heads}{f' and {side_groups}' if side_groups else ''}. Fix: {key}={good}",
            )
    if not failed:
        actor_tp = int(cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size)
        rollout_tp = int(cfg.actor_rollout_ref.rollout.tensor_model_parallel_size)
        kv = f", {groups} KV heads" if groups is not None else ""
        text = f"{heads} heads{kv} split by actor TP {actor_tp} and rollout TP {rollout_tp} ({source})"
        yield Finding("attention_heads", OK, text)


UPSTREAM_CHECKS = (
    check_verl_config,
    check_kl_type,
    check_reward_function,
    check_external_modules,
    check_gpu_memory_utilization,
    check_attention_heads,
)
