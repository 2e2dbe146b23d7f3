# r1-ascend image for Atlas 800T A3 (CANN 8.2.RC1, Python 3.11) with the pinned stack of src/r1_ascend/stack.toml.
# Every ARG below equals its pin in src/r1_ascend/stack.toml (tests/launch/test_dockerfile.py checks it).
#
#   docker build -t r1-ascend:0.1.0 .
#   docker run ... (docs/launch.md "Container")
ARG CANN_IMAGE=quay.io/ascend/cann:8.2.rc1-a3-openeuler22.03-py3.11
FROM ${CANN_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-euc"]

ARG PIP_INDEX_URL=https://pypi.org/simple
ARG TORCH_VERSION=2.5.1
ARG TORCH_NPU_VERSION=2.5.1.post1
ARG VERL_VERSION=0.6.1
ARG VLLM_VERSION=0.9.1
ARG VLLM_REPO=https://github.com/vllm-project/vllm.git
ARG VLLM_REF=v0.9.1
ARG VLLM_ASCEND_VERSION=0.9.1
ARG VLLM_ASCEND_REPO=https://github.com/vllm-project/vllm-ascend.git
ARG VLLM_ASCEND_REF=v0.9.1
ARG VLLM_ASCEND_COMMIT_PREFIX=0740d1021
ARG MINDSPEED_REPO=https://gitcode.com/Ascend/MindSpeed.git
ARG MINDSPEED_COMMIT=f6688c61bcfe45243ee5eb34c6f013b1e06eca81
ARG MEGATRON_CORE_VERSION=0.12.1
ARG TRANSFORMERS_VERSION=4.52.4
ARG RAY_VERSION=2.46.0
ARG TENSORDICT_VERSION=0.9.1
ARG NUMPY_VERSION=1.26.4
ARG PYARROW_VERSION=20.0.0
ARG MATHRULER_VERSION=0.1.0
ARG PYLATEXENC_VERSION=2.11
# The A3 (Ascend 910C) SoC name for vllm-ascend's kernel build; `npu-smi info` on an A3 node shows the chip name
# (vllm-ascend documents A3 as ascend910_93xx). Override with --build-arg SOC_VERSION=... if yours differs.
ARG SOC_VERSION=ascend910_9391

ENV PIP_INDEX_URL=${PIP_INDEX_URL} \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

# Shallow-clone a ref and check that HEAD is the expected commit (full SHA, or a prefix for a tag).
COPY scripts/clone_pinned.sh /usr/local/bin/clone-pinned

# 1. torch + torch_npu (CPU wheel index for torch: no CUDA build on an NPU image).
RUN pip install "torch==${TORCH_VERSION}" "torchvision<0.21.0" --extra-index-url https://download.pytorch.org/whl/cpu \
 && pip install "torch-npu==${TORCH_NPU_VERSION}" "numpy==${NUMPY_VERSION}"

# 2. megatron-core from PyPI (before MindSpeed, whose requirements would otherwise move numpy).
RUN pip install "megatron-core==${MEGATRON_CORE_VERSION}" "numpy==${NUMPY_VERSION}"

# 3. vLLM from source without device code, then remove triton (it breaks torch_npu's inductor path).
RUN clone-pinned "${VLLM_REPO}" "${VLLM_REF}" /opt/vllm \
 && VLLM_TARGET_DEVICE=empty pip install -v /opt/vllm --extra-index-url https://download.pytorch.org/whl/cpu \
 && pip uninstall -y triton \
 && python -c "import importlib.metadata as m; v = m.version('vllm'); assert v.startswith('${VLLM_VERSION}'), v"

# 4. vllm-ascend with its custom kernels, compiled against CANN.
RUN clone-pinned "${VLLM_ASCEND_REPO}" "${VLLM_ASCEND_REF}" /opt/vllm-ascend "${VLLM_ASCEND_COMMIT_PREFIX}" \
 && set +u && . /usr/local/Ascend/ascend-toolkit/set_env.sh && set -u \
 && arch="$(uname -m)" \
 && export LD_LIBRARY_PATH="/usr/local/Ascend/ascend-toolkit/latest/${arch}-linux/devlib:${LD_LIBRARY_PATH:-}" \
 && COMPILE_CUSTOM_KERNELS=1 SOC_VERSION="${SOC_VERSION}" pip install -v /opt/vllm-ascend \
 && python -c "import importlib.metadata as m; v = m.version('vllm_ascend'); assert v.startswith('${VLLM_ASCEND_VERSION}'), v"

# 5. MindSpeed at its full commit (no release tag at the pin), editable as upstream expects.
# hadolint ignore=DL3013
RUN clone-pinned "${MINDSPEED_REPO}" "${MINDSPEED_COMMIT}" /opt/MindSpeed "${MINDSPEED_COMMIT}" \
 && pip install -e /opt/MindSpeed "numpy==${NUMPY_VERSION}"

# 6. verl and the exact Python pins (verl's own dependency ranges resolve to a different era).
RUN pip install "verl==${VERL_VERSION}" \
      "transformers==${TRANSFORMERS_VERSION}" "ray[default]==${RAY_VERSION}" "tensordict==${TENSORDICT_VERSION}" \
      "numpy==${NUMPY_VERSION}" "pyarrow==${PYARROW_VERSION}" "mathruler==${MATHRULER_VERSION}" "pylatexenc==${PYLATEXENC_VERSION}" \
      "megatron-core==${MEGATRON_CORE_VERSION}" "torch==${TORCH_VERSION}" \
      --extra-index-url https://download.pytorch.org/whl/cpu \
 && pip uninstall -y triton

# 7. r1-ascend itself, non-editable: the package from the wheel, the scripts from /opt/r1-ascend/scripts (the package
# lives in src/, so nothing in the working directory shadows it; tests/launch/test_installed.py replays this step).
WORKDIR /opt/r1-ascend
COPY . /opt/r1-ascend
# hadolint ignore=DL3013
RUN pip install --no-deps . \
 && python -m r1_ascend.cli doctor

ENV R1_ASCEND_HOME=/opt/r1-ascend
CMD ["bash"]
