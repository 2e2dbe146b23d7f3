"""The preflight checks: each takes the resolved run and yields findings with one clear message each.

A check never raises for a bad configuration; it reports what is wrong, what was expected and how to fix it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from r1_ascend import envs
from r1_ascend.launch.divisibility import expert_split_problems, world_split_problems
from r1_ascend.launch.layout import mindspeed_stage_layers, rollout_layout, train_layout
from r1_ascend.launch.memory import GIB, MemoryInputs, PhaseEstimate, estimate
from r1_ascend.launch.model_info import ModelConfigError, ModelInfo, known_model, load_model_info
from r1_ascend.launch.output_dir import mount_of, on_container_root, read_mounts, unwritable
from r1_ascend.launch.units import human_count, plural
from r1_ascend.parallel import Layout, LayoutError
from r1_ascend.patches.rules.checkpoints import resume_decision
from r1_ascend.patches.rules.dp_layout import DpEpConfigError, check_env_dp_size, rollout_dp_size
from r1_ascend.recipe.reward_file import RewardFileError, resolve_in_config
from r1_ascend.weights.manifest import read_megatron_manifest

ERROR, WARNING, OK, SKIPPED = "error", "warning", "ok", "skipped"


@dataclass(frozen=True)
class Finding:
    check: str
    level: str  # ERROR | WARNING | OK | SKIPPED (the check could not run; the message says why)
    message: str


@dataclass
class Run:
    """Everything the checks look at: the resolved config plus what could be derived from it."""

    config: Any
    env: Mapping[str, str]
    die_bytes: float
    full_env: Mapping[str, str] = field(default_factory=dict)
    check_patches: bool = True
    config_name: str = ""
    model: ModelInfo | None = None
    model_error: str | None = None
    reward_error: str | None = None
    train: Layout | None = None
    rollout: Layout | None = None
    stages: list[int] | None = None
    memory: list[PhaseEstimate] = field(default_factory=list)

    @property
    def world(self) -> int:
        return int(self.config.trainer.nnodes) * int(self.config.trainer.n_gpus_per_node)


def prepare(run: Run) -> None:
    """Derive the model info and layouts once; failures are reported by the checks that need them. A
    ``pkg://`` reward path becomes the installed module's file, as the recipe entry point makes it."""
    cfg = run.config
    try:
        resolve_in_config(cfg)
    except RewardFileError as exc:
        run.reward_error = str(exc)
    path = cfg.actor_rollout_ref.model.path
    if path:
        try:
            run.model = load_model_info(path)
        except ModelConfigError as exc:
            run.model_error = str(exc)
    run.train = train_layout(cfg, run.world)
    tp = int(cfg.actor_rollout_ref.rollout.tensor_model_parallel_size)
    try:
        run.rollout = rollout_layout(tp, rollout_dp_size(run.world, tp))
    except DpEpConfigError:
        run.rollout = None  # reported by check_vllm_dp_size
    if run.model is not None:
        try:
            run.stages = run.train.stage_layers(run.model.num_layers)
        except LayoutError:
            run.stages = None


# --- checks ---------------------------------------------------------------------------------------------------


def check_paths(run: Run) -> Iterator[Finding]:
    cfg = run.config
    required = {
        "actor_rollout_ref.model.path": (cfg.actor_rollout_ref.model.path, "MODEL_PATH"),
        "data.train_files": (cfg.data.train_files, "DATA_DIR (train.parquet)"),
        "data.val_files": (cfg.data.val_files, "VAL_DATA_DIR / DATA_DIR (val.parquet)"),
    }
    for role in ("actor", "ref"):
        mega = cfg.actor_rollout_ref[role].megatron
        if mega.use_dist_checkpointing:
            key = f"actor_rollout_ref.{role}.megatron.dist_checkpointing_path"
            required[key] = (mega.dist_checkpointing_path, "DIST_CKPT_DIR")
    missing = [f"{key} (env {env})" for key, (value, env) in required.items() if not value]
    if missing:
        yield Finding("paths", ERROR, f"not set: {'; '.join(missing)}. Export the variables or pass key=value")
    else:
        yield Finding("paths", OK, "model, data and checkpoint paths are set")


