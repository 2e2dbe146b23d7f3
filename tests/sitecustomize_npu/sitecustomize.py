"""Loaded by Python at start-up when this directory is on PYTHONPATH: gives subprocesses and Ray workers of the
test suite the same torch_npu stub (and, if available, the fake MindSpeed) as the pytest process."""

from r1_ascend.testing import npu_stub

npu_stub.install()

try:
    from r1_ascend.testing import mindspeed_fake
except ImportError:  # the fake is optional for tests that do not touch MindSpeed
    pass
else:
    mindspeed_fake.install()
