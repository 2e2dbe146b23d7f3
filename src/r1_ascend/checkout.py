"""Where the r1-ascend checkout is: the shell scripts live in the repository, not in the installed package.

The package is installed (``pip install .`` in the image, editable in the CPU ``.venv``) and imported from
site-packages; ``scripts/`` stays in the checkout. A command that starts a script (the rehearsal starts
``scripts/ray_start_npu.sh`` on each simulated node) finds it through ``R1_ASCEND_HOME`` (the image sets it, the scripts
export it), else through the package's own location when that is a checkout (an editable install), and otherwise
says how to point at one instead of guessing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from r1_ascend import envs

#: A file only a checkout has, relative to its root.
MARKER = Path("scripts") / "ray_start_npu.sh"


class CheckoutNotFoundError(RuntimeError):
    """No r1-ascend checkout: neither ``R1_ASCEND_HOME`` nor the package's location holds ``scripts/``."""


def is_checkout(path: Path) -> bool:
    return (path / MARKER).is_file()


def checkout_root(environ: Mapping[str, str] | None = None, package_file: str = __file__) -> Path:
    """The checkout's root: ``R1_ASCEND_HOME`` when set (it must be a checkout), else the folder two levels above
    the package (``src/r1_ascend/`` in a checkout)."""
    home = envs.project_home(environ)
    if home is not None:
        root = Path(home).expanduser().resolve()
        if not is_checkout(root):
            msg = f"{envs.R1_ASCEND_HOME}={home} is not an r1-ascend checkout: {root / MARKER} does not exist"
            raise CheckoutNotFoundError(msg)
        return root
    root = Path(package_file).resolve().parents[2]
    if is_checkout(root):
        return root
    msg = (
        f"the r1_ascend package is installed at {Path(package_file).resolve().parent}, outside a checkout, and "
        f"{envs.R1_ASCEND_HOME} is unset; set {envs.R1_ASCEND_HOME} to the r1-ascend repository (the image's is "
        "/opt/r1-ascend) so that its scripts/ can be run"
    )
    raise CheckoutNotFoundError(msg)


def script(name: str, environ: Mapping[str, str] | None = None) -> Path:
    """``scripts/<name>`` of the checkout."""
    return checkout_root(environ) / "scripts" / name
