"""Whether a dotted module name can be imported, found without importing it (or any package above it).

verl imports every module named in ``VERL_USE_EXTERNAL_MODULES`` on each worker's first ``import verl``; the
preflight resolves the names the way the import system would, asking every ``sys.meta_path`` finder, so
editable installs resolve like regular ones, and never executes a package ``__init__`` (which could import torch).
"""

from __future__ import annotations

import difflib
import pkgutil
import sys
from collections.abc import Mapping
from typing import Any


def _find_spec(fullname: str, parent_locations: list[str] | None) -> Any:
    """The module spec from the import system's finders, without executing the parent package.

    Asks every ``sys.meta_path`` finder, as ``import`` does, so editable installs (whose finder maps names to source
    directories) resolve like regular ones.
    """
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(fullname, parent_locations)
        except (ImportError, ValueError, TypeError):
            spec = None
        if spec is not None:
            return spec
    return None


def resolve_module(name: str) -> str | None:
    """Why ``name`` cannot be imported, or None. Finds the module file without executing any package ``__init__``."""
    if not name or any(not part.isidentifier() for part in name.split(".")):
        return f"{name!r} is not a module name"
    if name in sys.modules:
        return None
    parts = name.split(".")
    spec = sys.modules[parts[0]].__spec__ if parts[0] in sys.modules else _find_spec(parts[0], None)
    if spec is None:
        return f"no module {parts[0]!r} is installed"
    for index, part in enumerate(parts[1:], start=1):
        parent = ".".join(parts[:index])
        locations = spec.submodule_search_locations
        if locations is None:
            return f"{parent} is a module, not a package, so it has no {part!r}"
        spec = _find_spec(f"{parent}.{part}", list(locations))
        if spec is None:
            return f"package {parent} has no module {part!r}"
    return None


def _submodules(package: str) -> list[str]:
    spec = _find_spec(package.split(".")[0], None)
    parts = package.split(".")
    for index in range(1, len(parts)):
        if spec is None:
            return []
        spec = _find_spec(".".join(parts[: index + 1]), list(spec.submodule_search_locations or []))
    if spec is None:
        return []
    names = {m.name for m in pkgutil.iter_modules(list(spec.submodule_search_locations or []))}
    return sorted(names | _mapped_submodules(package))


def _mapped_submodules(package: str) -> set[str]:
    """Submodules an editable install maps by name (setuptools' finder keeps them in its module's ``MAPPING``)."""
    found = set()
    for finder in sys.meta_path:
        mapping = getattr(sys.modules.get(getattr(finder, "__module__", ""), None), "MAPPING", None)
        if isinstance(mapping, Mapping):
            found |= {k[len(package) + 1 :].split(".")[0] for k in mapping if k.startswith(f"{package}.")}
    return found


def closest_module(name: str) -> str | None:
    """The importable module whose name is closest to ``name`` (part by part), or None."""
    parts = name.split(".")
    fixed: list[str] = []
    for part in parts:
        prefix = ".".join(fixed)
        if resolve_module(f"{prefix}.{part}" if prefix else part) is None:
            fixed.append(part)
            continue
        candidates = _submodules(prefix) if prefix else [m.name for m in pkgutil.iter_modules()]
        candidates += list(_mapped_submodules(prefix)) if not prefix else []
        close = difflib.get_close_matches(part, candidates, n=1)
        if not close:
            return None
        fixed.append(close[0])
    result = ".".join(fixed)
    return result if resolve_module(result) is None else None
