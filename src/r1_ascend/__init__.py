"""r1-ascend: DeepSeek-R1-Zero GRPO of DeepSeek-V3 on Ascend NPUs, as a documented overlay on stock verl.

Sub-packages: ``r1_ascend.patches`` (the overlay, from ``patches/``), ``r1_ascend.recipe`` (entry point,
reward, Hydra configs, from ``recipe/``), ``r1_ascend.data`` (dataset preparation, from ``data/``).
"""

__version__ = "0.1.0"
