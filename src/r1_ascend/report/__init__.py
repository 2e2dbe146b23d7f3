"""Run reports from verl logs: per-step timing table, training curves, sample answers and run comparison.

Entry point: ``r1-ascend report`` (:mod:`r1_ascend.report.cli`). The package reads what stock verl 0.6.1 writes
(console ``step:N - key:value`` lines, TensorBoard event files, rollout/validation JSONL dumps) and never needs
verl itself at run time, so reports can be made on a laptop from copied logs.
"""

from __future__ import annotations
