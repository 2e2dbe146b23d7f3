"""What a user installs works as installed: the wheel, non-editable, in an environment that cannot see the checkout.

The developers' ``.venv`` installs r1-ascend in editable mode; setuptools' editable finder then maps
``r1_ascend.patches`` / ``.recipe`` / ``.data`` onto the top-level folders, which hides every packaging fault (a module
left out of the wheel, a data file not declared, a source folder shadowing the installed package). Here the wheel is
built and installed with ``--no-deps`` into a fresh virtual environment whose only other packages are the CPU stack
of ``.venv``, reached through a folder of links that leaves out every trace of r1-ascend (its dist-info and the
editable finder). Then, from the repository root and from an unrelated directory: ``r1-ascend doctor``, the prelude,
each run script's ``--dry-run``, ``ray_start_npu.sh``'s argument handling and its head's dry run, and the
Dockerfile's own last steps (read from the Dockerfile, replayed as far as a machine without Docker allows).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
RUN_SCRIPTS = ("run_grpo_deepseekv3_npu.sh", "run_grpo_smoke_npu.sh", "run_grpo_qwen25_7b_npu.sh")

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Installed:
    prefix: Path  # the fresh virtual environment
    wheel: Path

    @property
    def python(self) -> Path:
        return self.prefix / "bin" / "python"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a user of this install: its bin first on PATH, nothing of the checkout's."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON", "R1_ASCEND_"))}
        keep = {k: v for k, v in keep.items() if not k.startswith(("VLLM_", "HCCL_", "NNODES", "NPUS_PER_NODE"))}
        return {**keep, "PATH": f"{self.prefix / 'bin'}:{os.environ['PATH']}", **extra}


def stack_without_r1_ascend(site_packages: Path, links: Path) -> Path:
    """A folder of links to every entry of ``site_packages`` except r1-ascend's own (the editable install)."""
    links.mkdir(parents=True)
    for entry in site_packages.iterdir():
        lowered = entry.name.lower()
        if lowered.startswith(("r1_ascend", "r1-ascend", "__editable__")) or entry.suffix == ".pth":
            continue
        (links / entry.name).symlink_to(entry)
    return links


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("installed")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(root / "dist"),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (root / "dist").glob("r1_ascend-*.whl")
    prefix = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    fresh_site = Path(
        subprocess.run(
            [str(prefix / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    stack = stack_without_r1_ascend(Path(sysconfig.get_paths()["purelib"]), root / "stack")
    (fresh_site / "cpu-stack.pth").write_text(f"{stack}\n")
    done = subprocess.run(
        [str(prefix / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--no-compile", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # `pip` as the image's steps call it: this environment's
    (prefix / "bin" / "pip").write_text(f'#!/bin/sh\nexec "{prefix / "bin" / "python"}" -m pip "$@"\n')
    (prefix / "bin" / "pip").chmod(0o755)
    return Installed(prefix, wheel)


@pytest.fixture(params=["repo-root", "elsewhere"])
def cwd(request, tmp_path) -> Path:
    if request.param == "repo-root":
        return REPO
    # a directory of the user's, holding a folder named like the package: it must not be imported either
    (tmp_path / "r1_ascend").mkdir()
    (tmp_path / "r1_ascend" / "__init__.py").write_text("raise ImportError('the shadowing folder was imported')\n")
    return tmp_path


def run(installed: Installed, argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=installed.env(**env), capture_output=True, text=True, timeout=300)


def test_the_package_imported_is_the_installed_one(installed, cwd):
    # -P as the scripts run Python: plain `python -c` / `python -m` read the working directory first (Python's rule)
    code = "import r1_ascend, r1_ascend.patches; print(r1_ascend.__file__)"
    done = run(installed, [str(installed.python), "-P", "-c", code], cwd)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(installed.prefix), done.stdout
    editable = run(installed, [str(installed.python), "-c", "import __editable___r1_ascend_0_1_0_finder"], cwd)
    assert editable.returncode != 0, "the fresh environment must not see the editable finder"


@pytest.mark.parametrize("command", [["r1-ascend", "doctor"], ["python", "-P", "-m", "r1_ascend.cli", "doctor"]])
def test_doctor_works_as_installed(installed, cwd, command):
    done = run(installed, command, cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all checks passed" in done.stdout


def test_plain_python_m_from_the_repository_root_runs_the_installed_package(installed):
    """``python -m`` puts the working directory first on sys.path (no -P): from the repository root it must still find
    the installed package, whole, because no folder there is named like it (the class of the image's last step)."""
    done = run(installed, ["python", "-m", "r1_ascend.cli", "doctor"], REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    where = run(installed, ["python", "-c", "import r1_ascend.patches as p; print(p.__file__)"], REPO)
    assert Path(where.stdout.strip()).is_relative_to(installed.prefix), where.stdout + where.stderr


def test_the_prelude_imports_and_the_vllm_plugin_is_the_installed_one(installed, cwd):
    code = (
        "import importlib.metadata as m, r1_ascend.patches.prelude as p; "
        "(ep,) = [e for e in m.entry_points(group='vllm.general_plugins') if e.name == 'r1_ascend_patches']; "
        "print(ep.load().__module__, p.__file__)"
    )
    done = run(installed, ["python", "-P", "-c", code], cwd)
    assert done.returncode == 0, done.stderr
    module, where = done.stdout.split()
    assert module == "r1_ascend.patches.prelude"
    assert Path(where).is_relative_to(installed.prefix)


@pytest.mark.parametrize("script", RUN_SCRIPTS)
def test_each_run_script_dry_runs_as_installed(installed, cwd, smoke_inputs, tmp_path, script):
    paths = {
        "MODEL_PATH": str(smoke_inputs.model),
        "DIST_CKPT_DIR": str(smoke_inputs.ckpt),
        "DATA_DIR": str(smoke_inputs.data),
        "OUTPUT_DIR": str(tmp_path / "outputs"),
        "NNODES": "1",
        "NPUS_PER_NODE": "16",
    }
    if script != "run_grpo_smoke_npu.sh":
        paths["R1_ASCEND_CONFIG"] = "grpo_deepseekv3_smoke"  # the smoke inputs fit that config only
    done = run(installed, ["bash", str(REPO / "scripts" / script), "--dry-run", "trainer.save_freq=3"], cwd, **paths)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "preflight: passed" in done.stdout
    assert "-m r1_ascend.recipe.main_grpo" in done.stdout
    assert "trainer.save_freq=3" in done.stdout
    # the reward preflight loaded is the installed module's file
    assert str(installed.prefix) in done.stdout.split("reward_function", 1)[1].split("\n", 1)[0]
    assert not (tmp_path / "outputs").exists(), "a dry run writes nothing"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["bogus"], "unknown action or argument 'bogus'"),
        (["stop", "trainer.save_freq=3"], "stop takes no arguments"),
        (["start", "--bogus"], "unknown option '--bogus'"),
        (["start", "trainer save_freq=3"], "is not a Hydra override"),
        (["start"], "set OUTPUT_DIR"),
    ],
)
def test_ray_start_refuses_what_it_cannot_do(installed, cwd, argv, said):
    done = run(installed, ["bash", str(REPO / "scripts" / "ray_start_npu.sh"), *argv], cwd, NODE_IP="127.0.0.1")
    assert done.returncode != 0
    assert said in done.stderr


def test_ray_start_head_dry_run_preflights_with_the_overrides(installed, cwd, smoke_inputs, tmp_path):
    env = {
        "NODE_IP": "127.0.0.1",
        "MASTER_ADDR": "127.0.0.1",
        "NNODES": "1",
        "NPUS_PER_NODE": "16",
        "R1_ASCEND_CONFIG": "grpo_deepseekv3_smoke",
        "R1_ASCEND_RUN_DIR": str(tmp_path / "run"),
        "MODEL_PATH": str(smoke_inputs.model),
        "DIST_CKPT_DIR": str(smoke_inputs.ckpt),
        "DATA_DIR": str(smoke_inputs.data),
        "OUTPUT_DIR": str(tmp_path / "outputs"),
    }
    script = str(REPO / "scripts" / "ray_start_npu.sh")
    done = run(installed, ["bash", script, "start", "--dry-run", "trainer.save_freq=3"], cwd, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "role head" in done.stdout
    assert "preflight: passed" in done.stdout
    assert "dry run: this node would start the Ray head" in done.stdout
    assert done.stdout.count("trainer.save_freq=3") >= 2  # in the preflight's command and in the launch command


# --- the Dockerfile's own last steps ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    text: str


def dockerfile_instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            out.append(Instruction(keyword.upper(), rest.strip()))
    return out


def dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker reads it (Go's filepath.Match: ``*`` and ``?`` stay within one path element;
    ``**`` matches any number of elements, none included)."""
    out, i, pattern = "", 0, pattern.strip().strip("/")
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignore_excludes(relative: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``relative`` out of the build context: it, or a folder above it, matches a pattern."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(dockerignore_regex(p).fullmatch(prefix) for p in patterns for prefix in prefixes)


def copy_context(destination: Path) -> int:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = 0
    for path in sorted(REPO.rglob("*")):
        relative = path.relative_to(REPO).as_posix()
        if dockerignore_excludes(relative, patterns) or not path.is_file():
            continue
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        copied += 1
    return copied


def test_dockerignore_matching_is_dockers_for_these_patterns():
    patterns = [".git", ".venv", "**/__pycache__", "*.egg-info", "outputs"]
    assert dockerignore_excludes(".venv/bin/python", patterns)
    assert dockerignore_excludes("__pycache__/x.pyc", patterns)
    assert dockerignore_excludes("src/r1_ascend/__pycache__/x.pyc", patterns)
    assert not dockerignore_excludes("src/r1_ascend.egg-info/PKG-INFO", patterns)  # `*` stays at the top level
    assert dockerignore_excludes("src/r1_ascend.egg-info/PKG-INFO", ["**/*.egg-info"])
    assert not dockerignore_excludes("src/r1_ascend/cli.py", patterns)
    assert not dockerignore_excludes("docs/outputs.md", patterns)


def test_the_images_last_steps_work_as_the_dockerfile_writes_them(installed, tmp_path):
    """From the Dockerfile: every instruction from the last ``WORKDIR`` on (the project's own install and check) is
    replayed in a directory standing for the image's, with the installed stack standing for steps 1-6 (they need
    CANN, Docker and the network)."""
    instructions = dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8"))
    shell = next(json.loads(i.text) for i in instructions if i.keyword == "SHELL")
    last_workdir = max(n for n, i in enumerate(instructions) if i.keyword == "WORKDIR")
    replayed = instructions[last_workdir:]
    assert any(i.keyword == "RUN" for i in replayed), "the Dockerfile's last steps install and check r1-ascend"
    image_root = tmp_path / "image"
    before = instructions[:last_workdir]
    env = installed.env(**{k: v for i in before if i.keyword == "ENV" for k, v in re.findall(r"(\w+)=(\S+)", i.text)})
    env.pop("PIP_INDEX_URL", None)  # an ARG of the build; this machine installs nothing from an index here
    workdir: Path | None = None
    ran = []
    for instruction in replayed:
        if instruction.keyword == "WORKDIR":
            workdir = image_root / instruction.text.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif instruction.keyword == "COPY":
            source, destination = instruction.text.split()
            assert source == ".", f"COPY {instruction.text}: only the build context is replayed"
            assert copy_context(image_root / destination.lstrip("/")) > 0
            assert not (image_root / destination.lstrip("/") / ".venv").exists()
        elif instruction.keyword == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", instruction.text)))
        elif instruction.keyword == "RUN":
            assert workdir is not None
            # the fresh environment has r1-ascend already: the image's own `pip install .` must replace it
            done = subprocess.run(
                [*shell, instruction.text], cwd=workdir, env=env, capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, f"RUN {instruction.text}\n{done.stdout}\n{done.stderr}"
            ran.append((instruction.text, done.stdout))
        else:
            assert instruction.keyword in ("CMD", "ARG", "LABEL", "EXPOSE"), instruction
    assert ran, "nothing was replayed"
    assert any("all checks passed" in out for _, out in ran), "the image's check step is r1-ascend doctor"
