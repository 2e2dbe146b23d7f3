"""The environment each simulated node's ``ray_start_npu.sh`` gets (r1_ascend.rehearse.cluster.node_envs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from r1_ascend.rehearse.cluster import node_envs
from r1_ascend.rehearse.config import Plan


@pytest.mark.parametrize("npus", [1, 2, 4])
def test_every_node_has_a_logical_cpu_per_worker_bundle_and_one_for_the_taskrunner(tmp_path: Path, npus: int) -> None:
    """verl places each worker in a bundle of one CPU (``RayResourcePool``, ``max_colocate_count=1`` in
    ``ResourcePoolManager.create_resource_pool``), and the head also hosts the TaskRunner (one CPU): fewer logical CPUs
    and a node of several fake NPUs never places its workers."""
    envs, _ = node_envs(tmp_path, Plan(npus_per_node=npus), tmp_path / "launch.sh")
    assert len(envs) == Plan().nodes
    assert {env["NPUS_PER_NODE"] for env in envs} == {str(npus)}
    assert all(int(env["RAY_NUM_CPUS"]) >= npus + 1 for env in envs)