def check_output_dir(run: Run) -> Iterator[Finding]:
    """``trainer.default_local_dir`` (the run scripts put it under OUTPUT_DIR) is writable and not on the container's
    own disk: an error on a multi-node run, a warning on one node."""
    raw = str(run.config.trainer.default_local_dir)
    path = Path(raw).expanduser()
    if not path.is_absolute():
        yield Finding(
            "output_dir",
            ERROR if run.config.trainer.nnodes > 1 else WARNING,
            f"trainer.default_local_dir={raw} is relative: the checkpoints would go wherever each process runs. Set "
            "OUTPUT_DIR (the run scripts then use OUTPUT_DIR/checkpoints/<config>) or give an absolute path",
        )
        return
    problem = unwritable(path)
    if problem:
        yield Finding("output_dir", ERROR, f"trainer.default_local_dir={raw} cannot be created: {problem}")
        return
    mount = mount_of(path, read_mounts())
    where = f"{mount.fstype} mounted at {mount.point}" if mount else "mount unknown"
    if on_container_root(mount):
        yield Finding(
            "output_dir",
            ERROR if run.config.trainer.nnodes > 1 else WARNING,
            f"trainer.default_local_dir={raw} is on the container's own file system ({where}): it is lost with the "
            "container and no other node sees it. Mount a shared directory into the container (docker run -v "
            "/shared:/shared) and set OUTPUT_DIR=/shared/...",
        )
        return
    yield Finding("output_dir", OK, f"checkpoints in {raw} (writable; {where})")


def check_world_size(run: Run) -> Iterator[Finding]:
    cfg = run.config
    nodes, per_node = int(cfg.trainer.nnodes), int(cfg.trainer.n_gpus_per_node)
    env_nodes, env_per_node = envs.nnodes(run.env), envs.npus_per_node(run.env)
    if not env_nodes or not env_per_node:
        yield Finding(
            "world_size",
            WARNING,
            f"config asks for {nodes} x {per_node} = {run.world} NPUs; NNODES/NPUS_PER_NODE are not set, so the "
            "cluster size was not compared (the launcher sets them)",
        )
        return
    try:
        cluster = int(env_nodes) * int(env_per_node)
    except ValueError:
        yield Finding("world_size", ERROR, f"NNODES={env_nodes!r} / NPUS_PER_NODE={env_per_node!r} are not integers")
        return
    if (nodes, per_node) != (int(env_nodes), int(env_per_node)):
        yield Finding(
            "world_size",
            ERROR,
            f"trainer.nnodes x trainer.n_gpus_per_node = {nodes} x {per_node} = {run.world}, but the cluster is "
            f"NNODES x NPUS_PER_NODE = {env_nodes} x {env_per_node} = {cluster}; pass trainer.nnodes={env_nodes} "
            f"trainer.n_gpus_per_node={env_per_node} (the run scripts do) or start the right number of nodes",
        )
    else:
        yield Finding("world_size", OK, f"{plural(nodes, 'node')} x {plural(per_node, 'NPU')} = {run.world} ranks")


def check_vllm_dp_size(run: Run) -> Iterator[Finding]:
    tp = int(run.config.actor_rollout_ref.rollout.tensor_model_parallel_size)
    try:
        dp = rollout_dp_size(run.world, tp)
    except DpEpConfigError:
        yield Finding(
            "vllm_dp_size",
            ERROR,
            f"world size {run.world} is not divisible by rollout tensor_model_parallel_size {tp}: one vLLM instance "
            f"cannot span all ranks; choose a TP that divides {run.world}",
        )
        return
    raw = run.env.get("VLLM_DP_SIZE")
    try:
        check_env_dp_size(raw, dp_size=dp, world_size=run.world, tp_size=tp)
    except DpEpConfigError as exc:
        yield Finding("vllm_dp_size", ERROR, str(exc))
        return
    if raw in (None, ""):
        yield Finding("vllm_dp_size", OK, f"VLLM_DP_SIZE unset; derived {dp} (= {run.world} / TP {tp})")
    else:
        yield Finding("vllm_dp_size", OK, f"VLLM_DP_SIZE={raw} = {run.world} / rollout TP {tp}")


