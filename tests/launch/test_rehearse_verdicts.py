"""The rehearsal's own verdicts on recorded runs: a healthy run passes, every broken run fails with its reason.

The healthy run is ``data/rehearsal/`` (README there): excerpts of a real rehearsal's ``run1.log``/``run2.log`` and
its lifecycle records. Each broken run is that record with one fault planted. ``verdicts.judge`` is what ``rehearse``
calls once both runs are over, so each case goes through every verdict, and must fail with its own message.

The mutation tests weaken one check at a time (a source edit of the verdict function, exec'd and monkeypatched in)
and assert that the broken-run cases then no longer all give their expected verdict: each check has a case that
needs it.
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from r1_ascend.rehearse import lifecycle, verdicts
from r1_ascend.rehearse.config import Plan
from r1_ascend.rehearse.lifecycle import CYCLE, LifecycleError
from r1_ascend.rehearse.progress import RehearsalError

DATA = Path(__file__).parent / "data" / "rehearsal"
#: the recorded run's plan: 2 nodes x 1 NPU, 4 steps of 4 prompts x 2 samples, checkpoint and validation every 2
PLAN = Plan(total_steps=4, save_freq=2, test_freq=2, prompts_per_step=4, samples_per_prompt=2, response_length=24)
KILLED_STEP = 3
#: Pids that had written a lifecycle record when run 1's driver was killed (22661: the TaskRunner, no rollout).
KILLED_PIDS = frozenset({22661, 22820, 22821})
KILLED_WORKERS = (22820, 22821)
RESUMED_WORKERS = (23700, 23701)


@dataclass(frozen=True)
class Recorded:
    """What a finished rehearsal leaves behind, in memory: log texts, lifecycle records, files on disk."""

    run1: str
    run2: str
    records: dict[int, list[dict]]  # pid -> its lifecycle-<pid>.log lines
    checkpoint_files: tuple[str, ...] = tuple(
        f"global_step_{step}/{name}"
        for step in (2, 4)
        for name in (
            "data.pt",
            "actor/dist_ckpt/metadata.json",
            "actor/dist_ckpt/.metadata",
            "actor/dist_ckpt/common.pt",
            "actor/dist_ckpt/__0_0.distcp",
            "actor/dist_ckpt/__0_1.distcp",
            "actor/dist_ckpt/__1_0.distcp",
            "actor/dist_ckpt/__1_1.distcp",
        )
    )
    tensorboard_files: tuple[str, ...] = ("events.out.tfevents.1795632823.vm.22661.0",)
    killed_pids: frozenset[int] = KILLED_PIDS
    killed_step: int = KILLED_STEP
    plan: Plan = field(default=PLAN)

    def write(self, out: Path) -> list[Path]:
        if out.exists():
            shutil.rmtree(out)
        (out / "lifecycle").mkdir(parents=True)
        (out / "tensorboard").mkdir()
        for pid, lines in self.records.items():
            text = "".join(json.dumps(line) + "\n" for line in lines)
            (out / "lifecycle" / f"lifecycle-{pid}.log").write_text(text)
        for name in self.checkpoint_files:
            (out / "checkpoints" / name).parent.mkdir(parents=True, exist_ok=True)
            (out / "checkpoints" / name).write_bytes(b"\x80")
        for name in self.tensorboard_files:
            (out / "tensorboard" / name).write_bytes(b"")
        logs = [out / "run1.log", out / "run2.log"]
        logs[0].write_text(self.run1)
        logs[1].write_text(self.run2)
        return logs

    def judge(self, out: Path) -> dict[str, object]:
        logs = self.write(out)
        return verdicts.judge(out, logs, self.plan, self.killed_step, set(self.killed_pids))

    # --- edits that plant a fault ---

    def logs(self, edit: Callable[[str], str], which: tuple[int, ...] = (1, 2)) -> Recorded:
        return replace(
            self, run1=edit(self.run1) if 1 in which else self.run1, run2=edit(self.run2) if 2 in which else self.run2
        )

    def events(self, pid: int) -> list[str]:
        return [e["event"] for e in self.records[pid]]

    def with_events(self, pid: int, names: list[str]) -> Recorded:
        """``pid``'s record replaced by these events, in this order (fields as the stand-ins write them)."""
        t0 = self.records[pid][0]["t"]
        fields = {"load_checkpoint": {"step": 2}, "generate": {"validate": False}}
        lines = [{"t": t0 + 0.01 * i, "pid": pid, "event": n, **fields.get(n, {})} for i, n in enumerate(names)]
        return replace(self, records={**self.records, pid: lines})

    def without_worker(self, pid: int) -> Recorded:
        return replace(self, records={p: r for p, r in self.records.items() if p != pid})


