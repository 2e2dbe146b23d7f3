"""Check a patch target against upstream *source* without importing it.

Importing verl's Megatron workers and vLLM takes several seconds (torch, megatron-core, vLLM's platform
plugins); reading their source with ``ast`` takes milliseconds. ``r1-ascend doctor`` uses this to report on
every target quickly; the installer still resolves targets at run time, strictly.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ._target import Target


@dataclass(frozen=True)
class StaticResult:
    ok: bool
    detail: str


def module_source_path(module: str) -> Path | None:
    """The ``.py`` file of ``module`` found from its top-level package's location (no package is imported)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin else None
    if not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        base = Path(root).joinpath(*rest)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


#: Parsed upstream files by (path, modification time, size): preflight, doctor and the tests check the same few
#: files many times in one process, and a parse of vLLM's or verl's larger modules takes tens of milliseconds. A file
#: changed on disk is parsed again. The trees are only read here.
_trees: dict[tuple[str, int, int], ast.Module] = {}


def _parse(module: str) -> ast.Module | None:
    path = module_source_path(module)
    if path is None:
        return None
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    tree = _trees.get(key)
    if tree is None:
        tree = _trees[key] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return tree


def _params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    args = func.args
    names = [a.arg for a in (*args.posonlyargs, *args.args)]
    if args.vararg:
        names.append(args.vararg.arg)
    names.extend(a.arg for a in args.kwonlyargs)
    if args.kwarg:
        names.append(args.kwarg.arg)
    return tuple(names)


def _resolve_relative(module: str, node: ast.ImportFrom, *, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _binds(node: ast.stmt, name: str) -> bool:
    """Whether a module- or class-level statement binds ``name``."""
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    if isinstance(node, ast.ImportFrom):
        return any((alias.asname or alias.name) == name for alias in node.names)
    return False


def _find(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The last top-level statement of ``body`` binding ``name`` (the binding in force after import)."""
    found = None
    for node in body:
        if _binds(node, name):
            found = node
    return found


def check_static(target: Target, _depth: int = 0) -> StaticResult:
    """Whether ``target`` exists in the installed upstream source with the expected parameters."""
    path = module_source_path(target.module)
    if path is None:
        return StaticResult(False, f"module {target.module} not found ({target.distribution} not installed?)")
    tree = _parse(target.module)
    assert tree is not None
    body: list[ast.stmt] = tree.body
    parts = target.attribute.split(".")
    node: ast.AST | None = None
    for index, part in enumerate(parts):
        node = _find(body, part)
        if node is None:
            return StaticResult(False, f"{'.'.join([target.module, *parts[: index + 1]])} not found in {path.name}")
        if isinstance(node, ast.ImportFrom):
            if _depth > 5:
                return StaticResult(False, f"import chain too deep at {target.module}.{part}")
            alias = next(a for a in node.names if (a.asname or a.name) == part)
            source = _resolve_relative(target.module, node, is_package=path.name == "__init__.py")
            rest = ".".join([alias.name, *parts[index + 1 :]])
            moved = Target(source, rest, target.distribution, params=target.params, key=target.key)
            return check_static(moved, _depth + 1)
        if isinstance(node, ast.ClassDef):
            body = node.body
    return _check_node(target, node)


def _check_node(target: Target, node: ast.AST | None) -> StaticResult:
    if target.is_dict_entry:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if not isinstance(value, ast.Dict):
            return StaticResult(False, f"{target.module}.{target.attribute} is not a dict literal")
        keys = []
        for key in value.keys:
            try:
                keys.append(ast.literal_eval(key) if key is not None else None)
            except ValueError:
                continue
        if target.key not in keys:
            return StaticResult(False, f"key {target.key!r} missing from {target.attribute} (present: {keys})")
        return StaticResult(True, "entry present")
    if target.params is not None:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return StaticResult(False, f"{target.attribute} is not a function definition")
        found = _params(node)
        if found != target.params:
            return StaticResult(False, f"signature drifted: expected {target.params}, found {found}")
        return StaticResult(True, "signature matches")
    return StaticResult(True, "defined")