def _no_model(run: Run) -> str:
    """Why a check that needs the model's config.json could not run."""
    if run.model_error:
        return "skipped: the model config cannot be read (see model_config)"
    return "skipped: needs the model's config.json (set MODEL_PATH / actor_rollout_ref.model.path)"


def check_pipeline_split(run: Run) -> Iterator[Finding]:
    if run.model is None or run.train is None:
        yield Finding("pipeline_split", SKIPPED, _no_model(run))
        return
    otc = run.config.actor_rollout_ref.actor.megatron.override_transformer_config
    layers = run.model.num_layers
    try:
        stages = run.train.stage_layers(layers)
    except LayoutError as exc:
        yield Finding("pipeline_split", ERROR, f"{exc} (model has {layers} decoder layers)")
        return
    mindspeed = mindspeed_stage_layers(otc.get("pipeline_num_transformer_layers"))
    if mindspeed is not None and mindspeed != stages:
        yield Finding(
            "pipeline_split",
            ERROR,
            f"MindSpeed pipeline_num_transformer_layers gives stages {mindspeed} (sum {sum(mindspeed)}, "
            f"{len(mindspeed)} stages) but Megatron's split is {stages} for {layers} layers over PP {run.train.pp}; "
            f"make both describe the same split (sum = num_hidden_layers {layers})",
        )
        return
    yield Finding("pipeline_split", OK, f"{layers} layers over PP {run.train.pp}: {stages}")


def check_expert_parallel(run: Run) -> Iterator[Finding]:
    train = run.train
    if train is None:
        return
    problems = world_split_problems(run.world, train.tp, train.pp, train.cp, train.ep, train.etp)
    rollout_ep = run.rollout.ep if run.rollout is not None else None
    if run.model is not None:
        experts, source = run.model.num_experts, f"{run.model.path}/config.json"
    else:
        known = known_model(run.config_name)
        experts = int(known[1]["n_routed_experts"]) if known and "n_routed_experts" in known[1] else None
        source = f"{known[0]}, from the table of known models (MODEL_PATH not set)" if known else ""
    if experts == 0 and train.ep > 1:
        problems.append(f"expert_model_parallel_size={train.ep} but the model is dense (no routed experts)")
    if experts:
        problems += expert_split_problems(experts, train.ep, rollout_ep)
    if problems:
        suffix = f" ({source})" if source and experts is not None else ""
        yield Finding("expert_parallel", ERROR, "; ".join(problems) + suffix)
    elif experts is None:
        yield Finding(
            "expert_parallel",
            SKIPPED,
            f"skipped the expert split (actor EP {train.ep}, rollout EP {rollout_ep or '?'}): the number of experts "
            "needs the model's config.json (set MODEL_PATH); world-size divisibility passed",
        )
    elif experts:
        yield Finding(
            "expert_parallel",
            OK,
            f"{experts} experts: actor EP {train.ep} ({experts // train.ep}/die), rollout EP {rollout_ep or '?'} "
            f"({source})",
        )
    else:
        yield Finding("expert_parallel", OK, f"dense model, no expert parallelism ({source})")


