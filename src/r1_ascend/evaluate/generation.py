"""What a generation backend is given and returns, and its progress line.

A backend turns prompts (token ids, one seed each) into ``n`` sampled completions per prompt. Two exist: vLLM
(:mod:`r1_ascend.evaluate.vllm_backend`, the NPU path, the engine the rollout uses) and transformers
(:mod:`r1_ascend.evaluate.hf_backend`, CPU: vLLM's wheel has no CPU backend); :mod:`r1_ascend.evaluate.backends`
chooses between them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

AUTO, VLLM, TRANSFORMERS = "auto", "vllm", "transformers"
#: finish reasons, as vLLM names them: "stop" = ended by EOS (or a stop token), "length" = hit max_new_tokens.
STOP, LENGTH = "stop", "length"
#: Seconds between progress lines.
PROGRESS_EVERY_S = 10.0


@dataclass(frozen=True)
class SamplingOptions:
    """How every prompt is sampled (DeepSeek-R1 report defaults live in r1_ascend.evaluate.cli)."""

    n: int
    temperature: float
    top_p: float
    max_new_tokens: int


@dataclass(frozen=True)
class Request:
    """One prompt: its token ids and the seed of its first sample (sample j uses ``seed + j``)."""

    token_ids: tuple[int, ...]
    seed: int


@dataclass(frozen=True)
class Completion:
    """One sampled response, decoded as verl's reward manager decodes it."""

    text: str
    finish_reason: str  # STOP or LENGTH
    tokens: int  # generated tokens, EOS included


@dataclass(frozen=True)
class BackendSpec:
    """What a backend factory gets: the model, its tokenizer and the command's engine options."""

    model_dir: Path
    tokenizer: Any
    seed: int
    max_model_len: int  # longest prompt + max_new_tokens
    trust_remote_code: bool = False
    tensor_parallel_size: int | None = None  # vLLM; None: every NPU of this node
    engine_kwargs: dict[str, Any] | None = None  # vLLM: extra keyword arguments of vllm.LLM


class Backend(Protocol):
    name: str

    def generate(
        self, requests: Sequence[Request], options: SamplingOptions, progress: SampleProgress
    ) -> list[list[Completion]]:
        """``options.n`` completions for each request, in request order; ``progress.update(k)`` as k finish."""
        ...


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class SampleProgress:
    """ "samples done / total, elapsed, time left" on stderr, at most every ``every_s`` seconds and at the end.

    It also answers the part of tqdm's interface vLLM's ``LLM.generate(use_tqdm=callable)`` uses (``update``,
    ``close``, ``format_dict["elapsed"]``, a settable ``postfix``), so vLLM's own per-request count drives it.
    """

    def __init__(
        self,
        label: str,
        total: int,
        *,
        stream: TextIO | None = None,
        every_s: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.label = label
        self.total = total
        self.done = 0
        self.postfix = ""
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self._clock = clock
        self._start = clock()
        self._last = self._start
        self._printed: int | None = None  # ``done`` when the last line was printed
        self._closed = False

    @property
    def elapsed(self) -> float:
        return max(self._clock() - self._start, 1e-6)  # vLLM divides token counts by it

    @property
    def format_dict(self) -> dict[str, float]:
        return {"elapsed": self.elapsed, "n": self.done, "total": self.total}

    def update(self, count: int = 1) -> None:
        self.done += count
        now = self._clock()
        if now - self._last >= self.every_s:
            self._last = now
            self._print()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._printed != self.done:
                self._print()

    def line(self) -> str:
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        text = f"{self.label}: {self.done}/{self.total} samples{share}, {_duration(self.elapsed)} elapsed"
        if 0 < self.done < self.total:
            text += f", about {_duration(self.elapsed * (self.total - self.done) / self.done)} left"
        return text + (f" [{self.postfix}]" if self.postfix else "")

    def _print(self) -> None:
        self._printed = self.done
        print(f"r1-ascend evaluate: {self.line()}", file=self.stream, flush=True)

    def __call__(self, iterable: Any = None, **_: Any) -> Any:
        """vLLM 0.9.1 calls its ``use_tqdm`` factory twice: around the prompts it adds (positional iterable, passed
        through untouched) and for the finished requests (tqdm's keywords; the sample total is ours)."""
        return self if iterable is None else iterable
