"""What a new user reads: plain-text help, correct plurals, counts in human units."""

from __future__ import annotations

import subprocess
import sys

import pytest

from r1_ascend.cli import SUBCOMMANDS, plain_help
from r1_ascend.launch.units import human_count, plural


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_subcommand_help_is_plain_text(command):
    done = subprocess.run(
        [sys.executable, "-m", "r1_ascend.cli", command, "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "``" not in done.stdout
    assert "usage:" in done.stdout


def test_plain_help_drops_rest_literals_only():
    assert plain_help("run ``r1-ascend preflight`` with ``key=value``") == "run r1-ascend preflight with key=value"
    assert plain_help("a `single` quote stays") == "a `single` quote stays"
    assert plain_help(None) == ""


@pytest.mark.parametrize(("count", "text"), [(0, "0 nodes"), (1, "1 node"), (2, "2 nodes"), ("16", "16 nodes")])
def test_plural(count, text):
    assert plural(count, "node") == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (671_026_419_200, "671 B"),
        (5_720_000_000, "5.72 B"),
        (7_615_616_512, "7.62 B"),
        (2_100_000, "2.1 M"),
        (41_500, "41.5 k"),
        (512, "512"),
        (0, "0"),
        (1.2e12, "1.2 T"),
    ],
)
def test_human_count_never_shows_zero_billions(value, text):
    assert human_count(value) == text
