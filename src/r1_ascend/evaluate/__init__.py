"""``r1-ascend evaluate``: pass@1 and pass@k of an HF checkpoint on the validation sets, with the recipe's reward.

One module per job:

- ``problems``: the prepared validation parquet, its rows grouped into sets by ``data_source``;
- ``prompts``: each row's chat messages rendered to token ids as verl's ``RLHFDataset`` renders them for the rollout;
- ``generation``: what a backend is given and returns, and the progress line; ``backends`` chooses between
  ``vllm_backend`` (NPU, the rollout's engine) and ``hf_backend`` (transformers, CPU);
- ``scoring``: each sample scored with the recipe's ``compute_score``; ``metrics``: the pass@k estimator;
- ``tables``: the JSON, Markdown and JSONL outputs (``r1-ascend report`` renders the same table);
- ``run``: the checks of the inputs and one evaluation; ``cli``: the command line.
"""

from __future__ import annotations
