"""The CPU platform: what lets megatron-core, verl's workers and the vLLM rollout path run without a device.

Each module replaces only what needs an NPU or CUDA, at the narrowest name the stack reaches it through, and
checks its targets against the pinned upstream source before installing:

- :mod:`r1_ascend.cpu.mcore`: megatron-core's device-only calls (Transformer Engine classes, ``torch.cuda``, the
  CUDA RNG tracker, ...), each with its upstream ``file:line``;
- :mod:`r1_ascend.cpu.engine`: ``CPUStandInLLM``, the stand-in for ``vllm.LLM`` (the pinned vLLM wheel has no CPU
  backend), around vLLM's and vllm-ascend's real engine core, KV-cache set-up and MLA implementations;
- :mod:`r1_ascend.cpu.vllm_deepseek`: the DeepSeek-V3 class vLLM's registry resolves once vllm-ascend registers
  (``CustomDeepseekV3ForCausalLM``), built on the CPU so HF-named weights go through its own ``load_weights``;
- :mod:`r1_ascend.cpu.bf16_gemm`: the CPU's bf16 matrix-product kernels, replaced by fp32 accumulation and one
  rounding (torch's own are 8 to 18 times slower on CPUs without AVX-512 BF16);
- :mod:`r1_ascend.cpu.workers`: the device calls of verl's Megatron workers (collective backend, the ``torch.cpu``
  device API) and :func:`r1_ascend.cpu.workers.install`, which installs all three in a process.

The rehearsal (:mod:`r1_ascend.rehearse`) runs on this platform; ``r1-ascend check-model --cpu`` uses its
megatron-core part. Nothing here imports the rehearsal: what the rehearsal records or plants attaches through
:data:`r1_ascend.cpu.mcore.MODEL_LISTENERS` and :data:`r1_ascend.cpu.engine.ENGINE_HOOKS`.
"""
