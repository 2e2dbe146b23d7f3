"""On PYTHONPATH for every process of the rehearsal (nodes, driver, Ray workers): no NPU on this machine, so
``torch_npu`` and MindSpeed are the CPU stand-ins of r1_ascend.testing (imports succeed, no device is reported)."""

from r1_ascend.testing import mindspeed_fake, npu_stub

npu_stub.install()
mindspeed_fake.install()