def _healthy() -> Recorded:
    records = {}
    for path in sorted((DATA / "lifecycle").glob("lifecycle-*.log")):
        pid = int(path.stem.split("-")[1])
        records[pid] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return Recorded((DATA / "run1.log").read_text(), (DATA / "run2.log").read_text(), records)


HEALTHY = _healthy()


def _drop_lines(pattern: str) -> Callable[[str], str]:
    return lambda text: "".join(line for line in text.splitlines(True) if not re.search(pattern, line))


def _sub(pattern: str, repl: str) -> Callable[[str], str]:
    return lambda text: re.sub(pattern, repl, text)


def _cut_at(pid: int, keep: int) -> Recorded:
    return replace(HEALTHY, records={**HEALTHY.records, pid: HEALTHY.records[pid][:keep]})


def _resumed_events_with(edit: Callable[[list[str]], list[str]], pid: int = 23700) -> Recorded:
    return HEALTHY.with_events(pid, edit(HEALTHY.events(pid)))


def _remove_first(name: str) -> Callable[[list[str]], list[str]]:
    def edit(names: list[str]) -> list[str]:
        names = list(names)
        del names[names.index(name)]
        return names

    return edit


def _swap_first(a: str, b: str) -> Callable[[list[str]], list[str]]:
    def edit(names: list[str]) -> list[str]:
        names = list(names)
        i, j = names.index(a), names.index(b)
        names[i], names[j] = names[j], names[i]
        return names

    return edit


FRESH_RUN2 = (
    "\x1b[36m(R1AscendTaskRunner pid=23322)\x1b[0m Training from scratch\n"
    + "".join(
        f"\x1b[36m(R1AscendTaskRunner pid=23322)\x1b[0m step:{s} - training/global_step:{s} - critic/score/mean:0.0\n"
        for s in (1, 2, 3, 4)
    )
    + "\x1b[36m(R1AscendTaskRunner pid=23322)\x1b[0m step:4 - val-core/math500/acc/mean@16:0.0\n"
)


@dataclass(frozen=True)
class Case:
    """A broken run, the error it must raise and the words that say why."""

    name: str
    run: Recorded
    error: type[Exception]
    match: str


