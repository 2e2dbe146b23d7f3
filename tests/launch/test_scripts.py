"""Every script in scripts/ is valid bash and shellcheck-clean; the run script's dry run and env derivation."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "scripts").glob("*.sh"))
SHELLCHECK = Path(sys.executable).parent / "shellcheck"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax(script):
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_clean(script):
    done = subprocess.run([str(SHELLCHECK), "-x", str(script)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stdout


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HCCL_", "NNODES", "NPUS_PER_NODE"))}
    return {**env, "PYTHON": sys.executable, **extra}


def test_npu_env_leaves_vllm_dp_size_to_the_rollout_patch():
    code = 'source scripts/npu_env.sh && echo "${VLLM_DP_SIZE-unset} $HCCL_SOCKET_IFNAME $VERL_USE_EXTERNAL_MODULES"'
    out = subprocess.run(
        ["bash", "-c", code],
        env=_env(NNODES="16", NPUS_PER_NODE="16", SOCKET_IFNAME="eth7"),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    # the vllm_dp_ep_groups patch derives VLLM_DP_SIZE in each rollout worker (r1_ascend.patches.rules.dp_layout)
    assert out.stdout.split() == ["unset", "eth7", "r1_ascend.patches.prelude"]


def test_run_script_dry_run_prints_the_command(smoke_inputs):
    env = _env(
        MODEL_PATH=str(smoke_inputs.model),
        DIST_CKPT_DIR=str(smoke_inputs.ckpt),
        DATA_DIR=str(smoke_inputs.data),
        NNODES="1",
        NPUS_PER_NODE="16",
        OUTPUT_DIR=str(smoke_inputs.data.parent / "outputs"),
    )
    done = subprocess.run(
        ["bash", "scripts/run_grpo_smoke_npu.sh", "--dry-run"], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "preflight: passed" in done.stdout
    assert "-m r1_ascend.recipe.main_grpo --config-name=grpo_deepseekv3_smoke" in done.stdout
    assert f"actor_rollout_ref.model.path={smoke_inputs.model}" in done.stdout


def test_run_script_stops_on_preflight_errors(smoke_inputs):
    env = _env(
        MODEL_PATH=str(smoke_inputs.model),
        DATA_DIR=str(smoke_inputs.data),
        VLLM_DP_SIZE="128",
        OUTPUT_DIR=str(smoke_inputs.data.parent / "outputs"),
    )
    done = subprocess.run(
        ["bash", "scripts/run_grpo_smoke_npu.sh", "--dry-run", f"+x={1}"],
        env={**env, "DIST_CKPT_DIR": str(smoke_inputs.ckpt)},
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "dry run" not in done.stdout


def test_every_variable_the_scripts_read_is_documented():
    """docs/environment.md lists every variable a script expands that starts upper-case (locals are lower-case; some
    upstream names continue in lower case, e.g. Ray's ``RAY_kill_child_processes_...``)."""
    documented = (REPO / "docs" / "environment.md").read_text(encoding="utf-8")
    read = {name for script in SCRIPTS for name in re.findall(r"\$\{([A-Z][A-Za-z0-9_]*)", script.read_text())}
    missing = sorted(name for name in read - {"BASH_SOURCE", "PWD"} if f"`{name}`" not in documented)
    assert missing == [], f"variables read by scripts/*.sh but not in docs/environment.md: {missing}"
