"""Preflight: a DeepSeek-V3 Megatron actor (and reference) must route tokens to experts as the rollout engine does.

The rollout engine routes within ``topk_group`` of ``n_group`` expert groups (config.json); verl 0.6.1's Megatron
model routes over all experts unless patch ``verl_dpskv3_group_routing`` or ``override_transformer_config`` sets
``moe_router_num_groups`` / ``moe_router_group_topk``. The rule is ``r1_ascend.patches.rules.group_routing``, the one
the patch applies; the switches are read as the installer reads them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from r1_ascend.launch.checks import ERROR, OK, SKIPPED, Finding, Run
from r1_ascend.launch.upstream_checks import model_config_source
from r1_ascend.patches.rules.group_routing import PATCH, is_deepseek_v3, rollout_routing, routing_problem
from r1_ascend.patches.rules.switches import read_switches

CHECK = "group_routing"


def _megatron_roles(config: Any) -> list[str]:
    """The Megatron models of the run whose routing must match the rollout's: the actor, and the reference when a
    KL term uses it (verl builds it only then)."""
    roles = ["actor"]
    if config.actor_rollout_ref.actor.get("use_kl_loss") or config.algorithm.get("use_kl_in_reward"):
        roles.append("ref")
    return roles


def check_group_routing(run: Run) -> Iterator[Finding]:
    model, source = model_config_source(run)
    if model is None:
        yield Finding(CHECK, SKIPPED, "skipped: needs the model's config.json (set MODEL_PATH)")
        return
    if not is_deepseek_v3(model):
        return
    patched = read_switches(run.full_env, strict=False).enabled(PATCH)  # unknown names: reported by recipe_config
    problems = []
    for role in _megatron_roles(run.config):
        megatron = run.config.actor_rollout_ref[role].megatron
        where = f"actor_rollout_ref.{role}.megatron.override_transformer_config"
        if megatron.get("use_mbridge"):
            problems.append(
                f"actor_rollout_ref.{role}.megatron.use_mbridge=true: verl then builds the Megatron config through "
                f"mbridge (not in the pinned stack), which patch {PATCH} does not reach, so its expert routing "
                "is unchecked; set use_mbridge=false"
            )
            continue
        overrides = megatron.get("override_transformer_config") or {}
        problem = routing_problem(model, overrides, patched=patched, where=where, role=role)
        if problem is not None:
            problems.append(problem)
    for problem in problems:
        yield Finding(CHECK, ERROR, f"{problem} ({source})")
    if not problems:
        rollout = rollout_routing(model)
        how = f"patch {PATCH}" if patched else "override_transformer_config"
        yield Finding(
            CHECK,
            OK,
            f"{' and '.join(_megatron_roles(run.config))} route {rollout.describe()} like the rollout engine "
            f"(n_group {rollout.num_groups}, topk_group {rollout.group_topk}; set by {how}; {source})",
        )


ROUTING_CHECKS = (check_group_routing,)
