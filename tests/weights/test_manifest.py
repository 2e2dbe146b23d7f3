"""The to-megatron manifest: what the writer records is what preflight reads, in the current and the first format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r1_ascend.parallel import Layout
from r1_ascend.weights import convert_hf_to_megatron
from r1_ascend.weights.manifest import (
    MEGATRON_MANIFEST,
    MegatronManifest,
    parse_megatron_manifest,
    read_megatron_manifest,
)


def test_the_writer_records_what_the_reader_returns(tiny_bf16: Path, tmp_path: Path) -> None:
    out = tmp_path / "mcore"
    layout = Layout(pp=2, ep=2, pp_layers=(2, 1))
    convert_hf_to_megatron(tiny_bf16, out, layout, progress=False)
    manifest = read_megatron_manifest(out)
    assert manifest is not None
    assert manifest.layout == layout
    assert manifest.num_layers == json.loads((tiny_bf16 / "config.json").read_text())["num_hidden_layers"]
    assert manifest.source == str(tiny_bf16.resolve())
    assert parse_megatron_manifest(manifest.to_json()) == manifest


def test_the_first_format_is_still_read(tmp_path: Path) -> None:
    old = {"step": "to-megatron", "source": "/x", "layout": [1, 8, 32, [6, 8, 8, 8, 8, 8, 8, 7]], "extra_state": True}
    (tmp_path / MEGATRON_MANIFEST).write_text(json.dumps(old))
    manifest = read_megatron_manifest(tmp_path)
    assert manifest == MegatronManifest("/x", "", Layout(tp=1, pp=8, ep=32, pp_layers=(6, 8, 8, 8, 8, 8, 8, 7)), 61)
    old["layout"] = [1, 1, 1, []]
    assert parse_megatron_manifest(old).num_layers is None  # no split recorded: the layer count is unknown


@pytest.mark.parametrize("text", ["[]", "{}", '{"layout": [1, 2]}', '{"layout": {"tp": 1}}', "not json"])
def test_a_foreign_manifest_reads_as_none(tmp_path: Path, text: str) -> None:
    (tmp_path / MEGATRON_MANIFEST).write_text(text)
    assert read_megatron_manifest(tmp_path) is None
    assert read_megatron_manifest(tmp_path / "missing") is None