CASES: tuple[Case, ...] = (
    # --- did the cluster join ---
    Case("head never ready", HEALTHY.logs(_drop_lines("ray cluster ready"), (1,)), RehearsalError, "never reported"),
    Case(
        "a node lost",
        HEALTHY.logs(_sub(r"ray cluster ready: .*", "ray cluster ready: 127.0.0.2 (1 NPU); NPU total 1"), (1,)),
        RehearsalError,
        r"joined is 127\.0\.0\.2 \(1 NPU\) \(1 NPUs\), expected 127\.0\.0\.2 \(1 NPU\), 127\.0\.0\.3",
    ),
    Case("empty logs", HEALTHY.logs(lambda _: ""), RehearsalError, "never reported a ready cluster"),
    # --- did run 2 resume from the right step ---
    Case(
        "never resumed: run 2 trained from scratch",
        HEALTHY.logs(lambda _: FRESH_RUN2, (2,)),
        RehearsalError,
        r"did not resume from a checkpoint .*logged steps \[1, 2, 3, 4\]",
    ),
    Case(
        "never resumed: no load line, steps 3 and 4",
        HEALTHY.logs(_drop_lines("Load from checkpoint folder"), (2,)),
        RehearsalError,
        "did not resume from a checkpoint",
    ),
    Case("run 2 log empty", HEALTHY.logs(lambda _: "", (2,)), RehearsalError, "did not resume from a checkpoint"),
    Case(
        "resumed from the wrong step",
        HEALTHY.logs(
            lambda t: _sub("global_step_2", "global_step_1")(_sub(r"step:3 - ", "step:2 - step:3 - ")(t)), (2,)
        ),
        RehearsalError,
        "resumed from global_step_1, expected global_step_2",
    ),
    Case(
        "loaded step 2 but counted from step 1 again",
        HEALTHY.logs(_sub(r"step:3 - ", "step:1 - ")),
        RehearsalError,
        r"resumed run logged steps \[1, 4\], expected \[3, 4\]",
    ),
    Case(
        "resumed run stopped before the last step",
        HEALTHY.logs(_drop_lines(r"step:4 - "), (2,)),
        RehearsalError,
        r"resumed run logged steps \[3\], expected \[3, 4\]",
    ),
    Case(
        "run 1 was not killed mid-step",
        HEALTHY.logs(lambda t: t + "(R1AscendTaskRunner pid=22661) step:3 - critic/score/mean:0.0\n", (1,)),
        RehearsalError,
        "run 1 finished step 3",
    ),
    Case(
        "run 1 did not start fresh",
        HEALTHY.logs(_drop_lines(r"step:1 - "), (1,)),
        RehearsalError,
        r"run 1 logged steps \[2\], expected 1, 2, \.\.\. from a fresh start",
    ),
    # --- checkpoint layout, TensorBoard, validation ---
    Case(
        "resumed from a partial checkpoint (a rank's shards missing)",
        replace(
            HEALTHY,
            checkpoint_files=tuple(
                f for f in HEALTHY.checkpoint_files if not f.startswith("global_step_2/actor/dist_ckpt/__1_")
            ),
        ),
        RehearsalError,
        r"rank 1 wrote no shard .* in .*global_step_2/actor/dist_ckpt",
    ),
    Case(
        "resumed from a partial checkpoint (no data.pt)",
        replace(HEALTHY, checkpoint_files=tuple(f for f in HEALTHY.checkpoint_files if f != "global_step_2/data.pt")),
        RehearsalError,
        r"global_step_2/data\.pt is missing",
    ),
    Case("no TensorBoard events", replace(HEALTHY, tensorboard_files=()), RehearsalError, "no TensorBoard event file"),
    Case("no validation", HEALTHY.logs(_sub(r"val-core/\S+ - ", "")), RehearsalError, r"no validation metrics"),
    # --- rollout lifecycle of every worker ---
    Case("no lifecycle records", replace(HEALTHY, records={}), LifecycleError, "no worker recorded"),
    Case(
        "a resumed-run worker lost",
        HEALTHY.without_worker(23701),
        LifecycleError,
        r"expected 2 rollout workers in each run, found 2 in the killed run .* and 1 in the resumed run",
    ),
    Case(
        "a killed-run worker lost",
        HEALTHY.without_worker(22821),
        LifecycleError,
        r"found 1 in the killed run \(pids \[22820\]\)",
    ),
    Case(
        "every worker taken for one of the killed run",
        replace(HEALTHY, killed_pids=frozenset(HEALTHY.records)),
        LifecycleError,
        r"found 4 in the killed run .* and 0 in the resumed run",
    ),
    Case(
        "a resumed-run worker stops mid-cycle",
        _cut_at(23700, len(HEALTHY.records[23700]) - 1),
        LifecycleError,
        r"worker pid 23700 \(resumed run, must end after a whole cycle\): the sequence stops inside a cycle",
    ),
    Case(
        "a resumed-run worker stops a whole cycle early",
        _cut_at(23700, len(HEALTHY.records[23700]) - len(CYCLE)),
        LifecycleError,
        r"generated different numbers of times \(pid: generations \{23700: 2, 23701: 3\}\)",
    ),
    Case(
        "release without resume",
        _resumed_events_with(_remove_first("resume(weights)")),
        LifecycleError,
        r"worker pid 23700 .*is 'update_weights', expected 'resume\(weights\)'",
    ),
    Case(
        "update_weights before resume(weights)",
        _resumed_events_with(_swap_first("resume(weights)", "update_weights")),
        LifecycleError,
        r"is 'update_weights', expected 'resume\(weights\)'",
    ),
    Case(
        "resume(kv_cache) missing",
        _resumed_events_with(_remove_first("resume(kv_cache)")),
        LifecycleError,
        r"is 'generate', expected 'resume\(kv_cache\)'",
    ),
    Case(
        "a killed-run worker out of order",
        HEALTHY.with_events(22820, [n for n in HEALTHY.events(22820) if n != "update_weights"]),
        LifecycleError,
        r"worker pid 22820 \(killed run\): .*expected 'update_weights'",
    ),
    Case(
        "no release after the build",
        _resumed_events_with(_remove_first("release")),
        LifecycleError,
        "released right after it is built",
    ),
    Case(
        "unknown rollout call (resume with both tags)",
        _resumed_events_with(lambda n: [("resume(weights,kv_cache)" if e == "resume(weights)" else e) for e in n]),
        LifecycleError,
        r"recorded 'resume\(weights,kv_cache\)', expected one of",
    ),
    Case(
        "an extra release inside a cycle",
        _resumed_events_with(lambda n: [*n[:4], "release", *n[4:]]),
        LifecycleError,
        r"is 'release', expected 'update_weights'",
    ),
    # --- the resumed run's workers loaded the checkpoint ---
    Case(
        "a resumed-run worker loaded no checkpoint",
        _resumed_events_with(lambda n: [e for e in n if e != "load_checkpoint"]),
        LifecycleError,
        r"worker pid 23700 \(resumed run\) loaded checkpoints \[none\], expected \[step 2\]",
    ),
    Case(
        "a resumed-run worker loaded the wrong step",
        replace(
            HEALTHY,
            records={
                **HEALTHY.records,
                23701: [{**e, "step": 4} if e["event"] == "load_checkpoint" else e for e in HEALTHY.records[23701]],
            },
        ),
        LifecycleError,
        r"worker pid 23701 \(resumed run\) loaded checkpoints \[step 4\], expected \[step 2\]",
    ),
    Case(
        "a resumed-run worker loaded after it generated",
        _resumed_events_with(lambda n: [e for e in n if e != "load_checkpoint"] + ["load_checkpoint"]),
        LifecycleError,
        r"(?s)loaded checkpoints \[step 2 after a generation\]",
    ),
    Case(
        "a killed-run worker loaded a checkpoint (run 1 not fresh)",
        HEALTHY.with_events(22821, ["stand-ins installed", "release", "load_checkpoint", *HEALTHY.events(22821)[2:]]),
        LifecycleError,
        r"worker pid 22821 \(killed run, started fresh\) loaded checkpoints \[step 2\], expected \[none\]",
    ),
    # --- overlay prelude of every worker ---
    Case(
        "a worker's prelude line missing",
        HEALTHY.logs(_drop_lines(r"overlay \(pid 23701\)")),
        LifecycleError,
        r"worker pid 23701 logged no 'r1-ascend overlay \(pid 23701\): applied=\.\.\.' prelude line",
    ),
    Case(
        "a worker's prelude without the offloading rollout",
        HEALTHY.logs(_sub(r"(\(pid 22820\): applied=\S*?)vllm_rollout_offload,", r"\1")),
        LifecycleError,
        "worker pid 22820's prelude did not apply vllm_rollout_offload",
    ),
)