def check_batch_sizes(run: Run) -> Iterator[Finding]:
    cfg, train = run.config, run.train
    if train is None or run.world % train.model_parallel:
        return  # no integral DP size: reported by check_expert_parallel
    actor, rollout, ref = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.ref
    prompts, n = int(cfg.data.train_batch_size), int(rollout.n)
    mini = int(actor.ppo_mini_batch_size)
    seqs, mini_seqs = prompts * n, mini * n
    problems = []
    if actor.use_dynamic_bsz:
        yield Finding("batch_sizes", WARNING, "use_dynamic_bsz is on: micro-batch divisibility is not checked")
    else:
        micro = actor.ppo_micro_batch_size_per_gpu
        if micro is None:
            problems.append("actor.ppo_micro_batch_size_per_gpu is not set")
            micro = 1
        micro = int(micro)
        if prompts < mini or prompts % mini:
            problems.append(f"train_batch_size {prompts} is not a multiple of actor.ppo_mini_batch_size {mini}")
        if mini_seqs % (train.dp * micro):
            problems.append(
                f"mini-batch {mini} x n {n} = {mini_seqs} sequences is not divisible by actor DP {train.dp} x "
                f"ppo_micro_batch_size_per_gpu {micro} = {train.dp * micro}"
            )
        for name, section in (("rollout", rollout), ("ref", ref)):
            lp_micro = section.log_prob_micro_batch_size_per_gpu
            if lp_micro is None:
                continue
            if seqs % (train.dp * int(lp_micro)):
                problems.append(
                    f"{seqs} sequences are not divisible by actor DP {train.dp} x {name}."
                    f"log_prob_micro_batch_size_per_gpu {lp_micro}"
                )
    if run.rollout is not None and seqs % run.rollout.dp:
        problems.append(
            f"{prompts} prompts x n {n} = {seqs} sequences are not divisible by the rollout DP size "
            f"{run.rollout.dp} (= world / rollout TP)"
        )
    if problems:
        yield Finding("batch_sizes", ERROR, "; ".join(problems) + "; change the batch sizes or the layout")
        return
    message = f"{prompts} prompts x {n} = {seqs} sequences; actor DP {train.dp}"
    if run.rollout is not None:
        per_dp = seqs // run.rollout.dp
        message += f"; {per_dp} sequences per vLLM DP rank"
        if per_dp > int(rollout.max_num_seqs):
            yield Finding(
                "batch_sizes",
                WARNING,
                f"{per_dp} sequences per vLLM DP rank exceed rollout.max_num_seqs {rollout.max_num_seqs}: the "
                f"rollout runs in {-(-per_dp // int(rollout.max_num_seqs))} waves (slower, not wrong)",
            )
    yield Finding("batch_sizes", OK, message)


def check_recipe(run: Run) -> Iterator[Finding]:
    """The recipe entry point's own refusal rules (rollout mode, strategy, device, patch switches)."""
    from r1_ascend.recipe.checks import check_recipe_config

    problems = check_recipe_config(run.config, resolve_classes=False, environ=run.full_env)
    for problem in problems:
        yield Finding("recipe_config", ERROR, problem)
    if not problems:
        rollout = run.config.actor_rollout_ref.rollout
        yield Finding("recipe_config", OK, f"rollout {rollout.name}/{rollout.mode} on {run.config.trainer.device}")


def check_rollout_engine(run: Run) -> Iterator[Finding]:
    from r1_ascend.patches.rules.rollout_config import (
        RolloutConfigError,
        ascend_scheduler_options,
        check_batched_tokens,
        check_engine_options,
        max_model_len,
    )
    from r1_ascend.patches.rules.switches import read_switches

    switches = read_switches(run.full_env, strict=False)  # unknown names are reported by check_recipe
    rollout = run.config.actor_rollout_ref.rollout
    problems = []
    try:
        check_batched_tokens(rollout)
    except RolloutConfigError as exc:
        problems.append(str(exc))
    if run.model is not None:
        dp_size = run.rollout.dp if run.rollout is not None else 1
        problems += check_engine_options(
            rollout,
            model_type=run.model.model_type,
            is_moe=run.model.is_moe,
            dp_size=dp_size,
            dp_groups=switches.enabled("vllm_dp_ep_groups"),
            offload=switches.enabled("vllm_rollout_offload"),
            live_params=switches.enabled("vllm_ascend_torchair_live_params"),
        )
    if switches.enabled("verl_rollout_guard"):
        from r1_ascend.patches.rules.rollout_guard import config_problems

        problems += config_problems(run.config)
    if not str(rollout.load_format).startswith("dummy"):
        problems.append(
            f"actor_rollout_ref.rollout.load_format={rollout.load_format}: the rollout gets its weights from the "
            "actor every step, loading them from disk again only costs time and host memory; use dummy"
        )
    if problems:
        for problem in problems:
            yield Finding("rollout_engine", ERROR, problem)
        return
    scheduler = ascend_scheduler_options(rollout)
    yield Finding(
        "rollout_engine",
        OK,
        f"max_num_batched_tokens {rollout.max_num_batched_tokens} vs max_model_len {max_model_len(rollout)} "
        f"(Ascend scheduler {'on' if scheduler.get('enabled') else 'off'}, chunked prefill "
        f"{'on' if scheduler.get('enable_chunked_prefill') else 'off'})",
    )


