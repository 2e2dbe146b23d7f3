"""The console summaries: the plain rehearsal's, a fault scenario's outcome, and a resumed run's."""

from __future__ import annotations


def print_summary(summary: dict[str, object]) -> None:
    steps = summary["steps_run"]
    assert isinstance(steps, dict)
    print("rehearse: ok")
    print(f"  nodes joined:      {summary['nodes_joined']}")
    print(f"  NPUs seen:         {summary['npus_seen']:g}")
    print(f"  steps run:         {'; '.join(f'{k}: {v}' for k, v in steps.items())}")
    print(f"  killed in step:    {summary['killed_in_step']}")
    print(f"  resumed from step: {summary['resumed_from_step']}")
    print(f"  rollout lifecycle: {summary['lifecycle']}")
    print(f"  overlay preludes:  {summary['preludes']}")
    if "sampling" in summary:
        print(f"  vLLM sampler:      {summary['sampling']}")
    if "weight_loading" in summary:
        print(f"  vLLM weight load:  {summary['weight_loading']}")
    if "vllm_groups" in summary:
        print(f"  vLLM groups:       {summary['vllm_groups']}")
    print(f"  checkpoint loads:  {summary['checkpoint_loads']}")
    model = summary["model"]
    assert isinstance(model, dict)
    layout = ", ".join(f"{k.upper()} {v}" for k, v in model["layout"].items())
    print(f"  actor model:       {model['class']}, {model['parameters_per_rank']} parameters per rank; {layout}")
    reward = summary["reward"]
    assert isinstance(reward, dict)
    curve = summary["reward_curve"]
    assert isinstance(curve, dict)
    print(
        f"  reward:            {reward['first']:.3f} over the first {reward['window']} steps -> {reward['last']:.3f} "
        f"over the last {reward['window']} ({len(curve)} steps: {', '.join(f'{v:.2f}' for v in curve.values())})"
    )
    print(f"  rollout-actor gap: {summary['rollout_actor_gap_max']:.2e} nat (largest step mean |Δ log-prob|)")
    print_moe(summary["moe"])
    exported = summary["export"]
    assert isinstance(exported, dict)
    print(
        f"  exported:          {exported['hf_dir']} (to-hf; transformers loads it strictly, "
        f"{exported['parameters']} parameters; {exported['prompt']!r} -> {exported['answer']!r})"
    )
    print(f"  report:            {summary['report']}")
    print(
        f"  wall time:         {summary['wall_s']} s; summed peak RSS {summary['peak_rss_gib']} GiB over "
        f"{summary['processes_sampled']} processes; at one moment at most {summary['concurrent_peak_pss_gib']} GiB "
        f"in use (PSS; {summary['concurrent_peak_rss_gib']} GiB summing RSS, which counts shared pages per process)"
    )


def print_moe(moe: object) -> None:
    """The MoE verdicts' figures (r1_ascend.rehearse.expert_checks)."""
    assert isinstance(moe, dict)
    experts = moe["experts"]
    print(
        f"  experts:           every expert of {experts['layers']} MoE layers routed "
        f"(fewest tokens of an expert over the run: {experts['fewest_tokens']:g}); smallest expert-parallel rank "
        f"share {moe['smallest_ep_share']:.1%} of a layer's tokens in a step"
    )
    moves = ", ".join(f"{m['step']}: {m['largest_bias_change']:.4f}" for m in moe["bias_moves"])
    print(f"  expert bias moved: largest change per step {moves}")
    follows = ", ".join(
        f"{d['after_update_of_step']}: {d['engine_vs_actor']:.1g} "
        f"(actor's moved {d['actor_moved_since_first_update']:.3f})"
        for d in moe["engine_bias"]
    )
    print(f"  engine bias:       |engine - actor| at the syncs after the update of step {follows}")


def print_outcome(kind: str, verdict: str, summary: dict[str, object], keys: tuple[str, ...]) -> None:
    """``summary[kind]`` (a fault's outcome, with its ``name``) line by line, then the run's ``keys`` it has."""
    fault = summary[kind]
    assert isinstance(fault, dict)
    print(f"rehearse --{kind.replace('_', '-')} {fault['name']}: {verdict}")
    rows = [(key, value) for key, value in fault.items() if key != "name"]
    rows += [(key, summary[key]) for key in keys if key in summary]
    for key, value in rows:
        print(f"  {key + ':':28} {value}")


def print_control(summary: dict[str, object]) -> None:
    """A control run's verdict and reward curve."""
    control, reward, curve = summary["control"], summary["reward"], summary["reward_curve"]
    assert isinstance(control, dict)
    assert isinstance(reward, dict)
    assert isinstance(curve, dict)
    print(f"rehearse, control run {control['name']}: ok, the reward did not rise")
    print(
        f"  reward:            {reward['first']:.3f} over the first {reward['window']} steps -> {reward['last']:.3f} "
        f"over the last {reward['window']} ({len(curve)} steps: {', '.join(f'{v:.2f}' for v in curve.values())})"
    )
    print(f"  rollout-actor gap: {summary['rollout_actor_gap_max']:.2e} nat (largest step mean |Δ log-prob|)")
    print(f"  vLLM sampler:      {summary['sampling']}")
    print(f"  vLLM weight load:  {summary['weight_loading']}")
    if "vllm_groups" in summary:
        print(f"  vLLM groups:       {summary['vllm_groups']}")
    print(f"  wall time:         {summary['wall_s']} s")


def print_resume_summary(summary: dict[str, object]) -> None:
    print("rehearse --resume: ok")
    for key in ("nodes_joined", "resumed_from_step", "steps_run", "lifecycle", "checkpoint_loads", "wall_s"):
        print(f"  {key + ':':20} {summary[key]}")
