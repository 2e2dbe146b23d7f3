"""The planned last step from a run's composed config (Hydra's ``.hydra/config.yaml`` or a file given by the user).

verl 0.6.1 stops after ``trainer.total_training_steps`` when it is set (otherwise after the train dataloader's
length × ``trainer.total_epochs``, which only the log can tell: ``Total training steps: N``). The log wins when both
exist, because it is what the trainer actually used.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from r1_ascend.report.attempts import Planned

HYDRA_CONFIG = Path(".hydra") / "config.yaml"


class RunConfigError(ValueError):
    """A config file given for the run cannot be read."""


def find_run_configs(directory: Path) -> list[Path]:
    """Hydra run directories below ``directory`` (oldest first: a resumed job writes a newer one)."""
    found = [p for p in directory.rglob("config.yaml") if p.parent.name == ".hydra" and p.is_file()]
    return sorted(found, key=lambda p: (p.stat().st_mtime, str(p)))


def planned_from_config(path: Path) -> int | None:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        msg = f"cannot read the run config {path}: {exc}; pass the YAML config the run was started with"
        raise RunConfigError(msg) from exc
    trainer = data.get("trainer") if isinstance(data, dict) else None
    value = trainer.get("total_training_steps") if isinstance(trainer, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def planned_from_configs(paths: list[Path]) -> Planned | None:
    """The last config (in the given order) that sets ``trainer.total_training_steps``."""
    planned = None
    for path in paths:
        total = planned_from_config(path)
        if total is not None:
            planned = Planned(total, f"config `trainer.total_training_steps: {total}` ({path})")
    return planned
