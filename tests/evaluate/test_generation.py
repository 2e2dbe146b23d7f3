"""The backend choice and the progress line (samples done / total, elapsed, time left)."""

from __future__ import annotations

import io

import pytest

from r1_ascend.evaluate import backends
from r1_ascend.evaluate import generation as gen


@pytest.mark.parametrize(
    ("requested", "npu", "chosen"),
    [
        ("auto", True, "vllm"),
        ("auto", False, "transformers"),
        ("vllm", False, "vllm"),
        ("transformers", True, "transformers"),
    ],
)
def test_auto_is_vllm_exactly_where_an_npu_is_present(requested: str, npu: bool, chosen: str) -> None:
    assert backends.choose_backend(requested, npu) == chosen


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown backend 'hf'"):
        backends.choose_backend("hf", False)


def test_every_backend_name_has_a_factory() -> None:
    assert set(backends.BACKENDS) == {gen.VLLM, gen.TRANSFORMERS}


def test_progress_prints_done_total_elapsed_and_time_left() -> None:
    now = [100.0]
    stream = io.StringIO()
    progress = gen.SampleProgress("aime24", 40, stream=stream, every_s=10, clock=lambda: now[0])
    now[0] = 105.0
    progress.update(10)  # within 10 s of the start: nothing printed
    assert stream.getvalue() == ""
    now[0] = 112.0
    progress.update(10)  # 20 done in 12 s, 20 left: about 12 s
    assert stream.getvalue() == "r1-ascend evaluate: aime24: 20/40 samples (50%), 0m12s elapsed, about 0m12s left\n"
    now[0] = 130.0
    progress.update(20)
    progress.close()
    assert stream.getvalue().splitlines()[-1] == "r1-ascend evaluate: aime24: 40/40 samples (100%), 0m30s elapsed"
    assert len(stream.getvalue().splitlines()) == 2  # the last update printed the final count: close adds none


def test_close_prints_the_final_count_once() -> None:
    stream = io.StringIO()
    progress = gen.SampleProgress("amc", 4, stream=stream)
    progress.update(4)
    progress.close()
    progress.close()
    assert stream.getvalue().count("amc: 4/4 samples (100%)") == 1


def test_progress_answers_vllms_tqdm_factory_calls() -> None:
    """vLLM 0.9.1 calls ``use_tqdm(prompts, desc=...)`` and iterates the result, then ``use_tqdm(total=...)``."""
    progress = gen.SampleProgress("amc", 6, stream=io.StringIO())
    prompts = [{"prompt_token_ids": [1]}, {"prompt_token_ids": [2]}]
    assert list(progress(prompts, desc="Adding requests")) == prompts
    bar = progress(total=2, desc="Processed prompts", dynamic_ncols=True, postfix="")
    assert bar is progress
    assert bar.format_dict["elapsed"] > 0
