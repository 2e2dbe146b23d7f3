"""On PYTHONPATH for every process of the rehearsal (nodes, driver, Ray workers): no NPU on this machine, so
``torch_npu`` and MindSpeed are the CPU stand-ins of r1_ascend.testing (imports succeed, no device is reported),
installed when a process first imports torch, torch_npu or MindSpeed (Ray's daemons import none of them)."""

from r1_ascend.testing.stand_in_site import install_stand_ins_on_first_import

install_stand_ins_on_first_import()
