"""The suite's guard against a test that leaves its worker ignoring SIGCHLD (conftest.py): it must see an ignore set
from C, which :func:`signal.getsignal` does not."""

from __future__ import annotations

import ctypes
import signal
import subprocess

from r1_ascend.testing.child_signals import sigchld_ignored


def test_an_ignore_set_from_c_is_seen_and_the_default_put_back_reads_exit_statuses_again() -> None:
    assert not sigchld_ignored()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    try:
        libc.signal(int(signal.SIGCHLD), ctypes.c_void_p(1))  # SIG_IGN, behind Python's back
        assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL  # what Python believes
        assert sigchld_ignored()
        assert subprocess.run(["false"], check=False).returncode == 0  # the failure is lost
    finally:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    assert not sigchld_ignored()
    assert subprocess.run(["false"], check=False).returncode == 1


def test_the_sigign_mask_is_read_by_signal_number(tmp_path) -> None:
    status = tmp_path / "status"
    status.write_text(f"Name:\tx\nSigIgn:\t{1 << (signal.SIGCHLD - 1):016x}\nSigCgt:\t0\n", encoding="ascii")
    assert sigchld_ignored(str(status))
    status.write_text(f"SigIgn:\t{1 << (signal.SIGCHLD - 2):016x}\n", encoding="ascii")
    assert not sigchld_ignored(str(status))
