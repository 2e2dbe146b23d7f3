"""Which backend a machine gets, and the factory the command calls for each name.

``auto`` picks vLLM where an NPU is present (``/dev/davinci*``, as ``r1-ascend doctor`` counts them), transformers
otherwise; ``--backend`` overrides. The backends are imported only when chosen (vLLM takes seconds to import).
"""

from __future__ import annotations

from collections.abc import Callable

from r1_ascend.evaluate.generation import AUTO, TRANSFORMERS, VLLM, Backend, BackendSpec


def choose_backend(requested: str, npu_present: bool) -> str:
    """``auto`` -> vLLM where an NPU is present, transformers otherwise; an explicit name is kept."""
    if requested == AUTO:
        return VLLM if npu_present else TRANSFORMERS
    if requested not in (VLLM, TRANSFORMERS):
        msg = f"unknown backend {requested!r}; use {AUTO}, {VLLM} or {TRANSFORMERS}"
        raise ValueError(msg)
    return requested


def _make_vllm(spec: BackendSpec) -> Backend:
    from r1_ascend.evaluate.vllm_backend import VllmBackend

    return VllmBackend(spec)


def _make_transformers(spec: BackendSpec) -> Backend:
    from r1_ascend.evaluate.hf_backend import TransformersBackend

    return TransformersBackend(spec)


#: Backend name -> factory; the command looks the factory up here when it runs.
BACKENDS: dict[str, Callable[[BackendSpec], Backend]] = {VLLM: _make_vllm, TRANSFORMERS: _make_transformers}