def _gives_expected_verdict(case: Case, out: Path) -> bool:
    """What each broken-run test asserts: the case fails, with its error type and message."""
    try:
        case.run.judge(out)
    except case.error as exc:
        return re.search(case.match, str(exc)) is not None
    except Exception:  # a crash or another check's error: the test would fail too
        return False
    return False


def test_the_recorded_healthy_run_passes(tmp_path: Path) -> None:
    """The real run's records pass, killed-run workers ending mid-cycle included (22820 stops after generate)."""
    assert HEALTHY.events(22820)[-1] == "generate"
    summary = HEALTHY.judge(tmp_path / "out")
    assert summary["nodes_joined"] == "127.0.0.2 (1 NPU), 127.0.0.3 (1 NPU)"
    assert summary["npus_seen"] == 2
    assert summary["steps_run"] == {"run 1 (killed)": [1, 2], "run 2 (resumed)": [3, 4]}
    assert summary["resumed_from_step"] == 2
    assert summary["lifecycle"].startswith("4 workers, 14 generations")
    assert summary["checkpoint_loads"] == "2 workers of the resumed run loaded global_step_2 before generating"
    assert summary["preludes"].startswith("4 workers logged the prelude")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_broken_run_fails_with_its_reason(case: Case, tmp_path: Path) -> None:
    with pytest.raises(case.error, match=case.match) as info:
        case.run.judge(tmp_path / "out")
    # actionable: where to look
    message = str(info.value)
    assert "log" in message or "records" in message or str(tmp_path) in message, message


