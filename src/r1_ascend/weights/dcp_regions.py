"""Read arbitrary regions of tensors from a ``torch_dist`` (PyTorch DCP) checkpoint, without a process group.

megatron-core's ``dist_checkpointing.load`` insists on whole tensors when one process loads (its access check, and
the shard grid it builds, assume the ranks together request every element), so loading one MoE layer's experts
would mean holding all of them (15 GB per layer for V3). DCP itself reads any region: a ``LoadPlanner`` lists the
regions wanted, DCP's ``FileSystemReader`` finds the overlapping stored chunks (whatever TP/PP/EP wrote them),
reads each and copies the overlap into the destination. Memory is the regions plus one stored chunk at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from r1_ascend.weights.errors import CheckpointFormatError

Region = tuple[str, tuple[int, ...]]  # (dist key, offsets in the global tensor)


class _RegionPlanner(DefaultLoadPlanner):
    """Plans reads of the given regions only; each lands in its destination tensor."""

    def __init__(self, regions: dict[Region, torch.Tensor]):
        super().__init__()
        self.regions = regions

    def set_up_planner(self, state_dict: Any, metadata: Metadata | None = None, is_coordinator: bool = False) -> None:
        self.metadata = metadata
        self.is_coordinator = is_coordinator
        self.state_dict = state_dict

    def create_local_plan(self) -> LoadPlan:
        items: list[ReadItem] = []
        for (key, offsets), dest in self.regions.items():
            md = self.metadata.state_dict_metadata.get(key) if self.metadata else None
            if not isinstance(md, TensorStorageMetadata):
                msg = f"the checkpoint has no tensor {key!r}"
                raise CheckpointFormatError(msg)
            end = [o + s for o, s in zip(offsets, dest.shape, strict=True)]
            if any(e > g for e, g in zip(end, md.size, strict=True)):
                msg = f"{key}: region {offsets}+{tuple(dest.shape)} exceeds the stored shape {tuple(md.size)}"
                raise CheckpointFormatError(msg)
            chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=dest.shape)
            items += create_read_items_for_chunk_list(key, md, [chunk])
        return LoadPlan(items)

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        dest = self.regions[(read_item.dest_index.fqn, tuple(read_item.dest_index.offset))]
        for dim, (start, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths, strict=True)):
            dest = dest.narrow(dim, start, length)
        return dest

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        """The destination was written in place."""


def read_regions(ckpt_dir: Path, regions: dict[Region, torch.Tensor]) -> None:
    """Fill each destination tensor with the region of its dist tensor starting at the given offsets."""
    if not regions:
        return
    dcp.load({}, storage_reader=FileSystemReader(str(ckpt_dir)), planner=_RegionPlanner(regions), no_dist=True)