def check_context_length(run: Run) -> Iterator[Finding]:
    if run.model is None:
        yield Finding("context_length", SKIPPED, _no_model(run))
        return
    cfg = run.config
    total = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
    limit = run.model.max_position_embeddings
    problems = []
    if limit is None:
        problems.append(f"{run.model.path}/config.json has no max_position_embeddings")
    elif total > limit:
        problems.append(
            f"max_prompt_length + max_response_length = {total} exceeds the model's max_position_embeddings {limit}"
        )
    max_len = cfg.actor_rollout_ref.rollout.max_model_len
    if max_len is not None and int(max_len) < total:
        problems.append(f"rollout.max_model_len {max_len} is shorter than prompt + response {total}")
    seq_length = cfg.actor_rollout_ref.actor.megatron.override_transformer_config.get("seq_length")
    if seq_length is not None and int(seq_length) < total:
        problems.append(
            f"override_transformer_config.seq_length {seq_length} is shorter than prompt + response ({total})"
        )
    if problems:
        yield Finding("context_length", ERROR, "; ".join(problems))
    else:
        yield Finding("context_length", OK, f"prompt + response = {total} <= max_position_embeddings {limit}")


def check_model_config(run: Run) -> Iterator[Finding]:
    if run.model_error:
        yield Finding("model_config", ERROR, run.model_error)
        return
    model = run.model
    if model is None:
        yield Finding("model_config", SKIPPED, _no_model(run))
        return
    problems = []
    if model.mtp_layers:
        problems.append(
            f"num_nextn_predict_layers={model.mtp_layers}: verl 0.6.1 cannot train MTP layers; set it to 0 "
            "(r1-ascend convert-weights fixes config.json)"
        )
    if model.has_quantization:
        problems.append(
            "config.json has a quantization_config: the BF16 weights would be treated as FP8; remove it "
            "(r1-ascend convert-weights fixes config.json)"
        )
    if problems:
        yield Finding("model_config", ERROR, f"{model.path}/config.json: " + "; ".join(problems))
        return
    assert model.path is not None
    tokenizer = [n for n in ("tokenizer.json", "tokenizer.model", "vocab.json") if (model.path / n).is_file()]
    if not tokenizer:
        yield Finding(
            "model_config",
            WARNING,
            f"{model.path} has no tokenizer file (tokenizer.json / tokenizer.model / vocab.json); copy the model's "
            "tokenizer files next to config.json before the run",
        )
    yield Finding(
        "model_config",
        OK,
        f"{model.model_type}: {model.num_layers} layers, {model.num_experts or 'no'} experts, "
        f"{human_count(model.total_params())} params, MTP off, no quantization",
    )


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def check_data(run: Run) -> Iterator[Finding]:
    from r1_ascend.launch.parquet_schema import describe_problems

    cfg = run.config
    keys = {"prompt": str(cfg.data.prompt_key), "reward_fn": str(cfg.data.reward_fn_key)}
    for split, value in (("train", cfg.data.train_files), ("val", cfg.data.val_files)):
        files = _as_list(value)
        if not files:
            continue
        rows = 0
        failed = False
        for name in files:
            problems, count = describe_problems(Path(name).expanduser(), keys)
            rows += count
            for problem in problems:
                failed = True
                yield Finding("data", ERROR, f"{split} file {name}: {problem}")
        if failed:
            continue
        if split == "train" and rows < int(cfg.data.train_batch_size):
            yield Finding(
                "data",
                ERROR,
                f"train data has {rows} rows, fewer than one batch (train_batch_size {cfg.data.train_batch_size})",
            )
            continue
        yield Finding("data", OK, f"{split}: {len(files)} file(s), {rows} rows, verl schema")


