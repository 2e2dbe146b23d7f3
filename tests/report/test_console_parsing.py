"""The console parser against verl's own line formatter and against messy job-log text."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from r1_ascend.report.console import parse_console_text, parse_number

_KEYS = st.from_regex(r"[a-z_]{1,8}(/[a-z_@0-9]{1,8}){0,3}", fullmatch=True)
_VALUES = st.one_of(
    st.floats(allow_nan=False, allow_infinity=True, width=64),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(metrics=st.dictionaries(_KEYS, _VALUES, max_size=12), step=st.integers(min_value=0, max_value=10**6))
def test_every_value_verl_prints_reads_back_exactly(metrics: dict[str, float], step: int) -> None:
    from verl.utils.logger.aggregate_logger import concat_dict_to_str

    line = concat_dict_to_str(metrics, step=step)
    log = parse_console_text(f"(TaskRunner pid=7) {line}\n", "x.log")
    assert not log.problems
    assert [r.step for r in log.records] == [step]
    assert log.records[0].metrics == {k: float(v) for k, v in metrics.items()}


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("step:0123 -.\n\r\x1b[m()abc/=e+_")), max_size=200))
def test_arbitrary_text_never_raises(text: str) -> None:
    log = parse_console_text(text, "fuzz.log")
    for record in log.records:
        assert all(isinstance(v, float) for v in record.metrics.values())


def test_ray_prefix_ansi_and_numpy_scalar_reprs() -> None:
    text = (
        "\x1b[36m(TaskRunner pid=12345)\x1b[0m step:3 - a/b:1.5 - c:np.float64(2.25) - d:True - e:nan - f:-inf\n"
        "(WorkerDict pid=9, ip=10.0.0.1) step:99 is not a metrics line because no ' - ' follows\n"
    )
    log = parse_console_text(text, "job.log")
    assert len(log.records) == 1
    metrics = log.records[0].metrics
    assert metrics["a/b"] == 1.5
    assert metrics["c"] == 2.25
    assert metrics["d"] == 1.0
    assert math.isnan(metrics["e"])
    assert metrics["f"] == -math.inf


def test_interleaved_worker_output_is_skipped_and_reported() -> None:
    text = "(TaskRunner pid=1) step:4 - x:1.0 - y:2.0(WorkerDict pid=2) INFO: loading - z:3.0\n"
    log = parse_console_text(text, "job.log")
    assert log.records[0].metrics == {"x": 1.0, "z": 3.0}
    assert len(log.problems) == 1
    assert "y:2.0(WorkerDict" in log.problems[0].message


def test_cut_off_last_line_drops_only_the_unfinished_pair() -> None:
    text = "step:1 - a:1.0 - b:2.0\nstep:2 - a:1.5 - b:49"
    log = parse_console_text(text, "job.log")
    assert [r.metrics for r in log.records] == [{"a": 1.0, "b": 2.0}, {"a": 1.5}]
    assert "cut off" in log.problems[0].message
    assert log.problems[0].line_no == 2


def test_tqdm_carriage_return_and_resume_marker() -> None:
    text = "Training Progress:  3%|▍ | 3/100\rstep:3 - a:1.0\n(TaskRunner pid=1) Setting global step to 40\n"
    log = parse_console_text(text, "job.log")
    assert [r.step for r in log.records] == [3]
    assert [m.step for m in log.resume_markers] == [40]


def test_parse_number_rejects_partial_values() -> None:
    assert parse_number("1e-06") == 1e-06
    assert parse_number("np.int64(7)") == 7.0
    for bad in ("", "1.2.3", "abc", "1e", "np.float64(1.5", "1_000"):
        assert parse_number(bad) is None