# --- mutation checks: weaken one check, and some broken-run case must stop giving its expected verdict ---------------


def _mutant(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str, old: str, new: str) -> None:
    """Replace ``module.name`` (and the copies other verdict modules imported) with its source where ``old``, which
    must occur exactly once, reads ``new``."""
    original = getattr(module, name)
    source = textwrap.dedent(inspect.getsource(original))
    assert source.count(old) == 1, f"{old!r} does not occur exactly once in {module.__name__}.{name}: update MUTANTS"
    namespace = dict(vars(module))
    # compiled as the module was: with postponed annotations (``annotations`` is the __future__ feature bound above)
    code = compile(source.replace(old, new), f"<mutant of {name}>", "exec", flags=annotations.compiler_flag)
    exec(code, namespace)
    for owner in (lifecycle, verdicts):
        if getattr(owner, name, None) is original:
            monkeypatch.setattr(owner, name, namespace[name])


@dataclass(frozen=True)
class Mutant:
    """A weakened check: ``old`` -> ``new`` in ``module.function``; ``caught_by`` must stop giving its verdict."""

    name: str
    module: ModuleType
    function: str
    old: str
    new: str
    caught_by: tuple[str, ...]
    rejects_healthy: str = ""  # or caught by the healthy run itself failing, with this message


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "resume check accepts a run that never resumed",
        verdicts,
        "check_resumed",
        "resumed = RESUME_LINE.findall(text)",
        "resumed = RESUME_LINE.findall(text) or [str(expected)]",
        ("never resumed: no load line, steps 3 and 4", "run 2 log empty"),
    ),
    Mutant(
        "resume step not compared with the kill",
        verdicts,
        "check_resumed",
        "if resumed_from != expected:",
        "if False:",
        ("resumed from the wrong step",),
    ),
    Mutant(
        "resumed run's steps not compared",
        verdicts,
        "check_resumed",
        "if steps != expected_after:",
        "if False:",
        ("loaded step 2 but counted from step 1 again", "resumed run stopped before the last step"),
    ),
    Mutant(
        "run 1 may finish the killed step",
        verdicts,
        "check_resume",
        "if max(steps[0], default=0) >= killed_step:",
        "if False:",
        ("run 1 was not killed mid-step",),
    ),
    Mutant(
        "run 1 need not start fresh",
        verdicts,
        "check_resume",
        "if not steps[0] or steps[0] != list(range(1, steps[0][-1] + 1)):",
        "if False:",
        ("run 1 did not start fresh",),
    ),
    Mutant(
        "any ready line counts as joined",
        verdicts,
        "check_joined",
        'if set(joined.split(", ")) != set(expected.split(", ")) or total != plan.world:',
        "if False:",
        ("a node lost",),
    ),
    Mutant(
        "checkpoint layout checks rank 0 only",
        verdicts,
        "check_checkpoint",
        "for rank in range(world):",
        "for rank in range(1):",
        ("resumed from a partial checkpoint (a rank's shards missing)",),
    ),
    Mutant(
        "checkpoint layout not checked",
        verdicts,
        "check_checkpoint",
        "if not needed.is_file():",
        "if False:",
        ("resumed from a partial checkpoint (no data.pt)",),
    ),
    Mutant(
        "TensorBoard not checked",
        verdicts,
        "check_tensorboard",
        "if not events:",
        "if False:",
        ("no TensorBoard events",),
    ),
    Mutant(
        "validation not checked",
        verdicts,
        "check_validation",
        'if "val-core/" not in "".join(texts):',
        "if False:",
        ("no validation",),
    ),
    Mutant(
        "lifecycle check treats every worker as killed",
        lifecycle,
        "check_lifecycle",
        "complete = pid not in killed_pids",
        "complete = False",
        ("a resumed-run worker stops mid-cycle",),
    ),
    Mutant(
        "lifecycle check does not count workers",
        lifecycle,
        "check_lifecycle",
        "if len(killed) != workers_per_run or len(resumed) != workers_per_run:",
        "if False:",
        ("a resumed-run worker lost", "a killed-run worker lost", "every worker taken for one of the killed run"),
    ),
    Mutant(
        "resumed-run workers' generation counts not compared",
        lifecycle,
        "check_lifecycle",
        "if len(set(finished.values())) > 1:",
        "if False:",
        ("a resumed-run worker stops a whole cycle early",),
    ),
    Mutant(
        "cycle order not checked (any lifecycle event anywhere)",
        lifecycle,
        "check_sequence",
        "if event != CYCLE[index % len(CYCLE)]:",
        "if event not in CYCLE:",
        ("release without resume", "update_weights before resume(weights)", "resume(kv_cache) missing"),
    ),
    Mutant(
        "a worker may stop mid-cycle in any run",
        lifecycle,
        "check_sequence",
        "if complete and len(body) % len(CYCLE):",
        "if False:",
        ("a resumed-run worker stops mid-cycle",),
    ),
    Mutant(
        "first release not required",
        lifecycle,
        "check_sequence",
        'if not sequence or sequence[0] != "release":',
        "if not sequence:",
        ("no release after the build",),
    ),
    Mutant(
        "unknown rollout calls ignored",
        lifecycle,
        "_by_pid",
        'elif name.split("(", 1)[0] in LIFECYCLE_METHODS:',
        "elif False:",
        ("unknown rollout call (resume with both tags)",),
    ),
    Mutant(
        "checkpoint loads not checked",
        lifecycle,
        "check_checkpoint_loads",
        "if loads[pid] != expected:",
        "if False:",
        (
            "a resumed-run worker loaded no checkpoint",
            "a resumed-run worker loaded the wrong step",
            "a killed-run worker loaded a checkpoint (run 1 not fresh)",
        ),
    ),
    Mutant(
        "a load after a generation counts",
        lifecycle,
        "check_checkpoint_loads",
        '(" after a generation" if pid in generated else "")',
        '""',
        ("a resumed-run worker loaded after it generated",),
    ),
    Mutant(
        "preludes checked for the first worker only",
        lifecycle,
        "check_preludes",
        "for pid in workers:",
        "for pid in workers[:1]:",
        ("a worker's prelude line missing",),
    ),
    Mutant(
        "prelude patches not checked",
        lifecycle,
        "check_preludes",
        "missing = [name for name in REQUIRED_PATCHES if name not in applied[pid]]",
        "missing = []",
        ("a worker's prelude without the offloading rollout",),
    ),
)

