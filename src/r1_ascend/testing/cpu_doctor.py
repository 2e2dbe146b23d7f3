"""``r1-ascend doctor`` on a machine without an NPU: the torch_npu CPU stub first, then the real doctor.

``doctor --import`` imports vllm-ascend, which imports ``torch_npu`` at module level; without CANN that import fails.
This entry point installs the stub of ``r1_ascend.testing.npu_stub`` (and nothing else) and runs the unchanged
doctor, so its import check resolves every patch target against the real upstream source on a CPU machine. Production
code never imports it: ``python -m r1_ascend.testing.cpu_doctor --import``.
"""

from __future__ import annotations

import sys

from r1_ascend.testing import npu_stub


def main(argv: list[str] | None = None) -> int:
    from r1_ascend.stack import installed_version

    if installed_version("torch-npu") is None:
        npu_stub.install()
    from r1_ascend import doctor

    return doctor.main(argv)


if __name__ == "__main__":
    sys.exit(main())
