"""``src/r1_ascend/envs.py`` is the one place the project's Python code reads its environment variables.

The scan parses every Python file of the project (tests aside) and looks for reads of a project variable:
``X.get(NAME)``, ``X.getenv(NAME)``, ``X[NAME]`` and ``NAME in X``, where ``NAME`` is a string literal, a module-level
string constant of the same file, or an ``envs.CONSTANT``. Project variables are those envs.py declares (a constant
named as its variable) and anything named ``R1_ASCEND_*``.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend import envs

ROOT = Path(__file__).resolve().parents[1]
ENVS_FILE = "src/r1_ascend/envs.py"
PROJECT_PREFIX = re.compile(r"R1_ASCEND_[A-Z0-9_]+")


def declared() -> dict[str, str]:
    """envs.py's variables: its upper-case string constants whose value is their own name."""
    return {name: value for name, value in vars(envs).items() if name.isupper() and value == name}


def project_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = [ROOT / line for line in listed.stdout.split() if not line.startswith("tests/") and line != "conftest.py"]
    return [f for f in files if f.is_file() and f.relative_to(ROOT).as_posix() != ENVS_FILE]


def is_project_variable(name: str) -> bool:
    return name in declared() or PROJECT_PREFIX.fullmatch(name) is not None


def _constants(tree: ast.Module) -> dict[str, str]:
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def variable_reads(source: str) -> list[tuple[int, str]]:
    """(line, variable) of every read of a project variable in ``source``."""
    tree = ast.parse(source)
    constants = _constants(tree)
    names = declared()

    def resolve(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "envs":
            return names.get(node.attr)
        return None

    reads = []
    for node in ast.walk(tree):
        keys: list[ast.AST] = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name) and node.args:
            func = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if func in ("get", "getenv"):
                keys.append(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            keys.append(node.slice)
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            keys.append(node.left)
        for key in keys:
            value = resolve(key)
            if value is not None and is_project_variable(value):
                reads.append((node.lineno, value))
    return reads


def test_project_variables_are_read_only_in_envs() -> None:
    files = project_files()
    assert len(files) > 50, "the scan found too few files: is this a git checkout?"
    outside = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in files
        for line, name in variable_reads(path.read_text(encoding="utf-8"))
    ]
    assert not outside, "read these through an accessor of src/r1_ascend/envs.py:\n" + "\n".join(outside)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os\nos.environ.get('R1_ASCEND_X')", [(2, "R1_ASCEND_X")]),
        ("import os\nos.getenv('NNODES', '1')", [(2, "NNODES")]),
        ("def f(env):\n    return env['RAY_ADDRESS']", [(2, "RAY_ADDRESS")]),
        ("KEY = 'R1_ASCEND_Y'\ndef f(env):\n    return env.get(KEY)", [(3, "R1_ASCEND_Y")]),
        ("from r1_ascend import envs\nimport os\nos.environ.get(envs.NPUS_PER_NODE)", [(3, "NPUS_PER_NODE")]),
        ("import os\nflag = 'R1_ASCEND_Z' in os.environ", [(2, "R1_ASCEND_Z")]),
        # writes, messages and upstream variables are not reads of a project variable
        ("env = {}\nenv['R1_ASCEND_RUN_DIR'] = 'x'", []),
        ("msg = f'set R1_ASCEND_DISABLE={1}'", []),
        ("import os\nos.environ.get('VLLM_DP_SIZE')", []),
    ],
)
def test_scan_finds_reads(source: str, expected: list[tuple[int, str]]) -> None:
    assert variable_reads(source) == expected


@given(st.sampled_from(sorted(declared())), st.sampled_from(["os.environ.get({!r})", "os.environ[{!r}]"]))
def test_scan_finds_every_declared_variable(name: str, template: str) -> None:
    assert variable_reads("import os\nvalue = " + template.format(name)) == [(2, name)]


def test_every_variable_is_documented() -> None:
    names = declared()
    assert {"R1_ASCEND_DISABLE", "NNODES", "RAY_ADDRESS", "R1_ASCEND_REHEARSE_DIR"} <= set(names)
    doc = (ROOT / "docs" / "environment.md").read_text(encoding="utf-8")
    missing = [name for name in names if f"`{name}`" not in doc]
    assert not missing, f"docs/environment.md does not list {missing}"


def test_every_variable_has_a_comment() -> None:
    """Each constant carries its meaning: a ``#:`` comment right above it in envs.py."""
    lines = (ROOT / ENVS_FILE).read_text(encoding="utf-8").splitlines()
    bare = [name for name in declared() if not lines[lines.index(f'{name} = "{name}"') - 1].startswith("#:")]
    assert not bare, f"envs.py constants without a meaning: {bare}"