MUTANTS += (
    Mutant(
        "killed pids taken from the finished records (every worker treated as killed)",
        verdicts,
        "judge",
        "check_lifecycle(events, killed_pids, workers_per_run=plan.world)",
        'check_lifecycle(events, {int(e["pid"]) for e in events}, workers_per_run=plan.world)',
        (),
        rejects_healthy=r"found 4 in the killed run .* and 0 in the resumed run",
    ),
    Mutant(
        "killed-run workers held to whole cycles",
        lifecycle,
        "check_lifecycle",
        "complete = pid not in killed_pids",
        "complete = True",
        (),
        rejects_healthy=r"worker pid 22820 .*stops inside a cycle",  # 22820 was killed right after a generate
    ),
)

CASES_BY_NAME = {c.name: c for c in CASES}


def test_mutants_name_real_cases() -> None:
    for mutant in MUTANTS:
        assert set(mutant.caught_by) <= set(CASES_BY_NAME), mutant.name


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_weakening_a_check_is_caught(mutant: Mutant, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With the check weakened, the healthy run still passes and each named broken-run case stops giving its
    expected verdict (so its test above would fail); or, for a weakening that misreads which run a worker belongs
    to, the healthy run fails."""
    _mutant(monkeypatch, mutant.module, mutant.function, mutant.old, mutant.new)
    if mutant.rejects_healthy:
        with pytest.raises(LifecycleError, match=mutant.rejects_healthy):
            HEALTHY.judge(tmp_path / "healthy")
        return
    HEALTHY.judge(tmp_path / "healthy")
    escaped = [name for name in mutant.caught_by if not _gives_expected_verdict(CASES_BY_NAME[name], tmp_path / "c")]
    assert escaped == list(mutant.caught_by)


# --- properties over many broken runs ----------------------------------------------------------------------------

_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_SETTINGS
@given(pid=st.sampled_from(RESUMED_WORKERS), data=st.data())
def test_any_truncated_record_of_a_resumed_worker_fails(pid: int, data: st.DataObject, tmp_path: Path) -> None:
    """A resumed-run worker's record cut anywhere before its end fails (mid-cycle, at a cycle boundary, or empty)."""
    keep = data.draw(st.integers(0, len(HEALTHY.records[pid]) - 1))
    with pytest.raises(LifecycleError):
        _cut_at(pid, keep).judge(tmp_path / "out")


@_SETTINGS
@given(pid=st.sampled_from(KILLED_WORKERS), data=st.data())
def test_a_killed_worker_may_stop_anywhere_after_its_build(pid: int, data: st.DataObject, tmp_path: Path) -> None:
    """A killed-run worker stops where the kill found it: any cut after its first release passes; before it, the
    worker has no lifecycle record and counts as lost."""
    names = HEALTHY.events(pid)
    keep = data.draw(st.integers(0, len(names)))
    cut = _cut_at(pid, keep)
    if "release" in names[:keep]:
        cut.judge(tmp_path / "out")
    else:
        with pytest.raises(LifecycleError, match="expected 2 rollout workers in each run"):
            cut.judge(tmp_path / "out")


@_SETTINGS
@given(lost=st.sets(st.sampled_from(KILLED_WORKERS + RESUMED_WORKERS), min_size=1))
def test_any_lost_workers_fail(lost: set[int], tmp_path: Path) -> None:
    recorded = HEALTHY
    for pid in lost:
        recorded = recorded.without_worker(pid)
    with pytest.raises(LifecycleError, match=r"rollout workers in each run|no worker recorded"):
        recorded.judge(tmp_path / "out")


@_SETTINGS
@given(silent=st.sets(st.sampled_from(KILLED_WORKERS + RESUMED_WORKERS), min_size=1))
def test_any_workers_without_a_prelude_line_fail(silent: set[int], tmp_path: Path) -> None:
    pattern = "|".join(rf"overlay \(pid {pid}\)" for pid in silent)
    with pytest.raises(LifecycleError, match=rf"worker pid ({'|'.join(map(str, silent))}) logged no"):
        HEALTHY.logs(_drop_lines(pattern)).judge(tmp_path / "out")


@_SETTINGS
@given(
    pid=st.sampled_from(RESUMED_WORKERS),
    extra=st.sampled_from(sorted(lifecycle.LIFECYCLE_EVENTS)),
    data=st.data(),
)
def test_one_extra_lifecycle_event_in_a_resumed_worker_fails(
    pid: int, extra: str, data: st.DataObject, tmp_path: Path
) -> None:
    names = HEALTHY.events(pid)
    at = data.draw(st.integers(0, len(names)))
    with pytest.raises(LifecycleError):
        HEALTHY.with_events(pid, [*names[:at], extra, *names[at:]]).judge(tmp_path / "out")


@_SETTINGS
@given(killed_step=st.integers(1, 8).filter(lambda s: s != KILLED_STEP))
def test_any_other_kill_step_fails_the_resume_verdict(killed_step: int, tmp_path: Path) -> None:
    """The resume verdict ties the run to the step it was killed in: the same logs with another step fail."""
    with pytest.raises(RehearsalError, match=r"run 1|resumed from global_step_2, expected"):
        replace(HEALTHY, killed_step=killed_step).judge(tmp_path / "out")
