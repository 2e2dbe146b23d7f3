"""The shared layout type and the pipeline split, the split checked against megatron-core's own code."""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from r1_ascend.parallel import Layout, LayoutError, stage_layers


@pytest.fixture(scope="module")
def megatron_split():
    """Layers per stage as megatron-core 0.12.1 builds them: TransformerConfig validates the sizes, then
    ``get_num_layers_to_build`` is asked once per stage (parallel_state answered for that stage)."""
    config_module = pytest.importorskip("megatron.core.transformer.transformer_config")
    block = pytest.importorskip("megatron.core.transformer.transformer_block")
    import torch

    def split(num_layers: int, pp: int, first: int | None, last: int | None) -> list[int]:
        cfg = config_module.TransformerConfig(
            num_layers=num_layers,
            hidden_size=8,
            num_attention_heads=1,
            pipeline_model_parallel_size=pp,
            pipeline_dtype=torch.bfloat16,
            num_layers_in_first_pipeline_stage=first,
            num_layers_in_last_pipeline_stage=last,
        )
        stages = []
        for stage in range(pp):
            with mock.patch.multiple(
                block.parallel_state,
                get_pipeline_model_parallel_world_size=lambda: pp,
                is_pipeline_first_stage=lambda ignore_virtual=False, s=stage: s == 0,
                is_pipeline_last_stage=lambda ignore_virtual=False, s=stage: s == pp - 1,
                get_virtual_pipeline_model_parallel_world_size=lambda: None,
            ):
                stages.append(block.get_num_layers_to_build(cfg))
        return stages

    return split


@settings(max_examples=150, deadline=None)
@given(
    num_layers=st.integers(1, 64),
    pp=st.integers(1, 9),
    first=st.one_of(st.none(), st.integers(-1, 12)),
    last=st.one_of(st.none(), st.integers(-1, 12)),
)
def test_split_agrees_with_megatron_core(megatron_split, num_layers, pp, first, last) -> None:
    try:
        ours = stage_layers(num_layers, pp, first=first, last=last)
    except LayoutError:
        ours = None
    try:
        theirs = megatron_split(num_layers, pp, first, last)
    except (ValueError, AssertionError, ZeroDivisionError):
        theirs = None
    if ours is not None:
        assert theirs == ours
        assert sum(ours) == num_layers
    else:
        # refused by us: megatron refuses too, or builds a stage without layers (which we never accept), or the
        # first/last sizes are set on a single stage (megatron's arithmetic then runs on -1 middle stages)
        assert theirs is None or min(theirs) < 1 or pp == 1


@settings(max_examples=200, deadline=None)
@given(
    num_layers=st.integers(1, 40),
    stages=st.lists(st.integers(-1, 12), min_size=1, max_size=9),
    pp=st.integers(1, 9),
)
def test_explicit_split_is_taken_exactly_when_it_describes_the_model(num_layers, stages, pp) -> None:
    fits = len(stages) == pp and sum(stages) == num_layers and min(stages) >= 1
    if fits:
        assert stage_layers(num_layers, pp, explicit=stages) == stages
    else:
        with pytest.raises(LayoutError, match=r"layers per stage \["):
            stage_layers(num_layers, pp, explicit=stages)


def test_explicit_split_excludes_first_and_last() -> None:
    with pytest.raises(LayoutError, match="give either those or the whole list"):
        stage_layers(4, 2, first=2, explicit=[2, 2])


def test_refusals_name_the_values() -> None:
    with pytest.raises(LayoutError, match="61 layers do not split evenly over pipeline_model_parallel_size=8"):
        stage_layers(61, 8)
    with pytest.raises(LayoutError, match="must be >= 1, got 0"):
        stage_layers(4, 0)
    assert stage_layers(61, 8, first=5) == [5, 8, 8, 8, 8, 8, 8, 8]
    assert Layout(pp=8, pp_layers=(6, 8, 8, 8, 8, 8, 8, 7)).stage_layers(61) == [6, 8, 8, 8, 8, 8, 8, 7]


@settings(max_examples=200, deadline=None)
@given(
    tp=st.integers(1, 8),
    pp=st.integers(1, 8),
    cp=st.integers(1, 4),
    ep=st.integers(1, 8),
    etp=st.one_of(st.none(), st.integers(1, 8)),
    replicas=st.integers(1, 4),
)
def test_sizes(tp, pp, cp, ep, etp, replicas) -> None:
    smallest = Layout(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp)
    expert_tp = tp if etp is None else etp
    world = smallest.world_size
    # the smallest world holds one replica of both the dense and the expert parameters, and no smaller one does
    assert world % (tp * pp * cp) == 0
    assert world % (pp * ep * expert_tp) == 0
    assert all(w % (tp * pp * cp) or w % (pp * ep * expert_tp) for w in range(1, world))
    layout = Layout(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, world=world * replicas)
    assert layout.dp * layout.model_parallel == layout.world_size
    assert layout.expert_dp * layout.expert_model_parallel == layout.world_size
    assert layout.expert_tp == expert_tp


@given(tp=st.integers(1, 6), pp=st.integers(1, 6), ep=st.integers(1, 6))
def test_rank_order_numbers_every_rank_once(tp, pp, ep) -> None:
    """The converter's virtual ranks: every (stage, EP rank, TP rank) a distinct rank below world_size."""
    layout = Layout(tp=tp, pp=pp, ep=ep)
    ranks = [layout.rank(s, e, t) for s in range(pp) for e in range(ep) for t in range(tp)]
    assert sorted(ranks) == list(range(layout.world_size))
    assert layout.rank(0, 0, 1 % tp) == 1 % tp  # TP rank innermost
