"""The validation sets shipped in ``data/val/`` and the ``data_source`` name each one gets.

verl groups validation metrics by ``data_source`` (``val-core/<data_source>/acc/mean@N``), so each set keeps
its own name even when all of them are written to one parquet file.
"""

from __future__ import annotations

from pathlib import Path

VAL_DIR = Path(__file__).resolve().parent / "val"

# data_source -> file in data/val/ (agentica-project/deepscaler@95ef74ff deepscaler/data/test/, MIT)
SHIPPED_VAL_SETS: dict[str, str] = {
    "aime24": "deepscaler_test_aime24.json",
    "amc": "deepscaler_test_amc.json",
    "math500": "deepscaler_test_math500.json",
}


def shipped_val_path(name: str) -> Path:
    """Path of a shipped validation set; a clear error names the known sets otherwise."""
    try:
        return VAL_DIR / SHIPPED_VAL_SETS[name]
    except KeyError:
        known = ", ".join(SHIPPED_VAL_SETS)
        msg = f"unknown validation set {name!r}; shipped sets are {known} (or give NAME=PATH for your own file)"
        raise ValueError(msg) from None


def resolve_val_sets(specs: list[str] | None) -> list[tuple[str, Path]]:
    """``["aime24", "mine=path.json"]`` -> ``[(data_source, path), ...]``; ``None``/empty -> all shipped sets."""
    if not specs:
        return [(name, shipped_val_path(name)) for name in SHIPPED_VAL_SETS]
    resolved: list[tuple[str, Path]] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        name = name.strip()
        if not name:
            msg = f"validation set {spec!r} has no name; use NAME or NAME=PATH"
            raise ValueError(msg)
        resolved.append((name, Path(path) if sep else shipped_val_path(name)))
    names = [name for name, _ in resolved]
    if len(set(names)) != len(names):
        msg = f"validation set names must be unique (they become data_source values): {names}"
        raise ValueError(msg)
    return resolved
