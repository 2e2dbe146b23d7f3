"""The Dockerfile installs exactly the pinned stack of src/r1_ascend/stack.toml, from pinned refs only.

Docker is not available in CI, so the file is checked statically.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from r1_ascend.stack import pins

DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile"

#: Dockerfile ARG -> (stack.toml section path, key)
ARG_TO_PIN = {
    "CANN_IMAGE": ("cann", "image"),
    "TORCH_VERSION": ("packages", "torch"),
    "TORCH_NPU_VERSION": ("packages", "torch-npu"),
    "VERL_VERSION": ("packages", "verl"),
    "VLLM_VERSION": ("packages", "vllm"),
    "VLLM_ASCEND_VERSION": ("packages", "vllm-ascend"),
    "MEGATRON_CORE_VERSION": ("packages", "megatron-core"),
    "TRANSFORMERS_VERSION": ("packages", "transformers"),
    "RAY_VERSION": ("packages", "ray"),
    "TENSORDICT_VERSION": ("packages", "tensordict"),
    "NUMPY_VERSION": ("packages", "numpy"),
    "PYARROW_VERSION": ("packages", "pyarrow"),
    "MATHRULER_VERSION": ("packages", "mathruler"),
    "PYLATEXENC_VERSION": ("packages", "pylatexenc"),
    "VLLM_REPO": ("sources.vllm", "repo"),
    "VLLM_REF": ("sources.vllm", "ref"),
    "VLLM_ASCEND_REPO": ("sources.vllm-ascend", "repo"),
    "VLLM_ASCEND_REF": ("sources.vllm-ascend", "ref"),
    "VLLM_ASCEND_COMMIT_PREFIX": ("sources.vllm-ascend", "commit_prefix"),
    "MINDSPEED_REPO": ("sources.mindspeed", "repo"),
    "MINDSPEED_COMMIT": ("sources.mindspeed", "commit"),
}


def _text() -> str:
    return DOCKERFILE.read_text(encoding="utf-8")


def _args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", _text(), flags=re.MULTILINE))


def _pin(section: str, key: str) -> str:
    node = pins()
    for part in section.split("."):
        node = node[part]
    return str(node[key])


@pytest.mark.parametrize(("arg", "where"), sorted(ARG_TO_PIN.items()))
def test_arg_equals_stack_pin(arg, where):
    assert _args().get(arg) == _pin(*where), f"Dockerfile ARG {arg} must equal stack.toml {where}"


def test_every_pinned_package_has_an_arg():
    covered = {key for section, key in ARG_TO_PIN.values() if section == "packages"}
    assert set(pins()["packages"]) == covered


def test_base_image_and_strict_shell():
    text = _text()
    assert re.search(r"^FROM \$\{CANN_IMAGE\}$", text, flags=re.MULTILINE)
    shell = re.search(r"^SHELL (.+)$", text, flags=re.MULTILINE)
    assert shell
    assert all(flag in shell.group(1) for flag in ('"pipefail"', "-e", "u"))


def test_no_unpinned_sources():
    text = _text()
    assert "latest" not in text.replace("ascend-toolkit/latest", "")  # the CANN install path is not a version
    assert "git clone" not in text, "clone with clone-pinned (fetch a ref, verify the commit)"
    assert "cp -r" not in text, "never copy upstream source trees"
    for line in re.findall(r"clone-pinned (.+?) /opt/", text):
        assert "_REF" in line or "_COMMIT" in line, line
    assert re.search(r'clone-pinned "\$\{MINDSPEED_REPO\}" "\$\{MINDSPEED_COMMIT\}" \S+ "\$\{MINDSPEED_COMMIT\}"', text)
    assert len(_pin("sources.mindspeed", "commit")) == 40


def test_build_recipe_steps():
    text = _text()
    assert "VLLM_TARGET_DEVICE=empty pip install" in text
    assert text.index("VLLM_TARGET_DEVICE=empty") < text.index("pip uninstall -y triton")
    assert "COMPILE_CUSTOM_KERNELS=1" in text
    assert "ascend-toolkit/set_env.sh" in text
    assert "pip install -e /opt/MindSpeed" in text
    assert 'pip install "megatron-core==${MEGATRON_CORE_VERSION}"' in text
    assert "pip install --no-deps ." in text
    assert "pip install megatron " not in text  # the unrelated PyPI package
    assert text.index("megatron-core==") < text.index("/opt/MindSpeed")  # Megatron before MindSpeed


def test_every_run_instruction_fails_on_error():
    # With SHELL -e -o pipefail, an `|| true` would hide a failing install.
    assert "|| true" not in _text()
