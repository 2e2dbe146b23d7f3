"""Read the fixed headings of a patch module's docstring (the single source of each patch's documentation), and
render the generated tables: ``python -m r1_ascend.patches.docs`` prints the patch table of docs/patches.md,
``python -m r1_ascend.patches.docs versions`` the README's version table."""

from __future__ import annotations

import importlib
import re

HEADINGS = ("Target", "Upstream", "Process", "Why", "How", "Upstream fix", "Remove when", "Disable")
#: A heading stands alone on its line; its text starts on the next line.
_HEADING_LINE = re.compile(rf"^({'|'.join(map(re.escape, HEADINGS))}):$")
_INLINE_HEADING = re.compile(rf"^({'|'.join(map(re.escape, HEADINGS))}):\s+\S")


def patch_doc_sections(module_name: str) -> dict[str, str]:
    """``{"Summary": ..., "Target": ..., ...}`` parsed from the module docstring, in document order.

    Raises ``ValueError`` naming the module when a heading is missing, duplicated or out of order.
    """
    doc = importlib.import_module(module_name).__doc__ or ""
    lines = doc.strip().splitlines()
    if not lines:
        msg = f"{module_name} has no docstring; patch modules document themselves (see docs/patches.md)"
        raise ValueError(msg)
    sections: dict[str, list[str]] = {"Summary": [lines[0].strip()]}
    current = "Summary"
    for line in lines[1:]:
        match = _HEADING_LINE.match(line.strip())
        if _INLINE_HEADING.match(line.strip()):
            msg = f"{module_name}: heading in {line.strip()[:40]!r} must stand on its own line, its text below it"
            raise ValueError(msg)
        if match:
            current = match.group(1)
            if current in sections:
                msg = f"{module_name}: heading {current!r} appears twice"
                raise ValueError(msg)
            sections[current] = []
        elif current == "Summary" and not line.strip():
            continue
        else:
            sections[current].append(line.strip())
    found = [h for h in sections if h != "Summary"]
    if found != list(HEADINGS):
        msg = f"{module_name}: docstring headings are {found}, expected exactly {list(HEADINGS)} in that order"
        raise ValueError(msg)
    return {key: " ".join(part for part in value if part).strip() for key, value in sections.items()}


def render_patch_table() -> str:
    """The patch table of docs/patches.md (between the ``patch-table`` markers), from registry and docstrings."""
    from ._registry import PATCHES

    lines = [
        "| Patch | What it does | Targets | Upstream | Process | Remove when |",
        "|---|---|---|---|---|---|",
    ]
    for spec in PATCHES:
        sections = patch_doc_sections(spec.module)
        targets = "<br>".join(f"`{t.path}`" for t in spec.targets)
        upstream = ", ".join(f"{dist} {version}" for dist, version in spec.requires.items())
        upstream += "".join(f", {source} {commit[:8]}" for source, commit in spec.upstream_commits.items())
        cells = [f"`{spec.name}`", sections["Summary"], targets, upstream, ", ".join(spec.processes)]
        cells.append(sections["Remove when"])
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def render_version_table() -> str:
    """The README version table (between the ``version-table`` markers), generated from stack.toml."""
    from r1_ascend.stack import pins

    stack = pins()
    rows = [("python", stack["python"]), ("CANN", stack["cann"]["version"])]
    rows += list(stack["packages"].items())
    rows.append(("MindSpeed", stack["sources"]["mindspeed"]["commit"]))
    lines = ["| Component | Pin |", "|---|---|"]
    lines += [f"| {name} | `{version}` |" for name, version in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(render_version_table() if sys.argv[1:] == ["versions"] else render_patch_table())