def check_checkpoint(run: Run) -> Iterator[Finding]:
    cfg = run.config
    actor = cfg.actor_rollout_ref.actor.megatron
    if not actor.use_dist_checkpointing:
        yield Finding("checkpoint", OK, "actor loads HF weights (use_dist_checkpointing off)")
        return
    path_value = actor.dist_checkpointing_path
    if not path_value:
        return  # reported by check_paths
    path = Path(str(path_value)).expanduser()
    problems = []
    if not path.is_dir():
        yield Finding("checkpoint", ERROR, f"dist checkpoint directory {path} does not exist (DIST_CKPT_DIR)")
        return
    for name in ("metadata.json", ".metadata", "common.pt"):
        if not (path / name).is_file():
            problems.append(f"missing {name}")
    if (path / "metadata.json").is_file():
        try:
            meta = json.loads((path / "metadata.json").read_text(encoding="utf-8"))
        except ValueError as exc:
            problems.append(f"metadata.json is not JSON ({exc})")
        else:
            if meta.get("sharded_backend") != "torch_dist":
                problems.append(f"metadata.json sharded_backend is {meta.get('sharded_backend')!r}, not 'torch_dist'")
    if not any(path.glob("*.distcp")):
        problems.append("no *.distcp data files")
    mismatch = _checkpoint_model_mismatch(path, run.model) if run.model is not None else None
    ref = cfg.actor_rollout_ref.ref.megatron
    if (
        ref.use_dist_checkpointing
        and ref.dist_checkpointing_path
        and str(ref.dist_checkpointing_path) != str(path_value)
    ):
        yield Finding(
            "checkpoint",
            WARNING,
            f"reference checkpoint {ref.dist_checkpointing_path} differs from the actor's {path_value}; GRPO's KL "
            "reference is normally the initial actor",
        )
    if problems:
        yield Finding(
            "checkpoint",
            ERROR,
            f"{path} is not a complete Megatron dist checkpoint: {'; '.join(problems)} (r1-ascend convert-weights)",
        )
    if mismatch:
        yield Finding("checkpoint", ERROR, f"{path} does not belong to {run.model.path}: {mismatch}")
    if not problems and not mismatch:
        yield Finding("checkpoint", OK, f"{path}: torch_dist checkpoint (loads at any TP/PP/EP)")


def check_resume_checkpoint(run: Run) -> Iterator[Finding]:
    """The checkpoint a relaunch resumes from is complete, by the rule patch ``verl_checkpoint_integrity`` enforces
    in the trainer: a partial ``global_step_N`` or a silent restart from step 0 is found before the cards are taken.
    ``default_local_dir`` is resolved against the working directory, as verl resolves it."""
    trainer = run.config.trainer
    mode = trainer.get("resume_mode")
    if mode == "disable":
        yield Finding("checkpoint", OK, "trainer.resume_mode=disable: starts from step 0, checkpoints are not read")
        return
    if trainer.get("default_hdfs_dir") is not None:
        yield Finding("checkpoint", SKIPPED, "skipped: resume from trainer.default_hdfs_dir (verl refuses it)")
        return
    root = Path(os.path.abspath(str(trainer.default_local_dir)))
    resume_from = None
    if mode == "resume_path" and trainer.get("resume_from_path"):
        resume_from = Path(os.path.abspath(str(trainer.resume_from_path)))
    decision = resume_decision(root, resume_from=resume_from)
    yield Finding("checkpoint", OK if decision.ok else ERROR, f"resume ({mode}): {decision.message}")


#: Largest ``.metadata`` scanned for layer keys (a 671B checkpoint's is a few tens of MB).
_MAX_METADATA_SCAN = 512 * 1024 * 1024
_LAYER_KEY = re.compile(rb"decoder\.layers\.(\d+)\.")


def _checkpoint_layers(path: Path) -> set[int]:
    """Global decoder-layer numbers named in a dist checkpoint's ``.metadata``, without unpickling it.

    The pickled DCP metadata stores every tensor key as plain UTF-8 (``decoder.layers.<global layer>.…``, the layer
    number is global because verl's DeepSeek/Qwen layers use global keys), so a byte scan finds them without torch.
    Returns an empty set when the file is unreadable or names no layer (the check is then skipped).
    """
    meta = path / ".metadata"
    try:
        if meta.stat().st_size > _MAX_METADATA_SCAN:
            return set()
        data = meta.read_bytes()
    except OSError:
        return set()
    return {int(m) for m in _LAYER_KEY.findall(data)}


