"""One scenario's run as the runner hands it to the scenario: where it writes, its plan, its cluster and logs.

:func:`fresh_session` is how every scenario but ``--resume`` starts (a fresh output directory, inputs, launch
script); ``--resume`` builds its session from what the interrupted rehearsal left (r1_ascend.rehearse.resume).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from r1_ascend.rehearse.budget import RssSampler
from r1_ascend.rehearse.cluster import Cluster, new_cluster, prepare
from r1_ascend.rehearse.config import Plan


@dataclass
class Session:
    """What a scenario's drive and verdicts work on. ``logs[0]`` is the head's driver log; ``head`` its process once
    the runner started the cluster; ``context`` what the scenario's setup learnt (``--resume``: the step it expects
    and the records of earlier runs)."""

    out: Path
    plan: Plan
    launch: Path
    cluster: Cluster
    logs: list[Path]
    head: subprocess.Popen | None = None
    context: dict[str, Any] = field(default_factory=dict)

    @property
    def driver(self) -> subprocess.Popen:
        if self.head is None:
            raise RuntimeError("the cluster has not been started: the runner starts it before the scenario drives")
        return self.head


def fresh_session(out: Path, plan: Plan, weights: Path | None, sampler: RssSampler) -> Session:
    """A fresh output directory with the inputs, the plan and the launch script, and the cluster's settings."""
    launch = prepare(out, plan, weights)
    cluster = new_cluster(out, plan, launch, sampler)
    return Session(out, plan, launch, cluster, [out / "run1.log", out / "run2.log"])
