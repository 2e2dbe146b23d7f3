"""Run ``r1-ascend convert-weights`` with a crash or a slowdown injected, for the resume and worker tests.

The converters carry no test hooks. This launcher wraps the real functions at the points a test needs, then runs
the real CLI in this process (worker processes are forked from it, so they inherit the wrappers):

    python faults.py [--kill-after-tensors N] [--kill-after-ranks N] [--kill-after-shards N]
                     [--delay-per-tensor S] -- STEP ARGS...

Kills are SIGKILL of the process that wrote the N-th item, counted per process: tensors of an fp8-to-bf16 shard,
rank files of to-megatron (ones found finished and reused do not count), output shards of to-hf.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from r1_ascend.weights import mcore_writer, to_hf
from r1_ascend.weights.cli import main
from r1_ascend.weights.safetensors_io import StreamingWriter


def _counter(limit: int | None) -> Callable[[], None]:
    """A function that SIGKILLs this process on its ``limit``-th call (never when ``limit`` is None)."""
    calls = 0

    def tick() -> None:
        nonlocal calls
        calls += 1
        if limit is not None and calls >= limit:
            os.kill(os.getpid(), signal.SIGKILL)

    return tick


def _after(owner: Any, name: str, action: Callable[..., None]) -> None:
    """Replace ``owner.name`` by a wrapper that calls ``action(*args)`` after the real function returns."""
    real = getattr(owner, name)

    @functools.wraps(real)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        action(*args)
        return result

    setattr(owner, name, wrapper)


def install(args: argparse.Namespace) -> None:
    delay = args.delay_per_tensor
    tensor_killed = _counter(args.kill_after_tensors)

    def after_tensor(*_: Any) -> None:  # fp8-to-bf16: a tensor is complete in the shard's temp file
        tensor_killed()
        if delay:
            time.sleep(delay)

    _after(StreamingWriter, "end", after_tensor)

    real_item_writer = mcore_writer.item_writer

    def slow_item_writer() -> Any:  # to-megatron: one chunk written to a rank file
        write = real_item_writer()

        def write_then_wait(*a: Any) -> Any:
            result = write(*a)
            if delay:
                time.sleep(delay)
            return result

        return write_then_wait

    mcore_writer.item_writer = slow_item_writer

    rank_killed = _counter(args.kill_after_ranks)
    real_rank_file = mcore_writer.write_rank_file

    @functools.wraps(real_rank_file)
    def write_rank_file(dst: Any, rank: int, items: Any, resolver: Any) -> Any:
        reused = mcore_writer.finished_rank_results(dst, rank, items) is not None
        result = real_rank_file(dst, rank, items, resolver)
        if not reused:
            rank_killed()
        return result

    mcore_writer.write_rank_file = write_rank_file
    shard_killed = _counter(args.kill_after_shards)
    _after(to_hf, "write_shard", lambda *_: shard_killed())


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kill-after-tensors", type=int)
    parser.add_argument("--kill-after-ranks", type=int)
    parser.add_argument("--kill-after-shards", type=int)
    parser.add_argument("--delay-per-tensor", type=float, default=0.0)
    return parser.parse_args(argv[:split]), argv[split + 1 :]


if __name__ == "__main__":
    options, cli_args = _parse(sys.argv[1:])
    install(options)
    sys.exit(main(cli_args))
