"""The manifest ``to-megatron`` writes into a dist checkpoint directory, and the one way to read it back.

The writer records it before any data (a rerun with the same manifest resumes); preflight reads it to tell a
checkpoint converted from another model. Both go through this module, so the format has one definition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r1_ascend.parallel import Layout

MEGATRON_MANIFEST = ".r1-ascend-to-megatron.json"


@dataclass(frozen=True)
class MegatronManifest:
    """What a ``to-megatron`` output was converted from and how it was chunked."""

    source: str
    source_config_sha256: str
    layout: Layout
    num_layers: int | None  # decoder layers of the converted model (None: an old manifest that did not say)
    extra_state: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "step": "to-megatron",
            "source": self.source,
            "source_config_sha256": self.source_config_sha256,
            "layout": {
                "tp": self.layout.tp,
                "pp": self.layout.pp,
                "ep": self.layout.ep,
                "pp_layers": list(self.layout.pp_layers),
            },
            "num_layers": self.num_layers,
            "extra_state": self.extra_state,
        }


def parse_megatron_manifest(data: Any) -> MegatronManifest:
    """A manifest from its JSON; also reads the first format, whose ``layout`` was ``[tp, pp, ep, pp_layers]``.

    Raises ``ValueError`` for anything else.
    """
    if not isinstance(data, dict):
        msg = f"a to-megatron manifest is a JSON object, got {type(data).__name__}"
        raise ValueError(msg)
    raw = data.get("layout")
    if isinstance(raw, dict):
        fields = raw
    elif isinstance(raw, list) and len(raw) == 4:
        fields = dict(zip(("tp", "pp", "ep", "pp_layers"), raw, strict=True))
    else:
        msg = f"manifest layout {raw!r} is neither {{tp, pp, ep, pp_layers}} nor [tp, pp, ep, pp_layers]"
        raise ValueError(msg)
    try:
        pp_layers = tuple(int(n) for n in fields.get("pp_layers") or ())
        layout = Layout(tp=int(fields["tp"]), pp=int(fields["pp"]), ep=int(fields["ep"]), pp_layers=pp_layers)
    except (KeyError, TypeError) as exc:
        msg = f"manifest layout {raw!r} lacks an integer tp, pp or ep"
        raise ValueError(msg) from exc
    num_layers = data.get("num_layers")
    if num_layers is None and pp_layers:
        num_layers = sum(pp_layers)
    return MegatronManifest(
        source=str(data.get("source", "")),
        source_config_sha256=str(data.get("source_config_sha256", "")),
        layout=layout,
        num_layers=int(num_layers) if num_layers is not None else None,
        extra_state=bool(data.get("extra_state", True)),
    )


def read_megatron_manifest(directory: Path) -> MegatronManifest | None:
    """The manifest of a ``to-megatron`` output directory, or None when it has none or it cannot be read."""
    path = Path(directory) / MEGATRON_MANIFEST
    try:
        return parse_megatron_manifest(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None
