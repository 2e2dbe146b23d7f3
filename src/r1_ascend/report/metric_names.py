"""verl 0.6.1 metric names used by the report, in one place so a verl upgrade is a one-file review.

Sources (verl 0.6.1): ``trainer/ppo/metric_utils.py`` (data, timing and throughput metrics),
``trainer/ppo/ray_trainer.py`` (``marked_timer`` stage names, validation metric names),
``workers/megatron_workers.py`` (``generate_sequences`` timer, memory metrics), ``workers/actor/*`` (actor metrics).
"""

from __future__ import annotations

import re

STEP_TIME = "timing_s/step"
GEN_TIME = "timing_s/gen"
GENERATE_SEQUENCES_TIME = "timing_s/generate_sequences"
# Not logged by stock verl 0.6.1; preferred when an overlay adds a dedicated timer.
RESHARD_TIME = "timing_s/reshard"
REWARD_TIME = "timing_s/reward"
OLD_LOG_PROB_TIME = "timing_s/old_log_prob"
REF_TIME = "timing_s/ref"
UPDATE_ACTOR_TIME = "timing_s/update_actor"

PROMPT_LENGTH_MEAN = "prompt_length/mean"
RESPONSE_LENGTH_MEAN = "response_length/mean"
RESPONSE_LENGTH_MAX = "response_length/max"
# Fraction of responses (prompts) that hit max_response_length (max_prompt_length): compute_data_metrics.
RESPONSE_CLIP_RATIO = "response_length/clip_ratio"
PROMPT_CLIP_RATIO = "prompt_length/clip_ratio"

# Tokens / (step time x number of devices): on Atlas A3 one device is one NPU die.
THROUGHPUT_PER_DIE = "perf/throughput"
MAX_MEMORY_ALLOCATED_GB = "perf/max_memory_allocated_gb"
MAX_MEMORY_RESERVED_GB = "perf/max_memory_reserved_gb"

REWARD_MEAN = "critic/rewards/mean"
SCORE_MEAN = "critic/score/mean"

ENTROPY = "actor/entropy"
KL_LOSS = "actor/kl_loss"
PPO_KL = "actor/ppo_kl"
REWARD_KL_PENALTY = "actor/reward_kl_penalty"

# Rollout-actor consistency. verl 0.6.1 logs these when the batch carries rollout log-probs
# (utils/debug/metrics.py calculate_debug_metrics; "_diff_*" compares probabilities exp(logp), not log-probs).
ROLLOUT_PROBS_DIFF_PREFIX = "training/rollout_probs_diff_"
ROLLOUT_PROBS_DIFF_VALID = "training/rollout_probs_diff_valid"
ROLLOUT_ACTOR_PEARSON = "training/rollout_actor_probs_pearson_corr"
# The overlay's rollout-actor guard logs every key under this prefix (names: r1_ascend.patches.rules.rollout_guard).
ROLLOUT_GUARD_PREFIX = "rollout_guard/"
# Its single stop level on the mean, as releases before 0.5 logged it.
ROLLOUT_GUARD_THRESHOLD = "rollout_guard/threshold"

# A console line may hold only validation metrics; these mark a line that describes a training step.
TRAINING_STEP_MARKERS = (STEP_TIME, THROUGHPUT_PER_DIE, RESPONSE_LENGTH_MEAN, REWARD_MEAN)

# val-core/<data_source>/<variable>/mean@<n>; data sources may contain "/" (e.g. "openai/gsm8k").
VAL_CORE_MEAN = re.compile(r"^val-core/(?P<source>.+)/(?P<var>[^/]+)/mean@(?P<n>\d+)$")
# val-aux/<data_source>/<variable>/mean@<n>: the reward's extra-info components (and non-core variables).
VAL_AUX_MEAN = re.compile(r"^val-aux/(?P<source>.+)/(?P<var>[^/]+)/mean@(?P<n>\d+)$")

# Fields verl's _dump_generations writes for every sample; any other field comes from the reward's extra info.
DUMP_BASE_FIELDS = ("input", "output", "gts", "score", "step")
