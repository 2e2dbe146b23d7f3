"""The rehearsal's memory meter (r1_ascend.rehearse.budget) on real processes: peaks per process, RSS and PSS sums."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from r1_ascend.rehearse import budget

#: A child that holds this many bytes of its own (written, so resident) until it is told to stop.
HELD = 64 * 1024 * 1024
CHILD = (
    f"import sys; b = bytearray({HELD}); b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); "
    "sys.stdin.read()"
)


def test_a_childs_memory_is_counted_in_every_total() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        sampler = budget.RssSampler()
        sampler.sample()
        own = psutil.Process(child.pid).memory_info().rss
        assert own >= HELD
        assert sampler.summed_peak_bytes() >= own
        assert sampler.concurrent_peak >= own
        # PSS never exceeds RSS, and the first sample (a new RSS maximum) reads it
        assert HELD <= sampler.concurrent_peak_pss <= sampler.concurrent_peak
        assert sampler.process_count() >= 2
    finally:
        child.kill()
        child.wait()


def test_pss_is_read_on_a_new_rss_maximum_and_every_few_samples(monkeypatch) -> None:
    reads: list[int] = []
    monkeypatch.setattr(budget, "_pss", lambda pid, fallback: reads.append(pid) or fallback)
    sampler = budget.RssSampler()
    sampler.concurrent_peak = 1 << 60  # no sample can be a new RSS maximum
    for _ in range(budget.PSS_EVERY * 3):
        before = len(reads)
        sampler.sample()
        read = len(reads) > before
        assert read == ((sampler.samples - 1) % budget.PSS_EVERY == 0)
    sampler.concurrent_peak = 0
    before = len(reads)
    sampler.sample()  # a new maximum: read whatever the count
    assert len(reads) > before


def test_the_sampler_thread_stops_with_the_context() -> None:
    with budget.RssSampler(interval=0.05) as sampler:
        time.sleep(0.3)
    taken = sampler.samples
    assert taken >= 1
    time.sleep(0.2)
    assert sampler.samples == taken
