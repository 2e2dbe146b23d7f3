"""Run single functions of an installed upstream module without importing the module (and its torch/ray imports).

Some of upstream's checks sit in modules whose top-level imports cost seconds (verl's reward loader imports ray and
torch, vLLM's ``CacheConfig`` lives in ``vllm/config.py``). The check itself needs none of that, so the preflight
compiles just the named functions from the installed source file, with annotations dropped (they name the heavy
types) and with the file's standard-library imports in scope, and calls them. The code that runs is upstream's,
read from the installed version; a test compares the result with the real module's where the stack is importable.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any


class UpstreamSourceError(LookupError):
    """The installed upstream file does not contain the expected function (a different version?)."""


def module_file(module: str) -> Path:
    """The source file of ``module`` (``a.b.c``), found without executing ``a`` or ``a.b``."""
    head, *rest = module.split(".")
    spec = importlib.util.find_spec(head)
    for part in rest:
        if spec is None or not spec.submodule_search_locations:
            break
        spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    if spec is None or spec.origin is None:
        msg = f"{module} is not installed"
        raise UpstreamSourceError(msg)
    return Path(spec.origin)


@cache
def _outline(path: Path, qualname: str) -> ast.Module:
    """A parsed module holding only the file's one-line standard-library imports and the block of ``qualname``.

    Parsing all of ``vllm/config.py`` (5000 lines) costs a quarter of a second on a busy login node; the block is
    cut out by indentation (a ``class``/``def`` block ends at the first later line indented no deeper) and parsed
    alone, wrapped in its classes again. ``_find`` then checks it like a full parse would.
    """
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if _simple_stdlib_import(line)]
    start, stop, indent = 0, len(lines), -1
    for name in qualname.split("."):
        heads = (f"class {name}(", f"class {name}:", f"def {name}(", f"async def {name}(")
        begin = next(
            (i for i in range(start, stop) if _indent(lines[i]) > indent and lines[i].lstrip().startswith(heads)),
            None,
        )
        if begin is None:
            return ast.Module(body=[], type_ignores=[])
        indent = _indent(lines[begin])
        start, stop = begin, _block_end(lines, begin, indent)
    while start > 0 and lines[start - 1].lstrip().startswith("@"):
        start -= 1
    block = textwrap.dedent("".join(lines[start:stop]))
    for name in reversed(qualname.split(".")[:-1]):
        block = f"class {name}:\n" + textwrap.indent(block, "    ")
    return ast.parse("".join(kept) + block, filename=str(path))


def _block_end(lines: list[str], begin: int, indent: int) -> int:
    end = begin + 1
    while end < len(lines) and (_indent(lines[end]) > indent or lines[end].lstrip().startswith((")", "]", "}"))):
        end += 1
    return end


def _simple_stdlib_import(line: str) -> bool:
    words = line.split()
    if not line.startswith(("import ", "from ")) or len(words) < 2 or "(" in line or line.rstrip().endswith("\\"):
        return False
    return words[1].split(".")[0].rstrip(",") in sys.stdlib_module_names


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip()) if line.strip() else 1_000_000


def _strip_annotations(node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    node.returns = None
    args = node.args
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if arg is not None:
            arg.annotation = None


def _find(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    scope: list[ast.stmt] = tree.body
    *classes, name = qualname.split(".")
    for cls in classes:
        found = next((n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if found is None:
            return None
        scope = found.body
    return next((n for n in scope if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name), None)


def _stdlib_imports(tree: ast.Module) -> list[ast.stmt]:
    """The file's top-level imports of standard-library modules (cheap, and what the functions use)."""
    kept: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            if all(a.name.split(".")[0] in sys.stdlib_module_names for a in node.names):
                kept.append(node)
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] in sys.stdlib_module_names
        ):
            kept.append(node)
    return kept


def load_functions(module: str, qualnames: Iterable[str]) -> dict[str, Any]:
    """Compile ``qualnames`` (``func`` or ``Class.method``) from ``module``'s installed source into one namespace.

    Methods become plain functions taking ``self`` first. Raises UpstreamSourceError when one is missing.
    """
    path = module_file(module)
    names = list(qualnames)
    body: list[ast.stmt] = list(_stdlib_imports(_outline(path, names[0])))
    for qualname in names:
        tree = _outline(path, qualname)
        node = _find(tree, qualname)
        if node is None:
            msg = f"{path} has no {qualname}; the installed {module} is not the pinned version"
            raise UpstreamSourceError(msg)
        copy = ast.parse(ast.unparse(node)).body[0]
        assert isinstance(copy, ast.FunctionDef | ast.AsyncFunctionDef)
        _strip_annotations(copy)
        copy.decorator_list = []
        body.append(copy)
    namespace: dict[str, Any] = {"__name__": f"{module}.__preflight__"}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return {q: namespace[q.rpartition(".")[2]] for q in names}


def string_cases(module: str, function: str, parameter: str) -> tuple[frozenset[str], frozenset[str]]:
    """The string values ``function`` compares ``parameter`` against: (handled, refused).

    A value is *refused* when the ``if`` branch testing it raises (e.g. ``NotImplementedError``); every other value
    compared against is *handled*. Anything not compared against falls through to the function's end.
    """
    node = _find(_outline(module_file(module), function), function)
    if node is None:
        msg = f"{module} has no {function}; the installed version is not the pinned one"
        raise UpstreamSourceError(msg)
    handled: set[str] = set()
    refused: set[str] = set()
    for branch in ast.walk(node):
        if not isinstance(branch, ast.If) or not isinstance(branch.test, ast.Compare):
            continue
        test = branch.test
        if not (isinstance(test.left, ast.Name) and test.left.id == parameter):
            continue
        values: set[str] = set()
        for comparator in test.comparators:
            elements = comparator.elts if isinstance(comparator, ast.Tuple | ast.List | ast.Set) else [comparator]
            values |= {e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        raises = bool(branch.body) and all(isinstance(s, ast.Raise) for s in branch.body if not _is_docstring(s))
        (refused if raises else handled).update(values)
    return frozenset(handled), frozenset(refused)


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
