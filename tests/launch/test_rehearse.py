"""``r1-ascend rehearse``: the project's integration test (the whole run on CPU), plus its lifecycle checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend.rehearse.config import Plan
from r1_ascend.rehearse.lifecycle import (
    CYCLE,
    REQUIRED_PATCHES,
    LifecycleError,
    check_lifecycle,
    check_preludes,
    check_sequence,
)

pytestmark = pytest.mark.machine


def _events(pid: int, names: list[str]) -> list[dict]:
    return [{"t": float(i), "pid": pid, "event": name} for i, name in enumerate(names)]


def test_whole_cycles_pass_and_count_generations() -> None:
    assert check_sequence(["release", *CYCLE, *CYCLE], complete=True) == 2


@given(st.permutations(CYCLE))
def test_any_other_order_fails(order: list[str]) -> None:
    sequence = ["release", *order]
    if tuple(order) == CYCLE:
        assert check_sequence(sequence, complete=True) == 1
    else:
        with pytest.raises(LifecycleError, match="expected"):
            check_sequence(sequence, complete=True)


@given(st.integers(min_value=0, max_value=len(CYCLE) - 1))
def test_a_killed_worker_may_stop_mid_cycle_a_finished_one_may_not(cut: int) -> None:
    sequence = ["release", *CYCLE, *CYCLE[:cut]]
    assert check_sequence(sequence, complete=False) == 1 + ("generate" in CYCLE[:cut])
    if cut:
        with pytest.raises(LifecycleError, match="stops inside a cycle"):
            check_sequence(sequence, complete=True)


def test_missing_first_release_fails() -> None:
    with pytest.raises(LifecycleError, match="released right after it is built"):
        check_lifecycle(_events(7, list(CYCLE)), killed_pids=set())


def test_preludes_must_name_every_required_patch() -> None:
    events = _events(11, ["release"])
    good = f"(WorkerDict pid=11) r1-ascend overlay (pid 11): applied={','.join(REQUIRED_PATCHES)} already=none"
    assert "1 workers" in check_preludes([good], events)
    partial = f"r1-ascend overlay (pid 11): applied={REQUIRED_PATCHES[0]} already=none disabled=none"
    with pytest.raises(LifecycleError, match="did not apply"):
        check_preludes([partial], events)
    with pytest.raises(LifecycleError, match="logged no"):
        check_preludes([""], events)


@pytest.mark.slow
def test_rehearsal_runs_kills_resumes_and_reports(tmp_path: Path, weights: Path, rehearse) -> None:
    """The shipped plan end to end (the checkpoint conversion it does without ``--weights`` is the session's
    ``weights`` fixture, the same ``make_weights``)."""
    out = tmp_path / "rehearse"
    done = rehearse("--output-dir", str(out), "--weights", str(weights), timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    summary = json.loads((out / "summary.json").read_text())
    plan = Plan()
    assert summary["npus_seen"] == 2
    assert summary["nodes_joined"] == "127.0.0.2 (1 NPU), 127.0.0.3 (1 NPU)"
    assert summary["resumed_from_step"] == plan.save_freq
    assert summary["killed_in_step"] == plan.save_freq + 1
    assert summary["steps_run"]["run 2 (resumed)"] == list(range(plan.save_freq + 1, plan.total_steps + 1))
    assert Path(summary["report"]).is_file()
    assert f"resumed from step: {plan.save_freq}" in done.stdout
    # the head kept each launch's console under OUTPUT_DIR, the report was made from those logs, and run 2 was the
    # documented relaunch: `ray_start_npu.sh restart` on every node, the worker staying joined
    first, second = (Path(p) for p in summary["head_logs"])
    assert first.parent == second.parent == out / "logs"
    assert "Training Progress" in first.read_text() or "step:1 " in first.read_text()
    assert "restart: keeping the Ray head" in second.read_text()
    assert "Setting global step to" in second.read_text() or f"step:{plan.total_steps} " in second.read_text()
    assert "still joined" in (out / "nodes" / "127.0.0.3" / "restart.log").read_text()
    report = Path(summary["report"]).read_text()
    assert "report-inputs" in report or first.name in report
    # the real model learned: megatron-core's GPTModel at EP 2, the reward rising (the rehearsal's own verdict
    # requires a rise; this is the guide), the rollout engine close to the actor
    assert summary["model"]["class"] == "megatron.core.models.gpt.gpt_model.GPTModel"
    assert summary["model"]["layout"]["ep"] == plan.actor_ep
    assert summary["reward"]["first"] <= 0.3, summary["reward_curve"]
    assert summary["reward"]["last"] >= 0.6, summary["reward_curve"]
    assert summary["rollout_actor_gap_max"] < 0.05
    assert "sampled by vLLM's Sampler.forward as verl_rollout_guard replaced it" in summary["sampling"]
    assert "CustomDeepseekV3ForCausalLM.load_weights" in summary["weight_loading"]
    left = subprocess.run(["pgrep", "-f", summary["ray_temp_dir"]], capture_output=True, text=True, check=False)
    assert left.stdout.split() == [], f"processes left under {summary['ray_temp_dir']}"
    if summary["netns"]:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        assert summary["netns"] not in names


#: Steps of each control in the full tier: the learning run's first 6 steps already rise by 0.25-0.4 (its curve,
#: docs/launch.md), past the flat verdict's 0.2, so 6 steps tell a learning control from a flat one; 10 steps of
#: both controls beside the other slow tests took the full tier to 86 minutes of CI's 90 (docs/benchmarks.md).
CONTROL_STEPS = 6


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "control"), [(["--lr", "0"], "lr0"), (["--shuffle-rewards"], "shuffled-rewards")], ids=["lr0", "shuffled"]
)
def test_a_control_run_does_not_raise_the_reward(
    tmp_path: Path, weights: Path, rehearse, argv: list[str], control: str
) -> None:
    """The controls: the same rehearsal at learning rate 0 trains nothing, and with each batch's rewards permuted
    across its responses the updates carry no signal; in both the reward stays at its base rate (the command's own
    verdict, ``training.check_flat``, checked again here from the summary)."""
    out = tmp_path / f"rehearse-{control}"
    args = ["--output-dir", str(out), *argv, "--weights", str(weights), "--steps", str(CONTROL_STEPS)]
    done = rehearse(*args, timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    summary = json.loads((out / f"summary-control-{control}.json").read_text())
    reward = summary["reward"]
    assert summary["control"] == {"name": control, "verdict": "did not learn"}
    assert len(summary["reward_curve"]) == CONTROL_STEPS, summary["reward_curve"]
    assert reward["last"] - reward["first"] < 0.2, reward
    assert reward["last"] < 0.5, reward
    assert "sampled by vLLM's Sampler.forward as verl_rollout_guard replaced it" in summary["sampling"]
    assert "CustomDeepseekV3ForCausalLM.load_weights" in summary["weight_loading"]
    shuffled = [e for e in _records(out) if e["event"] == "shuffle_rewards"]
    assert bool(shuffled) is (control == "shuffled-rewards")


def _records(out: Path) -> list[dict]:
    lines = (line for path in (out / "lifecycle").glob("*.log") for line in path.read_text().splitlines())
    return [json.loads(line) for line in lines if line.strip()]


@pytest.mark.slow
def test_ctrl_c_stops_everything_it_started(tmp_path: Path, weights: Path) -> None:
    """SIGINT once run 1 is under way: exit 130, no process left under its Ray temp dir, namespace deleted."""
    import re
    import signal
    import time

    out = tmp_path / "rehearse"
    cmd = [sys.executable, "-m", "r1_ascend.cli", "rehearse", "--output-dir", str(out), "--weights", str(weights)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + 900
    for line in proc.stdout:
        seen += line
        if "run 1: the head runs the recipe entry point" in line or time.monotonic() > deadline:
            break
    cluster = re.search(r"on (?:network namespace (\S+)|the host's loopback).*Ray temp dir (\S+)", seen)
    assert cluster, seen
    netns, temp_dir = cluster.groups()
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, seen + rest
    assert "everything it started has been stopped" in rest
    left = subprocess.run(["pgrep", "-f", temp_dir], capture_output=True, text=True, check=False)
    assert left.stdout.split() == [], f"processes left under {temp_dir}"
    if netns:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        assert netns not in names


def test_rehearsal_config_composes_and_passes_the_recipe_checks(tmp_path: Path) -> None:
    """The derived config is the smoke config plus overrides that Hydra accepts and the recipe does not refuse."""
    from hydra import compose, initialize_config_dir

    from r1_ascend.patches import apply_one, restore_all, spec_by_name
    from r1_ascend.recipe.checks import check_recipe_config
    from r1_ascend.recipe.main_grpo import CONFIG_DIR, prepare_config
    from r1_ascend.rehearse.config import CONFIG_NAME, Plan, overrides
    from r1_ascend.rehearse.inputs import Inputs

    plan = Plan()
    inputs = Inputs(tmp_path / "model", tmp_path / "mcore", tmp_path / "data")
    with initialize_config_dir(CONFIG_DIR, version_base=None):
        config = compose(CONFIG_NAME, overrides=overrides(plan, inputs, tmp_path))
    assert config.trainer.nnodes * config.trainer.n_gpus_per_node == plan.world
    megatron = config.actor_rollout_ref.actor.megatron
    assert megatron.use_dist_checkpointing
    assert megatron.dist_checkpointing_path == str(inputs.dist_ckpt)
    assert config.actor_rollout_ref.ref.megatron.dist_checkpointing_path == str(inputs.dist_ckpt)
    assert megatron.expert_model_parallel_size == plan.actor_ep
    assert megatron.override_transformer_config.use_cpu_initialization
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == plan.world
    assert config.trainer.resume_mode == "auto"
    assert config.trainer.save_freq < config.trainer.total_training_steps
    apply_one(spec_by_name("vllm_rollout_offload"))
    try:
        prepare_config(config)
        assert check_recipe_config(config, environ={}) == []
    finally:
        restore_all()
    modules = config.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES.split(",")
    assert modules == ["r1_ascend.patches.prelude", "r1_ascend.rehearse.worker_hooks"]


def plans_handed_over(monkeypatch: pytest.MonkeyPatch) -> list[Plan]:
    """The plans ``r1-ascend rehearse`` hands to the run, which then stops at once (``main`` returns 1): what its
    arguments became, without starting anything."""
    from r1_ascend.rehearse import run

    seen: list[Plan] = []

    def capture(out: Path, plan: Plan, *_: object) -> dict:
        seen.append(plan)
        raise run.RehearsalError("stopped by the test")

    monkeypatch.setattr(run, "rehearse", capture)
    return seen


@pytest.mark.parametrize(("steps", "save", "judged"), [(10, 5, True), (12, 6, True), (4, 2, False), (2, 1, False)])
def test_steps_set_the_kill_and_whether_learning_is_judged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, steps: int, save: int, judged: bool
) -> None:
    from r1_ascend.rehearse import run

    seen = plans_handed_over(monkeypatch)
    assert run.main(["--output-dir", str(tmp_path), "--steps", str(steps)]) == 1
    (plan,) = seen
    assert (plan.total_steps, plan.save_freq, plan.test_freq) == (steps, save, save)
    assert (plan.min_reward_rise is not None) is judged


@pytest.mark.parametrize(
    "argv", [["--steps", "1"], ["--steps", "4", "--fault", "disk-full"], ["--steps", "4", "--resume"]]
)
def test_steps_that_cannot_work_are_refused(tmp_path: Path, argv: list[str]) -> None:
    from r1_ascend.rehearse import run

    with pytest.raises(SystemExit) as exc:
        run.main(["--output-dir", str(tmp_path), *argv])
    assert exc.value.code == 2


def test_progress_lines_to_a_closed_stdout_do_not_stop_what_follows(tmp_path: Path) -> None:
    """``rehearse | head``: once the reader is gone, a progress line must not raise in the cleanup that follows."""
    marker = tmp_path / "cleanup-ran"
    code = (
        "import pathlib, time\n"
        "from r1_ascend.rehearse.progress import log_progress\n"
        "time.sleep(1.0)\n"  # the reader has closed its end by now
        "for _ in range(3):\n"
        "    log_progress('stopping the drivers and the Ray nodes (recorded pids)')\n"
        f"pathlib.Path({str(marker)!r}).write_text('ok')\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stderr is not None
    child.stdout.close()
    stderr = child.stderr.read().decode(errors="replace")
    assert child.wait(120) == 0, stderr[-3000:]
    assert marker.read_text() == "ok"


@pytest.mark.parametrize(
    ("argv", "accepted"),
    [
        (["--npus-per-node", "2", "--actor-pp", "2", "--rollout-dp", "2"], True),
        (["--npus-per-node", "2", "--rollout-dp", "4"], True),  # TP 1
        (["--npus-per-node", "2", "--actor-pp", "4"], False),  # DP 1 cannot hold the actor's EP 2
        (["--actor-pp", "2"], False),  # a world of 2 in 2 stages: DP 1
        (["--npus-per-node", "2", "--actor-pp", "3"], False),  # 3 does not divide 4
        (["--actor-pp", "0"], False),
        (["--npus-per-node", "2", "--rollout-dp", "3"], False),
        (["--rollout-dp", "0"], False),
    ],
)
def test_layouts_the_world_cannot_hold_are_refused_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], accepted: bool
) -> None:
    from r1_ascend.rehearse import run

    seen = plans_handed_over(monkeypatch)
    if accepted:
        assert run.main(["--output-dir", str(tmp_path), *argv]) == 1
        (plan,) = seen
        asked = dict(zip(argv[::2], map(int, argv[1::2]), strict=True))
        assert (plan.actor_pp, plan.rollout_dp) == (asked.get("--actor-pp", 1), asked.get("--rollout-dp", 1))
        return
    with pytest.raises(SystemExit) as exc:
        run.main(["--output-dir", str(tmp_path), *argv])
    assert exc.value.code == 2
    assert seen == []
    flag = "--actor-pp" if "--actor-pp" in argv else "--rollout-dp"
    assert flag in capsys.readouterr().err
