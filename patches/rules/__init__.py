"""The overlay's pure rules: what a configuration must satisfy for a patch to work, with no side effects.

The patches enforce these rules at run time; ``r1-ascend preflight``, ``r1-ascend doctor`` and the recipe's start-up
checks import the same functions, so each rule has exactly one definition:

- ``switches``: which patches the ``R1_ASCEND_DISABLE*`` switches turn off;
- ``dp_layout``: the rollout's vLLM DP size (world / rollout TP) and every rank's TP/DP/EP groups
  (``vllm_dp_ep_groups``);
- ``rollout_config``: rollout engine options the offloading rollout and vllm-ascend 0.9.1 accept
  (``vllm_rollout_offload``, ``vllm_ascend_torchair_live_params``);
- ``rollout_guard``: the guard's settings, statistics, calibrated levels, stop and escalation rules
  (``verl_rollout_guard``);
- ``model_config``: which fields of the rollout engine's and the actor's model configurations must be equal
  (``verl_rollout_model_config``);
- ``group_routing``: the Megatron actor's DeepSeek-V3 group-limited routing against the rollout's
  (``verl_dpskv3_group_routing``);
- ``checkpoints``: which ``global_step_N`` checkpoints are complete, which one a resume takes and which ones may be
  deleted (``verl_checkpoint_integrity``);
- ``expert_load``: the MoE actor's per-layer expert-load statistics and their metric names (``verl_moe_expert_load``);
- ``mcore_mapping``: DeepSeek-V3's HF <-> Megatron-core tensor mapping (the converter's, and the weight-sync check's
  prediction of verl's export);
- ``weight_fingerprint``: the fingerprint the weight-sync check compares and its fp32 rounding bound
  (``verl_weight_sync_check``).
"""
