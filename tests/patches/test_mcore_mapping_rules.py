"""Where a shard of a megatron-core tensor overlaps one of the HF tensors it is made of (``rules/mcore_mapping.py``,
``HFSource.intersect``): the weight-sync check's export side predicts each HF fingerprint from these slices."""

from __future__ import annotations

import itertools

import torch

from r1_ascend.patches.rules.mcore_mapping import HFSource, MappedTensor

GATE_UP = MappedTensor("decoder.layers.3.mlp.linear_fc1.weight", (8, 4), "bfloat16", 3, "dense", ("g", "u"))


def test_a_shard_across_two_hf_tensors_takes_each_ones_part() -> None:
    """fc1 rows 0:4 are gate, 4:8 up; a TP shard of rows 2:6 holds the end of one, the start of the other."""
    gate = HFSource("g", GATE_UP, (0, 0), (4, 4))
    up = HFSource("u", GATE_UP, (4, 0), (4, 4))
    assert gate.intersect((2, 0), (4, 4)) == ((slice(2, 4), slice(0, 4)), (slice(0, 2), slice(0, 4)))
    assert up.intersect((2, 0), (4, 4)) == ((slice(0, 2), slice(0, 4)), (slice(2, 4), slice(0, 4)))
    assert up.intersect((0, 0), (4, 4)) is None  # touching at row 4: no overlap
    assert gate.intersect((0, 1), (8, 2)) == ((slice(0, 4), slice(1, 3)), (slice(0, 4), slice(0, 2)))


def test_the_expert_axis_is_in_the_shard_but_not_in_the_hf_tensor() -> None:
    """Expert 5 of a grouped (experts, rows, cols) tensor: its HF tensor has no leading axis, the shard has."""
    experts = MappedTensor("decoder.layers.3.mlp.experts.weight2", (8, 3, 2), "bfloat16", 3, "experts", ("p",))
    source = HFSource("e5", experts, (5, 0, 0), (3, 2), lead=1)
    assert source.box_shape == (1, 3, 2)
    assert source.intersect((4, 0, 0), (2, 3, 2)) == (
        (slice(0, 3), slice(0, 2)),
        (slice(1, 2), slice(0, 3), slice(0, 2)),
    )
    assert source.intersect((6, 0, 0), (2, 3, 2)) is None  # another EP rank's experts


def test_the_slices_move_the_same_values_for_every_shard() -> None:
    """Every 2-D shard of a 6 x 6 tensor over an HF box at (1, 2) of 4 x 3: the shard's slice holds exactly what the
    HF slice does, and the overlaps of a tiling cover the box once."""
    full = torch.arange(36).view(6, 6)
    source = HFSource("x", MappedTensor("k", (6, 6), "float32", None, "dense", ("x",)), (1, 2), (4, 3))
    hf = full[1:5, 2:5]
    for rows, cols in itertools.product([(0, 3), (3, 3)], [(0, 2), (2, 2), (4, 2)]):
        hit = source.intersect((rows[0], cols[0]), (rows[1], cols[1]))
        shard = full[rows[0] : rows[0] + rows[1], cols[0] : cols[0] + cols[1]]
        if hit is not None:
            assert torch.equal(hf[hit[0]], shard[hit[1]])
    covered = torch.zeros(4, 3, dtype=torch.int64)
    for r0, c0 in itertools.product([0, 3], [0, 2, 4]):
        hit = source.intersect((r0, c0), (3, 2))
        if hit is not None:
            covered[hit[0]] += 1
    assert torch.equal(covered, torch.ones(4, 3, dtype=torch.int64))
