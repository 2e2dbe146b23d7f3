"""Launching runs: the Hydra overlays, the preflight check, the quickstart and the Ray cluster helpers.

Nothing here imports torch, verl or vLLM at module level: ``r1-ascend preflight`` must answer in seconds on a login
node, before the cluster is taken.
"""
