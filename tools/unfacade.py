"""One mechanical step (issue 40): imports of a name through a module that only re-exports it are
rewritten, by syntax tree, to the module that defines it; the re-exports can then go.

    python tools/unfacade.py MODULE...   (e.g. edge_runtime.lineio.station)

Kept as the record of how the re-export façades were removed; not used at run time.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ["edge_runtime", "tests", "benchmarks", "tools", "models"]


def module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def home(module: str, name: str, depth: int = 0) -> str:
    """The module that defines `name`, following `from edge_runtime.X import name` re-imports."""
    path = module_file(module)
    if path is None or depth > 10:
        return module
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("edge_runtime") \
                and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name and alias.name == name:
                    return home(node.module, name, depth + 1)
    return module


def rewrite(path: Path, facades: set[str]) -> bool:
    text = path.read_text()
    lines = text.split("\n")
    edits: list[tuple[int, int, list[str]]] = []
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in facades):
            continue
        groups: dict[str, list[str]] = {}
        for alias in node.names:
            target = home(node.module, alias.name)
            spelled = alias.name + (f" as {alias.asname}" if alias.asname else "")
            groups.setdefault(target, []).append(spelled)
        if list(groups) == [node.module]:
            continue
        first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]  # type: ignore[operator]
        indent = first[: len(first) - len(first.lstrip())]
        comment = "  " + last[last.index("#"):] if "#" in last else ""
        new = [f"{indent}from {mod} import {', '.join(names)}{comment}" for mod, names in groups.items()]
        edits.append((node.lineno - 1, node.end_lineno, new))  # type: ignore[arg-type]
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = new
    if edits:
        path.write_text("\n".join(lines))
    return bool(edits)


def main(facades: list[str]) -> None:
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            if rewrite(path, set(facades)):
                print(path.relative_to(ROOT))


if __name__ == "__main__":
    main(sys.argv[1:])
