"""Loaded by Python at start-up when this directory is on PYTHONPATH: gives subprocesses and Ray workers of the
test suite the same torch_npu stub and fake MindSpeed as the pytest process, installed when a process first imports
torch, torch_npu or MindSpeed (as in the rehearsal's processes)."""

from r1_ascend.testing.stand_in_site import install_stand_ins_on_first_import

install_stand_ins_on_first_import()
