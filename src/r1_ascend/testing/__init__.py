"""Test-only doubles for the Ascend software stack (never imported by production code)."""
