"""The ``r1-ascend`` command starts cheaply: ``--help`` and argument errors of every subcommand import none of the
heavy stacks (torch alone takes more than a second to import; the CLI answers these in a fraction of that).

Measured in a fresh interpreter per case, since the test process itself has these packages loaded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from r1_ascend.cli import SUBCOMMANDS

HEAVY = ("torch", "megatron", "vllm", "vllm_ascend", "verl", "ray", "transformers", "matplotlib")

PROBE = """
import contextlib, io, json, sys
from r1_ascend.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(json.loads(sys.argv[1]))
    except SystemExit as exit:
        code = exit.code
print(json.dumps({"code": code, "loaded": [m for m in json.loads(sys.argv[2]) if m in sys.modules]}))
"""


def heavy_imports(argv: list[str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_help_imports_no_heavy_stack(command: str) -> None:
    result = heavy_imports([command, "--help"])
    assert result["code"] == 0
    assert result["loaded"] == [], f"r1-ascend {command} --help imported {result['loaded']}"


@pytest.mark.parametrize(
    "argv",
    [
        ["rehearse", "--steps", "1"],
        ["rehearse", "--fault", "no-such-fault"],
        ["rehearse", "--lr", "-1"],
        ["evaluate", "/no/such/model"],
        ["evaluate", "model", "--pass-k", "65"],
    ],
)
def test_argument_errors_import_no_heavy_stack(argv: list[str]) -> None:
    result = heavy_imports(argv)
    assert result["code"] == 2
    assert result["loaded"] == [], f"r1-ascend {' '.join(argv)} imported {result['loaded']}"
