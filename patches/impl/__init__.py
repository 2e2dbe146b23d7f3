"""What the patch modules install: the code that runs inside verl and vLLM once a patch is applied.

Each module here belongs to one patch module, which names it in its docstring and installs it; none of them
patches anything on import. They are public so that their tests can exercise each part directly.

- ``dp_groups``, ``dp_net``: the rollout's vLLM DP/EP groups and their rendezvous (``vllm_dp_ep_groups``).
- ``rollout_vllm``, ``rollout_memory``: the offloading rollout class and its weight / KV-cache memory operations
  (``vllm_rollout_offload``).
- ``weight_check``, ``weight_ownership``: every weight sync checked against the actor's shards and vLLM's layout
  (``verl_weight_sync_check``).
"""
