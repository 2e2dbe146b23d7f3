"""Wall time and memory of the rehearsal: the summed peak RSS of every process it started.

A sampler thread reads, every second, the RSS of this process, all its descendants, and every process whose
command line names the rehearsal's Ray temp dir (Ray's node processes are detached from this process tree by
``ray start``); the peak of each process is kept, and the budget figure is the sum of those peaks (an upper
bound of the joint peak, counting the processes of the killed run and of the resumed run as if they coexisted).
The largest total RSS seen in one sample (processes alive together) is kept as well, and the largest total PSS
(memory actually in use). PSS is costly to read (the kernel walks each process's page tables for
``smaps_rollup``: 0.3 s of CPU for the rehearsal's ~20 processes, most of a sample's cost), so it is read every
``PSS_EVERY`` samples and whenever the RSS total reaches a new maximum: a process's PSS never exceeds its RSS, and
the rehearsal's memory phases (model builds, checkpoint writers) last seconds.
"""

from __future__ import annotations

import threading
from types import TracebackType

import psutil


def _title(proc: psutil.Process) -> str:
    """A short title: Ray's process titles (``ray::WorkerDict``, ``raylet``) or the program and its module."""
    try:
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"
    if not cmdline:
        return proc.name()
    if "-m" in cmdline[:-1]:
        return f"python -m {cmdline[cmdline.index('-m') + 1]}"
    first = cmdline[0].split()[0] if cmdline[0].startswith("ray::") else cmdline[0].rsplit("/", 1)[-1]
    script = next((arg.rsplit("/", 1)[-1] for arg in cmdline[1:2] if arg.endswith(".py")), "")
    return f"{first} {script}".strip()


def _pss(pid: int, fallback: int) -> int:
    """The process's proportional set size from /proc/PID/smaps_rollup (cheap, Linux >= 4.14), else ``fallback``."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return fallback


#: PSS is read on every PSS_EVERY-th sample (and on a new RSS maximum).
PSS_EVERY = 4


class RssSampler:
    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.samples = 0
        self.peaks: dict[tuple[int, float], int] = {}  # (pid, create_time) -> peak RSS bytes
        self.names: dict[tuple[int, float], str] = {}  # (pid, create_time) -> process title, for the breakdown
        self.markers: list[str] = []
        self.concurrent_peak = 0  # largest sum of RSS over the processes alive in one sample
        #: largest sum of PSS in one sample: memory actually in use, with pages shared between processes (forked
        #: checkpoint writers, Ray workers' shared libraries) counted once instead of once per process
        self.concurrent_peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def watch_cmdline(self, marker: str) -> None:
        self.markers.append(marker)

    def _processes(self) -> list[psutil.Process]:
        me = psutil.Process()
        found = {p.pid: p for p in [me, *me.children(recursive=True)]}
        if self.markers:
            for proc in psutil.process_iter(["pid", "cmdline"]):
                cmdline = " ".join(proc.info.get("cmdline") or [])
                if any(marker in cmdline for marker in self.markers) and proc.pid not in found:
                    found[proc.pid] = proc
                    for child in proc.children(recursive=True):
                        found.setdefault(child.pid, child)
        return list(found.values())

    def sample(self) -> None:
        total = 0
        alive: list[tuple[int, int]] = []
        for proc in self._processes():
            try:
                key = (proc.pid, proc.create_time())
                rss = proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            self.peaks[key] = max(self.peaks.get(key, 0), rss)
            if key not in self.names:
                self.names[key] = _title(proc)
            total += rss
            alive.append((proc.pid, rss))
        new_maximum = total > self.concurrent_peak
        self.concurrent_peak = max(self.concurrent_peak, total)
        if new_maximum or self.samples % PSS_EVERY == 0:
            total_pss = sum(_pss(pid, rss) for pid, rss in alive)
            self.concurrent_peak_pss = max(self.concurrent_peak_pss, total_pss)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def summed_peak_bytes(self) -> int:
        return sum(self.peaks.values())

    def breakdown(self) -> dict[str, dict[str, float]]:
        """Summed peak RSS (MiB) and process count per process title, largest first: where the budget goes."""
        groups: dict[str, dict[str, float]] = {}
        for key, peak in self.peaks.items():
            group = groups.setdefault(self.names.get(key, "?"), {"processes": 0, "summed_peak_mib": 0.0})
            group["processes"] += 1
            group["summed_peak_mib"] += peak / 1024**2
        ordered = sorted(groups.items(), key=lambda item: -item[1]["summed_peak_mib"])
        return {name: {**group, "summed_peak_mib": round(group["summed_peak_mib"], 1)} for name, group in ordered}

    def process_count(self) -> int:
        return len(self.peaks)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None):
        self._stop.set()
        self._thread.join(5)
