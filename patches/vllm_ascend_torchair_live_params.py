"""Compile the TorchAir decode graph with live parameter addresses, so it reads the weights the rollout re-allocates.

Target:
vllm_ascend.worker.model_runner_v1.NPUModelRunner._get_torchair_lazy_compiled_model (vllm-ascend 0.9.1) is
replaced. The replacement builds the same TorchAir backend as upstream except that TorchAir's
``experimental_config.frozen_parameter`` is False, and refuses the cached-graph path (``use_cached_graph``).

Upstream:
vllm-ascend 0.9.1 with vllm 0.9.1. The method creates ``torchair.CompilerConfig()``, hard-codes
``experimental_config.frozen_parameter = True``, sets ``tiling_schedule_optimize`` and ``enable_view_optimize``,
calls ``patch_for_hcom()`` and ``torch.npu.set_compile_mode(jit_compile=False)``, then either
``torch.compile(self.model, dynamic=True, backend=torchair.get_npu_backend(compiler_config=config))`` (kept in
``torchair_compiled_model``) or, with ``use_cached_graph``, ``torchair.inference.cache_compile(..., config=config)``.

Process:
The Ray worker that runs the rollout engine (vLLM's external launcher keeps the model runner in that process).

Why:
With ``frozen_parameter`` TorchAir treats every ``nn.Parameter`` input as constant: it records the parameter
addresses when the graph is first run and never reads them again. The offloading rollout (vllm_rollout_offload)
resizes every parameter's storage to zero during training and allocates it again before the next rollout, so from
the second step on the compiled decode graph would read memory that no longer holds the weights. Nothing fails:
the rollouts are garbage and training goes on. Two fixes were possible:
(1) keep parameter storage at fixed addresses. Device memory can only be given back by freeing the allocation,
and neither the NPU caching allocator nor ``resize_`` promises the same address on re-allocation; pinning the
addresses needs virtual-memory remapping, which is exactly vLLM's sleep mode that does not work under verl's
external launcher (vllm-ascend#977). Copying to host and back into the same storage keeps the addresses but frees
nothing, and at 671B the rollout weights (about 10 GiB per device) must leave the device during training.
(2) give TorchAir live parameter addresses, which is what later vllm-ascend made an option
(``torchair_graph_config.enable_frozen_parameter``, commit 1f6465c, September 2025). This patch backports that
choice, fixed to "not frozen" because the offloading rollout always re-allocates. Cost: TorchAir refreshes the
parameter input addresses on every graph launch instead of once (host-side work per decode step; unmeasured).
The cached-graph path serialises graphs compiled with frozen parameters and is refused (neither fix applies).
ACL graph mode (piecewise ``NPUGraph``, used for non-DeepSeek models without ``enforce_eager``) captures the
addresses at capture time too and has no such option at 0.9.1; check_engine_options refuses it together with
the offloading rollout, so such models must run with ``enforce_eager=True``.

How:
Before installing, the upstream method's source is checked to still make exactly the calls mirrored here (a
``PatchTargetError`` names what changed). The replacement validates the batch size like upstream, raises
``TorchairGraphConfigError`` when ``use_cached_npu_graph`` is set, and on the first call builds the compiler
config from the upstream module's own ``torchair``, ``patch_for_hcom``, ``get_ascend_config`` and vLLM ``envs``,
with ``frozen_parameter = False``; later calls return the cached compiled model as upstream does. Not covered: the
MTP drafter's own copy of the method (``vllm_ascend.worker.mtp_proposer_v1``), because the recipes do not use
speculative decoding; check_engine_options refuses ``enable_frozen_parameter: true`` and ``use_cached_graph: true``.

Upstream fix:
vllm-ascend commit 1f6465c (2025-09-17) adds ``torchair_graph_config.enable_frozen_parameter``; not in 0.9.1.

Remove when:
the pinned vllm-ascend reads ``torchair_graph_config.enable_frozen_parameter`` in the TorchAir model runner; then
set ``enable_frozen_parameter: false`` in the recipes' torchair_graph_config and drop this patch.

Disable:
R1_ASCEND_DISABLE=vllm_ascend_torchair_live_params keeps upstream's frozen parameters; the engine-option check
then refuses TorchAir graph mode with the offloading rollout (use enforce_eager=True, slower decode).
"""

from __future__ import annotations

import ast
import functools
import inspect
import logging
import textwrap
from collections.abc import Callable
from typing import Any

from ._errors import PatchTargetError, TorchairGraphConfigError
from ._install import install_on_import
from ._registry import PatchSpec, spec_by_module
from ._target import disable_hint

