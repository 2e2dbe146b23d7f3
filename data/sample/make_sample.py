"""Re-create ``deepscaler_sample.json`` from the two deepscaler training components.

Usage (from the repository root; the component files are not shipped):
    python data/sample/make_sample.py --components ../shared/data

Picks, with a fixed seed, 256 rows of ``deepscaler_component_math.json`` and 64 of
``deepscaler_component_aime.json`` among rows with a non-empty string answer and a problem not seen before, and
writes them (all original fields, component order) as one JSON array.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

COMPONENTS = (("deepscaler_component_math.json", 256), ("deepscaler_component_aime.json", 64))
SEED = 20250214


def select(components_dir: Path, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    seen: set[str] = set()
    chosen: list[dict] = []
    for name, count in COMPONENTS:
        rows = json.loads((components_dir / name).read_text(encoding="utf-8"))
        usable = []
        for position, row in enumerate(rows):
            key = " ".join(row["problem"].split())
            if isinstance(row.get("answer"), str) and row["answer"].strip() and key not in seen:
                seen.add(key)
                usable.append(position)
        chosen += [rows[position] for position in sorted(rng.sample(usable, count))]
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--components", type=Path, default=Path("../shared/data"))
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parent / "deepscaler_sample.json")
    args = parser.parse_args()
    rows = select(args.components)
    args.output.write_text(json.dumps(rows, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {len(rows)} rows to {args.output}")


if __name__ == "__main__":
    main()
