"""The stand-ins' sitecustomize (rehearsal and tests): nothing is imported at start-up, and whichever of torch,
torch_npu or MindSpeed a process imports first, the stand-ins are in place when it is used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from r1_ascend.rehearse.cluster import SITE

TESTS_SITE = Path(__file__).resolve().parent / "sitecustomize_npu"

START = "import sys; print(sorted(m for m in ('torch', 'torch_npu', 'mindspeed') if m in sys.modules))"
CHECK = "import torch, torch_npu; print(torch.npu.is_available(), torch_npu.npu is torch.npu, torch.npu.device_count())"
FIRST_IMPORTS = {
    "torch": "import torch",
    "torch_npu": "import torch_npu",
    "mindspeed": "import mindspeed.megatron_adaptor",
    "from-torch": "from torch import nn",
}


def _python(site: Path, code: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH", "")]))}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("site", [SITE, TESTS_SITE], ids=["rehearsal", "tests"])
def test_start_up_imports_none_of_them(site: Path) -> None:
    assert _python(site, START) == "[]"


@pytest.mark.parametrize("first", sorted(FIRST_IMPORTS))
def test_the_stand_ins_are_there_whichever_comes_first(first: str) -> None:
    assert _python(SITE, f"{FIRST_IMPORTS[first]}\n{CHECK}") == "False True 0"


@pytest.mark.parametrize("site", [SITE, TESTS_SITE], ids=["rehearsal", "tests"])
def test_every_process_that_uses_torch_multiplies_bf16_with_fp32_accumulation(site: Path) -> None:
    code = "import torch\nfrom r1_ascend.cpu import bf16_gemm\nprint(bf16_gemm.installed())"
    assert _python(site, code) == "True"