logger = logging.getLogger(__name__)

#: This patch's registry name (the R1_ASCEND_DISABLE token).
NAME = spec_by_module(__name__).name

METHOD = "NPUModelRunner._get_torchair_lazy_compiled_model"

#: Calls and assignments of the upstream method that the replacement mirrors (dotted source as ``ast.unparse``
#: prints it). If vllm-ascend changes any of them the patch refuses to install.
MIRRORED_SOURCE = (
    "patch_for_hcom()",
    "config = torchair.CompilerConfig()",
    "config.experimental_config.frozen_parameter = True",
    "config.experimental_config.tiling_schedule_optimize = True",
    "config.experimental_config.enable_view_optimize = get_ascend_config().torchair_graph_config.enable_view_optimize",
    "torch.npu.set_compile_mode(jit_compile=False)",
    "npu_backend = torchair.get_npu_backend(compiler_config=config)",
    "self.torchair_compiled_model = torch.compile(self.model, dynamic=True, "
    "fullgraph=envs_vllm.VLLM_TEST_DYNAMO_FULLGRAPH_CAPTURE, backend=npu_backend)",
)
#: Names the replacement takes from the upstream module's globals (the same objects upstream uses).
UPSTREAM_GLOBALS = ("torch", "torchair", "patch_for_hcom", "get_ascend_config", "envs_vllm")


def apply(spec: PatchSpec) -> None:
    install_on_import(spec.name, spec.target(METHOD), build)


def upstream_statements(func: Callable[..., Any]) -> set[str]:
    """Every simple statement of ``func`` (nested blocks included), normalised with ``ast.unparse``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    return {ast.unparse(node) for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.Expr))}


def check_upstream(original: Callable[..., Any]) -> None:
    """Raise ``PatchTargetError`` unless the upstream method still does what the replacement mirrors."""
    found = upstream_statements(original)
    missing = [stmt for stmt in MIRRORED_SOURCE if stmt not in found]
    absent_globals = [name for name in UPSTREAM_GLOBALS if name not in original.__globals__]
    if missing or absent_globals:
        msg = (
            f"patch {NAME!r}: vllm_ascend.worker.model_runner_v1.{METHOD} no longer matches vllm-ascend 0.9.1 "
            f"(statements not found: {missing}; module names not found: {absent_globals}), so the replacement "
            f"would not build the same TorchAir backend. {disable_hint(NAME)}"
        )
        raise PatchTargetError(msg)


def build(original: Callable[..., Any]) -> Callable[..., Any]:
    check_upstream(original)
    names = original.__globals__

    @functools.wraps(original)
    def _get_torchair_lazy_compiled_model(self: Any, batch_size: int) -> Any:
        sizes = self.torchair_graph_batch_sizes
        if batch_size < 0 or batch_size > sizes[-1]:
            msg = f"Bad graph batch size:{batch_size}! max_graph_batch_sizes:{sizes[-1]}"
            raise ValueError(msg)
        if self.use_cached_npu_graph:
            msg = (
                "torchair_graph_config.use_cached_graph=true serialises TorchAir graphs with frozen parameter "
                "addresses, which the offloading rollout re-allocates every step. Set use_cached_graph: false in "
                "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config."
            )
            raise TorchairGraphConfigError(msg)
        if self.torchair_compiled_model is not None:
            return self.torchair_compiled_model
        self.torchair_compiled_model = compile_with_live_parameters(self.model, names)
        logger.info("patch %s: TorchAir graph compiled with frozen_parameter=False", NAME)
        return self.torchair_compiled_model

    return _get_torchair_lazy_compiled_model


def compile_with_live_parameters(model: Any, names: dict[str, Any]) -> Any:
    """``torch.compile`` with the TorchAir backend configured as vllm-ascend 0.9.1 does, parameters not frozen."""
    torch, torchair = names["torch"], names["torchair"]
    names["patch_for_hcom"]()
    config = torchair.CompilerConfig()
    config.experimental_config.frozen_parameter = False
    config.experimental_config.tiling_schedule_optimize = True
    graph_config = names["get_ascend_config"]().torchair_graph_config
    config.experimental_config.enable_view_optimize = graph_config.enable_view_optimize
    torch.npu.set_compile_mode(jit_compile=False)
    backend = torchair.get_npu_backend(compiler_config=config)
    fullgraph = names["envs_vllm"].VLLM_TEST_DYNAMO_FULLGRAPH_CAPTURE
    return torch.compile(model, dynamic=True, fullgraph=fullgraph, backend=backend)