def _checkpoint_model_mismatch(path: Path, model: ModelInfo) -> str | None:
    """Why the checkpoint cannot be this model's (layer count from our manifest or from the keys), or None."""
    expected = model.num_layers
    manifest = read_megatron_manifest(path)
    if manifest is not None and manifest.num_layers is not None:
        layers = manifest.num_layers
        if layers != expected:
            return (
                f"it was converted for {layers} decoder layers but the model has {expected}; "
                "convert the checkpoint of this model"
            )
    found = _checkpoint_layers(path)
    if found and found != set(range(expected)):
        return (
            f"its keys name {len(found)} decoder layers (decoder.layers.{min(found)}..{max(found)}) but the model has "
            f"{expected}; it was converted from another model: convert the checkpoint of this model"
        )
    return None


def check_patches(run: Run) -> Iterator[Finding]:
    if not run.check_patches:
        yield Finding("patches", WARNING, "patch targets not checked (--skip-patches)")
        return
    from r1_ascend.doctor import patch_rows

    rows = patch_rows(deep=False)
    failed = [r for r in rows if r.verdict == "FAIL"]
    for row in failed:
        yield Finding("patches", ERROR, f"{row.item}: {row.found} (expected {row.expected}); see r1-ascend doctor")
    if not failed:
        yield Finding("patches", OK, f"{len(rows)} patches resolve on the installed stack")


def check_memory(run: Run) -> Iterator[Finding]:
    if run.model is None:
        yield Finding("memory", SKIPPED, _no_model(run))
        return
    if run.train is None or run.rollout is None or run.stages is None:
        yield Finding("memory", SKIPPED, "skipped: the layout or pipeline split is invalid (see the errors above)")
        return
    try:
        run.memory = estimate(
            MemoryInputs(
                run.model,
                run.train,
                run.stages,
                run.rollout.tp,
                run.rollout.dp,
                run.config,
                run.die_bytes,
                run.full_env,
            )
        )
    except ValueError as exc:  # a malformed memory-related environment variable (HCCL_BUFFSIZE)
        yield Finding("memory", ERROR, str(exc))
        return
    for phase in run.memory:
        share = phase.total / phase.budget_bytes if phase.budget_bytes else 0.0
        text = (
            f"{phase.phase}: ~{phase.total / GIB:.1f} GiB per die of {phase.budget_bytes / GIB:.1f} GiB "
            f"({phase.budget_label}), {share:.0%}"
        )
        if share > 1.0:
            yield Finding("memory", ERROR, text + "; reduce batch/sequence sizes, enable offload or add nodes")
        elif share > 0.9:
            yield Finding("memory", WARNING, text + "; little headroom for fragmentation")
        else:
            yield Finding("memory", OK, text)


def check_trainer(run: Run) -> Iterator[Finding]:
    cfg = run.config
    trainer = cfg.trainer
    problems, warnings = [], []
    if cfg.data.reward_fn_key != "data_source":
        warnings.append(f"data.reward_fn_key={cfg.data.reward_fn_key}; the shipped data sets data_source")
    reward = cfg.custom_reward_function.path
    if run.reward_error:
        problems.append(run.reward_error)
    elif reward and not Path(str(reward)).expanduser().is_file():
        problems.append(
            f"custom_reward_function.path {reward} does not exist (a relative path is read from the directory the "
            "run starts in; name a module with pkg://MODULE or give an absolute path)"
        )
    if "wandb" in list(trainer.logger):
        warnings.append("trainer.logger includes wandb, which needs network access; offline use console,tensorboard")
    for problem in problems:
        yield Finding("trainer", ERROR, problem)
    for warning in warnings:
        yield Finding("trainer", WARNING, warning)
    if not problems:
        yield Finding(
            "trainer",
            OK,
            f"{trainer.total_training_steps} steps, save every {trainer.save_freq}, "
            f"resume {trainer.resume_mode}, loggers {list(trainer.logger)}",
        )


CHECKS: tuple[Callable[[Run], Iterable[Finding]], ...] = (
    check_paths,
    check_output_dir,
    check_world_size,
    check_vllm_dp_size,
    check_pipeline_split,
    check_expert_parallel,
    check_batch_sizes,
    check_recipe,
    check_rollout_engine,
    check_context_length,
    check_model_config,
    check_data,
    check_checkpoint,
    check_resume_checkpoint,
    check_trainer,
    check_patches,
    check_memory,
)
