"""vllm_dp_ep_groups: one vLLM instance over all ranks (DP = world / TP, EP = world), checked against real vLLM.

The multi-process tests run real torch.distributed (gloo) worlds of 8 and 16 CPU processes and the real
vllm.distributed.parallel_state + vllm-ascend GroupCoordinatorPatch (see tests/patches/dp_group_launcher.py).
Expected group members are written out here from the layout definition (rank = dp_rank * TP + tp_rank), never
taken from the code under test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from r1_ascend.patches import (
    DpEpGroupError,
    PatchTargetError,
    Target,
    apply_one,
    get_original,
    patched_by,
    spec_by_name,
)
from r1_ascend.patches.impl.dp_groups import setup_rollout_groups
from r1_ascend.patches.impl.dp_net import (
    NodeIpError,
    PortSelectionError,
    discover_node_ip,
    interface_ipv4,
    match_interfaces,
    pick_free_port,
    reserved_port_ranges,
)
from r1_ascend.patches.rules.dp_layout import DpEpConfigError, check_rollout_config, plan_dp_ep_layout

NAME = "vllm_dp_ep_groups"
HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
LAUNCHER = HERE / "dp_group_launcher.py"
LAUNCHER_TIMEOUT_S = 150
SPMD = "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd"


def expected_groups(world: int, tp: int) -> tuple[list[list[int]], list[list[int]]]:
    """TP and DP groups from the definition: TP = same rank // tp, DP = same rank % tp."""
    tp_groups = [[s for s in range(world) if s // tp == d] for d in range(world // tp)]
    dp_groups = [[s for s in range(world) if s % tp == t] for t in range(tp)]
    return tp_groups, dp_groups


# --------------------------------------------------------------------------------------------- layout (pure)


class TestLayout:
    def test_world_256_tp_2_matches_the_documented_layout(self) -> None:
        """The production layout: TP [0,1],[2,3]...; two DP groups (even, odd ranks); EP = all 256 ranks."""
        layout = plan_dp_ep_layout(256, 3, 2)
        assert (layout.dp_size, layout.ep_size, layout.dp_rank, layout.tp_rank) == (128, 256, 1, 1)
        assert layout.tp_group == (2, 3)
        assert layout.dp_group == tuple(range(1, 256, 2))
        assert layout.ep_group == tuple(range(256))
        assert layout.dp_master_ranks == (0, 1)

    @pytest.mark.parametrize(("world", "tp"), [(8, 2), (16, 4)])
    def test_groups_for_every_rank(self, world: int, tp: int) -> None:
        tp_groups, dp_groups = expected_groups(world, tp)
        for rank in range(world):
            layout = plan_dp_ep_layout(world, rank, tp)
            assert list(layout.tp_group) == tp_groups[rank // tp]
            assert list(layout.dp_group) == dp_groups[rank % tp]
            assert layout.dp_master_rank == rank % tp

    def test_literal_world_8_tp_2(self) -> None:
        layout = plan_dp_ep_layout(8, 5, 2)
        assert [list(g) for g in layout.tp_groups] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert [list(g) for g in layout.dp_groups] == [[0, 2, 4, 6], [1, 3, 5, 7]]
        assert (layout.dp_rank, layout.tp_rank) == (2, 1)

    @settings(max_examples=60, deadline=None)
    @given(st.integers(1, 64), st.integers(1, 16), st.data())
    def test_groups_partition_the_world(self, dp: int, tp: int, data: st.DataObject) -> None:
        """TP groups and DP groups each partition the world and cross in exactly one rank."""
        world = dp * tp
        rank = data.draw(st.integers(0, world - 1))
        layout = plan_dp_ep_layout(world, rank, tp)
        assert sorted(r for g in layout.tp_groups for r in g) == list(range(world))
        assert sorted(r for g in layout.dp_groups for r in g) == list(range(world))
        assert all(len(set(t) & set(d)) == 1 for t in layout.tp_groups for d in layout.dp_groups)
        assert layout.dp_group.index(rank) == layout.dp_rank
        assert layout.tp_group.index(rank) == layout.tp_rank

    def test_world_not_divisible_by_tp_is_an_error(self) -> None:
        with pytest.raises(DpEpConfigError, match=r"world size 10 is not divisible by the rollout tensor-parallel"):
            plan_dp_ep_layout(10, 0, 4)

    def test_disagreeing_vllm_dp_size_names_both_values_and_the_fix(self) -> None:
        with pytest.raises(DpEpConfigError) as info:
            plan_dp_ep_layout(256, 0, 2, "64")
        message = str(info.value)
        assert "VLLM_DP_SIZE=64" in message
        assert "world size 256" in message
        assert "= DP 128" in message
        assert "Unset VLLM_DP_SIZE" in message
        assert "set it to 128" in message

    @pytest.mark.parametrize("raw", ["abc", "1.5", "0x10"])
    def test_non_integer_vllm_dp_size_is_an_error(self, raw: str) -> None:
        with pytest.raises(DpEpConfigError, match="is not an integer"):
            plan_dp_ep_layout(8, 0, 2, raw)

    @pytest.mark.parametrize("raw", [None, "", "  ", "4", " 4 ", 4])
    def test_unset_or_agreeing_vllm_dp_size_is_accepted(self, raw: object) -> None:
        assert plan_dp_ep_layout(8, 0, 2, raw).dp_size == 4  # type: ignore[arg-type]

    @pytest.mark.parametrize(("world", "rank", "tp"), [(0, 0, 1), (8, 8, 2), (8, -1, 2), (8, 0, 0)])
    def test_impossible_arguments_are_errors(self, world: int, rank: int, tp: int) -> None:
        with pytest.raises(DpEpConfigError):
            plan_dp_ep_layout(world, rank, tp)


class TestRolloutConfig:
    def test_returns_rollout_tp(self) -> None:
        config = {"tensor_model_parallel_size": 4, "data_parallel_size": 1, "pipeline_model_parallel_size": 1}
        assert check_rollout_config(config) == 4

    def test_verl_rollout_data_parallel_size_must_stay_1(self) -> None:
        config = SimpleNamespace(tensor_model_parallel_size=2, data_parallel_size=2, pipeline_model_parallel_size=1)
        with pytest.raises(DpEpConfigError, match=r"data_parallel_size=2, expected 1.*infer_tp"):
            check_rollout_config(config)

    def test_rollout_pipeline_parallelism_is_rejected(self) -> None:
        config = SimpleNamespace(tensor_model_parallel_size=2, data_parallel_size=1, pipeline_model_parallel_size=2)
        with pytest.raises(DpEpConfigError, match="pipeline_model_parallel_size=2, expected 1"):
            check_rollout_config(config)

    def test_real_verl_rollout_config_is_understood(self) -> None:
        from verl.workers.config.rollout import RolloutConfig

        assert check_rollout_config(RolloutConfig(name="vllm", tensor_model_parallel_size=2)) == 2


# --------------------------------------------------------------------------------------------- node IP


@pytest.fixture
def no_guessing(monkeypatch: pytest.MonkeyPatch) -> None:
    """IP discovery must neither connect a socket (the 8.8.8.8 trick) nor shell out (ifconfig)."""

    def forbidden(*args: object, **kwargs: object) -> None:
        pytest.fail("IP discovery connected a socket or started a process")

    monkeypatch.setattr(socket.socket, "connect", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)


@pytest.mark.usefixtures("no_guessing")
class TestNodeIp:
    def test_loopback_interface_is_127_0_0_1(self) -> None:
        assert interface_ipv4("lo") == "127.0.0.1"

    @pytest.mark.parametrize("variable", ["HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"])
    def test_configured_nic_wins(self, variable: str) -> None:
        env = {variable: "lo", "MASTER_ADDR": "10.9.8.7"}
        assert discover_node_ip(env, rank=0) == "127.0.0.1"
        assert discover_node_ip(env, rank=5) == "127.0.0.1"

    def test_hccl_variable_is_read_before_gloo(self) -> None:
        with pytest.raises(NodeIpError, match="HCCL_SOCKET_IFNAME='no-such-nic0'"):
            discover_node_ip({"HCCL_SOCKET_IFNAME": "no-such-nic0", "GLOO_SOCKET_IFNAME": "lo"}, rank=0)

    def test_unknown_interface_lists_the_available_ones(self) -> None:
        with pytest.raises(NodeIpError, match=r"matches no network interface.*\blo\b"):
            discover_node_ip({"HCCL_SOCKET_IFNAME": "no-such-nic0"}, rank=0)
        with pytest.raises(NodeIpError, match="has no IPv4 address"):
            interface_ipv4("no-such-nic0")

    def test_interface_selection_rules(self) -> None:
        available = ["lo", "eth0", "eth1", "enp3s0"]
        assert match_interfaces("eth", available) == ["eth0", "eth1"]
        assert match_interfaces("=eth1", available) == ["eth1"]
        assert match_interfaces("=eth", available) == []
        assert match_interfaces("enp3s0, eth0", available) == ["enp3s0", "eth0"]
        with pytest.raises(NodeIpError, match="exclusion list"):
            match_interfaces("^docker", available)

    def test_master_addr_only_for_rank_0(self) -> None:
        env = {"MASTER_ADDR": "10.1.2.3"}
        assert discover_node_ip(env, rank=0) == "10.1.2.3"
        with pytest.raises(NodeIpError) as info:
            discover_node_ip(env, rank=1)
        message = str(info.value)
        assert "rank 1" in message
        assert "HCCL_SOCKET_IFNAME" in message
        assert "GLOO_SOCKET_IFNAME" in message

    def test_loopback_master_addr_serves_every_rank(self) -> None:
        """A loopback rendezvous proves that all ranks share one host."""
        assert discover_node_ip({"MASTER_ADDR": "127.0.0.1"}, rank=7) == "127.0.0.1"

    def test_nothing_configured_is_an_error(self) -> None:
        with pytest.raises(NodeIpError, match="MASTER_ADDR is unset"):
            discover_node_ip({}, rank=0)


# --------------------------------------------------------------------------------------------- ports


class TestPorts:
    def test_reserved_ranges_cover_the_jobs_ports(self) -> None:
        env = {
            "MASTER_PORT": "29444",
            "HCCL_IF_BASE_PORT": "64247",
            "HCCL_HOST_SOCKET_PORT_RANGE": "50000-50050",
            "HCCL_NPU_SOCKET_PORT_RANGE": "auto",
            "RAY_ADDRESS": "10.0.0.1:6766",
        }
        ranges = reserved_port_ranges(env)

        def reserved(port: int) -> bool:
            return any(port in r for r in ranges)

        for port in (29444, 64247, 64247 + 500, 50000, 50050, 6766, 6379, 8265, 10002, 19999):
            assert reserved(port), port
        for port in (29445, 50051, 40000):
            assert not reserved(port), port

    def test_hccl_default_base_port_is_reserved_when_unset(self) -> None:
        assert any(60000 in r for r in reserved_port_ranges({}))

    def test_picked_port_is_free_and_outside_excluded_ranges(self) -> None:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        excluded = [range(low, (low + high) // 2)]  # half of the kernel's ephemeral range: forces re-draws
        held = pick_free_port(excluded)
        try:
            assert held.port >= (low + high) // 2
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other, pytest.raises(OSError, match="in use"):
                other.bind(("", held.port))  # still held: no other picker on this host can draw it
        finally:
            held.release()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", held.port))  # released: free for vLLM's DP store

    def test_no_port_left_is_a_clear_error(self) -> None:
        with pytest.raises(PortSelectionError, match="no free TCP port"):
            pick_free_port([range(1, 65536)], attempts=3)


# --------------------------------------------------------------------------------------------- patch wiring


@pytest.fixture
def spec() -> Any:
    return spec_by_name(NAME)


class TestPatch:
    def test_wraps_the_stock_rollout_constructor(self, spec: Any) -> None:
        module = pytest.importorskip(SPMD)
        stock = module.vLLMRollout.__init__
        apply_one(spec)
        wrapped = module.vLLMRollout.__init__
        assert patched_by(wrapped) == NAME
        assert get_original(spec.target("vLLMRollout.__init__")) is stock
        assert wrapped.__wrapped__ is stock
        assert apply_one(spec).value == "already applied"
        assert module.vLLMRollout.__init__ is wrapped

    def test_configuration_is_checked_before_the_engine_is_built(self, spec: Any) -> None:
        """The wrapper runs first: a bad verl config fails with our error, the stock constructor never runs."""
        module = pytest.importorskip(SPMD)
        apply_one(spec)
        config = SimpleNamespace(tensor_model_parallel_size=2, data_parallel_size=4, pipeline_model_parallel_size=1)
        with pytest.raises(DpEpConfigError, match="data_parallel_size=4"):
            module.vLLMRollout(config=config, model_config=None, device_mesh=None)

    def test_requires_torch_distributed(self) -> None:
        import torch.distributed as dist

        assert not dist.is_initialized()
        config = SimpleNamespace(tensor_model_parallel_size=2, data_parallel_size=1, pipeline_model_parallel_size=1)
        with pytest.raises(DpEpGroupError, match=r"torch\.distributed is not initialised"):
            setup_rollout_groups(config)

    def test_missing_target_is_a_documented_error(self, spec: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        """Upstream drift (the class lost its own __init__) raises PatchTargetError naming target, versions, switch."""
        fake = types.ModuleType("r1_ascend_fake_spmd")
        fake.vLLMRollout = type("vLLMRollout", (), {})
        monkeypatch.setitem(sys.modules, fake.__name__, fake)
        drifted = dataclasses.replace(spec, targets=(dataclasses.replace(spec.targets[0], module=fake.__name__),))
        from r1_ascend.patches import vllm_dp_ep_groups

        with pytest.raises(PatchTargetError) as info:
            vllm_dp_ep_groups.apply(drifted)
        message = str(info.value)
        assert "r1_ascend_fake_spmd.vLLMRollout.__init__ not found" in message
        assert "written for verl 0.6.1" in message
        assert f"R1_ASCEND_DISABLE={NAME}" in message

    def test_signature_drift_is_a_documented_error(self, spec: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        fake = types.ModuleType("r1_ascend_fake_spmd")
        fake.vLLMRollout = type("vLLMRollout", (), {"__init__": lambda self, config: None})
        monkeypatch.setitem(sys.modules, fake.__name__, fake)
        target = Target(fake.__name__, "vLLMRollout.__init__", "verl", params=spec.targets[0].params)
        from r1_ascend.patches import vllm_dp_ep_groups

        with pytest.raises(PatchTargetError, match=r"signature of .* drifted"):
            vllm_dp_ep_groups.apply(dataclasses.replace(spec, targets=(target,)))


# --------------------------------------------------------------------------------------------- real worlds


SCENARIOS = [
    {"name": "w8_tp2", "world": 8, "tp": 2, "mode": "groups", "env": {"HCCL_SOCKET_IFNAME": "lo"}},
    {"name": "w16_tp4", "world": 16, "tp": 4, "mode": "groups", "env": {"VLLM_DP_SIZE": "4"}},
    {
        "name": "wrong_dp_size",
        "world": 4,
        "tp": 2,
        "mode": "wrapper",
        "env": {"VLLM_DP_SIZE": "3", "HCCL_SOCKET_IFNAME": "lo"},
        "config": {"tensor_model_parallel_size": 2, "data_parallel_size": 1, "pipeline_model_parallel_size": 1},
    },
    {
        "name": "init_w4_tp2",
        "world": 4,
        "tp": 2,
        "mode": "wrapper_groups",
        "env": {"HCCL_SOCKET_IFNAME": "lo"},
        "config": {"tensor_model_parallel_size": 2, "data_parallel_size": 1, "pipeline_model_parallel_size": 1},
    },
    {
        "name": "init_w4_tp4",
        "world": 4,
        "tp": 4,
        "mode": "wrapper_groups",
        "env": {"HCCL_SOCKET_IFNAME": "lo"},
        "config": {"tensor_model_parallel_size": 4, "data_parallel_size": 1, "pipeline_model_parallel_size": 1},
    },
    {
        "name": "no_nic_for_dp_master",
        "world": 4,
        "tp": 2,
        "mode": "groups",
        "env": {"MASTER_ADDR": "10.255.255.1"},
    },
]


@pytest.fixture(scope="module")
def worlds() -> dict[str, dict[str, Any]]:
    """Run every scenario in one launcher process (vLLM imported once; each world forks from it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "VLLM_LOGGING_LEVEL": "WARNING"}
    for key in ("VLLM_DP_SIZE", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "MASTER_PORT", "RAY_ADDRESS"):
        env.pop(key, None)
    proc = subprocess.Popen(
        [sys.executable, str(LAUNCHER), json.dumps(SCENARIOS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=LAUNCHER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"multi-process launcher hung for {LAUNCHER_TIMEOUT_S}s; stderr tail:\n{err[-3000:]}")
    results = {}
    for line in out.splitlines():
        if line.startswith("DP-RESULT "):
            result = json.loads(line.removeprefix("DP-RESULT "))
            results[result["name"]] = result
    assert proc.returncode == 0, err[-3000:]
    assert set(results) == {s["name"] for s in SCENARIOS}, err[-3000:]
    return results


def _ranks(worlds: dict[str, dict[str, Any]], name: str) -> list[dict[str, Any]]:
    result = worlds[name]
    assert result["complete"], f"{name}: not every rank reported: {result}"
    return result["ranks"]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "world", "tp"), [("w8_tp2", 8, 2), ("w16_tp4", 16, 4)])
def test_real_vllm_groups_span_all_ranks(worlds: dict[str, dict[str, Any]], name: str, world: int, tp: int) -> None:
    """Real vLLM groups: TP/DP as defined, PP of one rank, EP = all ranks, vllm-ascend's coordinator class."""
    ranks = _ranks(worlds, name)
    errors = [r for r in ranks if "error" in r]
    assert not errors, errors[0].get("trace")
    tp_groups, dp_groups = expected_groups(world, tp)
    for r in ranks:
        rank = r["rank"]
        assert r["tp"] == tp_groups[rank // tp]
        assert r["dp"] == dp_groups[rank % tp]
        assert r["pp"] == [rank]
        assert r["ep"] == list(range(world))
        assert r["world_group"] == list(range(world))
        assert (r["tp_rank"], r["dp_rank"]) == (rank % tp, rank // tp)
        assert r["coordinator"] == "GroupCoordinatorPatch"
        assert r["has_all_to_all"]
        assert r["device_communicator"] == "NPUCommunicator"
        assert r["ep_sum"] == world * (world + 1) // 2
        assert r["env"]["VLLM_DP_SIZE"] == str(world // tp)
        assert r["env"]["VLLM_DP_RANK"] == str(rank // tp)
        assert r["env"]["VLLM_DP_MASTER_IP"] == "127.0.0.1"
        assert r["vllm_envs"] == {
            "VLLM_DP_SIZE": world // tp,
            "VLLM_DP_RANK": rank // tp,
            "VLLM_DP_MASTER_IP": "127.0.0.1",
            "VLLM_DP_MASTER_PORT": int(r["env"]["VLLM_DP_MASTER_PORT"]),
        }


@pytest.mark.slow
@pytest.mark.parametrize(("name", "tp"), [("w8_tp2", 2), ("w16_tp4", 4)])
def test_each_dp_group_agrees_on_its_own_free_port(worlds: dict[str, dict[str, Any]], name: str, tp: int) -> None:
    ranks = _ranks(worlds, name)
    ports_by_group: dict[int, set[int]] = {}
    for r in ranks:
        ports_by_group.setdefault(r["rank"] % tp, set()).add(r["rendezvous"][1])
    assert all(len(ports) == 1 for ports in ports_by_group.values()), ports_by_group
    ports = [next(iter(p)) for p in ports_by_group.values()]
    assert len(set(ports)) == tp, "two DP groups on one host drew the same port"
    reserved = reserved_port_ranges({})
    assert not any(port in r for port in ports for r in reserved)


@pytest.mark.slow
def test_wrong_vllm_dp_size_is_rejected_on_every_rank(worlds: dict[str, dict[str, Any]]) -> None:
    for r in _ranks(worlds, "wrong_dp_size"):
        assert r["patched"] == NAME
        assert r["raised"] == "DpEpConfigError", r
        assert "VLLM_DP_SIZE=3" in r["message"]
        assert "= DP 2" in r["message"]


@pytest.mark.slow
def test_missing_dp_master_ip_fails_on_every_rank_together(worlds: dict[str, dict[str, Any]]) -> None:
    """Rank 1 (master of the odd DP group) has no NIC configured: all ranks raise instead of some hanging."""
    for r in _ranks(worlds, "no_nic_for_dp_master"):
        assert r["error"].startswith("DpEpGroupError"), r
        assert "DP master rank 1" in r["error"]
        assert "HCCL_SOCKET_IFNAME" in r["error"]
        assert "DP master rank 0" not in r["error"]


@pytest.mark.slow
def test_patched_init_builds_groups_from_the_real_world_then_runs_stock(worlds: dict[str, dict[str, Any]]) -> None:
    """World 4, rollout TP 2 through verl's vLLMRollout.__init__: DP 2 x TP 2, EP over all 4, then stock runs."""
    tp_groups, dp_groups = expected_groups(4, 2)
    for r in _ranks(worlds, "init_w4_tp2"):
        assert "error" not in r, r.get("trace")
        assert r["patched"] == NAME
        assert r["raised"] is not None, "the stock constructor ran (and failed on the stand-in config)"
        assert not r["raised"].startswith("DpEp"), r["raised"]
        assert r["built"] is True
        rank = r["rank"]
        assert (r["tp"], r["dp"], r["ep"]) == (tp_groups[rank // 2], dp_groups[rank % 2], [0, 1, 2, 3])
        assert r["env"] == {"VLLM_DP_SIZE": "2", "VLLM_DP_RANK": str(rank // 2)}
        assert r["ep_sum"] == 10


@pytest.mark.slow
def test_patched_init_with_dp_1_leaves_the_groups_to_vllm(worlds: dict[str, dict[str, Any]]) -> None:
    """World 4 = rollout TP 4: DP 1, nothing built before LLM() (vLLM builds its own groups), stock runs."""
    for r in _ranks(worlds, "init_w4_tp4"):
        assert "error" not in r, r.get("trace")
        assert r["patched"] == NAME
        assert r["raised"] is not None, "the stock constructor ran (and failed on the stand-in config)"
        assert not r["raised"].startswith("DpEp"), r["raised"]
        assert r["built"] is False
        assert r["env"] == {"VLLM_DP_SIZE": "1", "VLLM_DP_RANK": "0"}
