"""The checkout is found from ``R1_ASCEND_HOME`` or the package's own place, and its absence is said plainly."""

from __future__ import annotations

from pathlib import Path

import pytest

from r1_ascend import checkout, envs

REPO = Path(__file__).resolve().parents[1]


def test_an_editable_checkout_is_found_from_the_package():
    assert checkout.checkout_root({}) == REPO
    assert checkout.script("ray_start_npu.sh", {}) == REPO / "scripts" / "ray_start_npu.sh"


def test_home_wins_and_must_be_a_checkout(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "ray_start_npu.sh").write_text("")
    assert checkout.checkout_root({envs.R1_ASCEND_HOME: str(tmp_path)}) == tmp_path
    with pytest.raises(checkout.CheckoutNotFoundError, match=f"{envs.R1_ASCEND_HOME}=.* is not an r1-ascend checkout"):
        checkout.checkout_root({envs.R1_ASCEND_HOME: str(tmp_path / "scripts")})


def test_an_installed_package_outside_a_checkout_asks_for_home(tmp_path):
    installed = tmp_path / "lib" / "site-packages" / "r1_ascend" / "checkout.py"
    with pytest.raises(checkout.CheckoutNotFoundError, match="set R1_ASCEND_HOME"):
        checkout.checkout_root({}, package_file=str(installed))
