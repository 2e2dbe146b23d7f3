"""Keep the process's random-number state across vLLM calls that reseed it.

Rebuilding the rollout's KV cache runs vLLM's ``compile_or_warm_up_model``, which ends with
``set_random_seed(model_config.seed)``: Python's ``random``, NumPy's global generator, torch's CPU generator and
(through ``torch.manual_seed``) every device generator are reset to the engine seed. The offloading rollout rebuilds
the cache every step, and verl then saves the device state as the trainer's, so without this every training step
would draw the same random numbers (dropout masks, sampling seeds). ``preserved_rng_state`` snapshots all four
before the call and puts them back afterwards, also when the call raises.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def accelerator_module() -> Any | None:
    """``torch.npu`` on an NPU, ``torch.cuda`` on a GPU, else None (no device generator to keep)."""
    for name in ("npu", "cuda"):
        module = getattr(torch, name, None)
        is_available = getattr(module, "is_available", None)
        if callable(is_available) and is_available() is True:
            return module
    return None


@dataclass(frozen=True)
class RngState:
    python: Any
    numpy: Any
    torch_cpu: torch.Tensor
    device: Any

    @classmethod
    def capture(cls, device_module: Any | None) -> RngState:
        device = device_module.get_rng_state() if device_module is not None else None
        return cls(random.getstate(), np.random.get_state(), torch.get_rng_state(), device)

    def restore(self, device_module: Any | None) -> None:
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch_cpu)
        if device_module is not None:
            device_module.set_rng_state(self.device)


@contextlib.contextmanager
def preserved_rng_state(device_module: Any | None = None) -> Iterator[RngState]:
    """Within the block anything may reseed; afterwards every generator is back where it was."""
    state = RngState.capture(device_module)
    try:
        yield state
    finally:
        state.restore(device_module)
