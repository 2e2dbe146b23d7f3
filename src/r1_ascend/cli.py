"""The ``r1-ascend`` command: one entry point, one module per subcommand.

Each subcommand lives in its own module exposing ``main(argv: list[str]) -> int``; it is imported only when
chosen, so ``r1-ascend doctor`` does not pay for importing the weight converter or matplotlib.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence

# name -> (module, one-line help). Order is the order shown in --help.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "quickstart": ("r1_ascend.launch.quickstart", "run the end-to-end quickstart (CPU: sample data, tiny model)"),
    "doctor": ("r1_ascend.doctor", "check the installed stack against the pins and every patch target"),
    "prepare-data": ("r1_ascend.data.cli", "deepscaler JSON -> verl parquet with the R1 template"),
    "convert-weights": ("r1_ascend.weights.cli", "FP8->BF16, config fix and HF->Megatron conversion"),
    "preflight": ("r1_ascend.launch.preflight", "check a run configuration before taking the cluster"),
    "check-model": ("r1_ascend.weights.model_check", "the Megatron actor from the dist checkpoint vs transformers"),
    "evaluate": ("r1_ascend.evaluate.cli", "pass@1 / pass@k of an HF checkpoint on AIME24, AMC, MATH-500 (R1 setup)"),
    "report": ("r1_ascend.report.cli", "timing table, curves and run comparison from verl logs"),
    "guard-levels": ("r1_ascend.report.guard_levels", "the rollout guard's warn/stop levels measured on healthy runs"),
    "rehearse": ("r1_ascend.rehearse.run", "the whole run on one CPU machine: Ray nodes, verl loop, kill, resume"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="r1-ascend",
        description="DeepSeek-R1-Zero GRPO on Ascend NPUs with stock verl and a documented patch overlay.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def plain_help(doc: str | None) -> str:
    """A module docstring as plain help text: reST literals (double backquotes) become plain words."""
    return re.sub(r"``([^`]+)``", r"\1", doc or "")


def _version() -> str:
    from r1_ascend import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a subcommand; everything after the subcommand name is passed to it unparsed."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if not args or args[0] not in SUBCOMMANDS:
        parser.parse_args(args)  # handles --help / --version / unknown commands with argparse's messages
        parser.print_help()
        return 2
    module_name, _ = SUBCOMMANDS[args[0]]
    module = importlib.import_module(module_name)
    return int(module.main(args[1:]))


def entrypoint() -> None:
    raise SystemExit(main())


if __name__ == "__main__":
    entrypoint()
