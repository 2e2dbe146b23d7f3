"""The checkout is found from ``R1_ASCEND_HOME`` or the package's own place, and its absence is said plainly."""

from __future__ import annotations

from pathlib import Path

import pytest

from r1_ascend import checkout, envs

REPO = Path(__file__).resolve().parents[1]


def test_a_package_in_a_checkouts_src_finds_that_checkout():
    package_file = str(REPO / "src" / "r1_ascend" / "checkout.py")
    assert checkout.checkout_root({}, package_file=package_file) == REPO


def test_the_imported_package_finds_a_checkout_with_the_scripts():
    root = checkout.checkout_root({})
    assert checkout.is_checkout(root)
    assert checkout.script("ray_start_npu.sh", {}) == root / "scripts" / "ray_start_npu.sh"


def test_home_wins_and_must_be_a_checkout(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "ray_start_npu.sh").write_text("")
    assert checkout.checkout_root({envs.R1_ASCEND_HOME: str(tmp_path)}) == tmp_path
    with pytest.raises(checkout.CheckoutNotFoundError, match=f"{envs.R1_ASCEND_HOME}=.* is not an r1-ascend checkout"):
        checkout.checkout_root({envs.R1_ASCEND_HOME: str(tmp_path / "scripts")})


def test_an_installed_package_outside_a_checkout_asks_for_home(tmp_path):
    installed = tmp_path / "lib" / "site-packages" / "r1_ascend" / "checkout.py"
    with pytest.raises(checkout.CheckoutNotFoundError) as raised:
        checkout.checkout_root({}, package_file=str(installed))
    assert str(raised.value) == (
        f"the r1_ascend package is installed at {installed.parent}, outside a checkout, and R1_ASCEND_HOME is unset; "
        "set R1_ASCEND_HOME to the r1-ascend repository (the image's is /opt/r1-ascend) so that its scripts/ can be "
        "run"
    )
