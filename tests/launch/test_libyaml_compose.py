"""Composing with libyaml's parser under OmegaConf's loader gives exactly what OmegaConf's own loader gives."""

from __future__ import annotations

import contextlib

import pytest
from omegaconf import OmegaConf

from r1_ascend.launch import overlays


@pytest.mark.parametrize("name", overlays.overlay_names())
def test_every_overlay_composes_identically(name, monkeypatch):
    overrides = ["trainer.nnodes=2", "+actor_rollout_ref.rollout.engine_kwargs.vllm.seed=1e-3"]
    fast = OmegaConf.to_container(overlays.compose(name, overrides), resolve=False)
    monkeypatch.setattr(overlays, "libyaml_parser", contextlib.nullcontext)
    plain = OmegaConf.to_container(overlays.compose(name, overrides), resolve=False)
    assert fast == plain


def test_omegaconf_semantics_survive(tmp_path):
    yaml_text = "a: 1e-3\nb: 2001-01-01\nc: .5\nd: [1, 2]\n"
    (tmp_path / "x.yaml").write_text(yaml_text)
    plain = OmegaConf.to_container(OmegaConf.load(tmp_path / "x.yaml"))
    with overlays.libyaml_parser():
        fast = OmegaConf.to_container(OmegaConf.load(tmp_path / "x.yaml"))
    assert fast == plain == {"a": 1e-3, "b": "2001-01-01", "c": 0.5, "d": [1, 2]}


def test_duplicate_keys_are_still_refused(tmp_path):
    (tmp_path / "dup.yaml").write_text("a: 1\na: 2\n")
    with overlays.libyaml_parser(), pytest.raises(Exception, match="duplicate key a"):
        OmegaConf.load(tmp_path / "dup.yaml")


def test_the_loader_is_restored_afterwards():
    from omegaconf import _utils

    before = _utils.get_yaml_loader
    with overlays.libyaml_parser():
        assert _utils.get_yaml_loader is not before
    assert _utils.get_yaml_loader is before
