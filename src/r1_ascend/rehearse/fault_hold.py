"""The hold that makes a process fault land inside its stage: both sides of it, the worker's wait and the
rehearsal's release.

The rehearsal plants a process fault (``kill-actor-worker``, ``kill-rollout``, ``hang``, ``node-loss``) when it reads
a worker's record of entering the fault's stage. This model's stages are shorter than the time between that record
and the signal (``update_actor`` takes 0.6 s with the CPU's bf16 products in fp32 accumulation), and a fault meant
for ``update_actor`` hit the next stage. So the fault runs set ``R1_ASCEND_REHEARSE_HOLD=STAGE@STEP``: each worker,
on entering that stage of that step, waits (``HOLD_LIMIT_S`` at most) until the rehearsal wrote ``HOLD_RELEASED``
beside the lifecycle records, which it does once its signal is sent. The wait comes after the stage's heartbeat (the
watchdog patch beats before it calls its stage listeners), as on a cluster while a long stage runs.

No import side effects: tests import it in-process (``worker_hooks`` installs the rehearsal's records on import).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from r1_ascend import envs

#: The file, beside the lifecycle records, whose existence releases the held workers.
HOLD_RELEASED = "hold-released"
#: How long a held worker waits for the rehearsal before it goes on (the rehearsal takes well under a second; a
#: rehearsal that died must not leave the run stuck).
HOLD_LIMIT_S = 60.0


def hold_for_the_fault(stage: str, step: int | None) -> float:
    """In a worker: with ``R1_ASCEND_REHEARSE_HOLD=STAGE@STEP``, wait on entering that stage of that step until the
    rehearsal released the hold; return the seconds waited (0 for any other stage or step)."""
    if (stage, step) != envs.rehearse_hold():
        return 0.0
    released = os.path.join(envs.rehearse_dir() or ".", HOLD_RELEASED)
    began = time.monotonic()
    while not os.path.exists(released) and time.monotonic() - began < HOLD_LIMIT_S:
        time.sleep(0.01)
    return time.monotonic() - began


def release_held_workers(out: Path) -> None:
    """In the rehearsal: let the held workers go on; a later entry of that stage (the relaunch, a ``--resume``) is
    not held again."""
    directory = out / "lifecycle"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / HOLD_RELEASED).touch()
