"""The overlay's on/off rule (r1_ascend.patches.rules.switches) at its edges: explicit arguments win over the
environment, an unknown name is refused with every name listed (or ignored when not strict), and switching
everything off is said as such."""

from __future__ import annotations

import pytest

from r1_ascend.patches import PATCHES, PatchConfigError
from r1_ascend.patches.rules.switches import Switches, read_switches

NAMES = sorted(spec.name for spec in PATCHES)


def test_explicit_names_win_over_the_environment() -> None:
    switches = read_switches({"R1_ASCEND_DISABLE": NAMES[0]}, disabled=[NAMES[1]])
    assert switches == Switches(False, frozenset({NAMES[1]}))
    assert switches.disable_all is False
    assert not switches.enabled(NAMES[1])
    assert switches.enabled(NAMES[0])


def test_an_explicit_empty_list_switches_nothing_off() -> None:
    assert read_switches({"R1_ASCEND_DISABLE": NAMES[0]}, disabled=[]).disabled == frozenset()


def test_explicit_disable_all_wins_over_the_environment() -> None:
    assert read_switches({"R1_ASCEND_DISABLE_ALL": "1"}, disable_all=False).disable_all is False
    everything = read_switches({}, disable_all=True)
    assert everything == Switches(True, frozenset(NAMES))


def test_unknown_names_are_refused_with_the_valid_ones_listed() -> None:
    with pytest.raises(PatchConfigError) as info:
        read_switches({"R1_ASCEND_DISABLE": f"zz_typo, {NAMES[0]}, aa_typo"})
    assert str(info.value) == (
        f"unknown patch name(s) in R1_ASCEND_DISABLE: aa_typo, zz_typo; valid names: {', '.join(NAMES)}"
    )


def test_unknown_names_are_ignored_when_not_strict() -> None:
    switches = read_switches({"R1_ASCEND_DISABLE": f"typo,{NAMES[0]}"}, strict=False)
    assert switches == Switches(False, frozenset({NAMES[0]}))
