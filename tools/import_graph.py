"""List the package's import graph (top-level and lazy imports alike) and its import loops.

Usage: python tools/import_graph.py [--edges]. Reads the source with `ast`, imports nothing.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOTS = {"edge_runtime": Path("edge_runtime"), "edge_runtime_models": Path("models")}


def module_name(pkg: str, root: Path, path: Path) -> str:
    parts = [pkg, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph() -> dict[str, set[str]]:
    files = {module_name(pkg, root, p): p for pkg, root in ROOTS.items() for p in root.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".")
                    anchor = anchor[: len(anchor) - node.level + (1 if is_pkg else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    edges[mod].add(t)
    return edges


def loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    g = graph()
    if "--edges" in sys.argv:
        for m in sorted(g):
            print(m, "->", ", ".join(sorted(g[m])))
    # a package importing its own submodule (`power` -> `power.governor`) is not a loop of modules
    cycles = [c for c in loops({m: {t for t in ts if not t.startswith(m + ".")} for m, ts in g.items()})]
    print(f"{len(g)} modules, {len(cycles)} import loops")
    for c in cycles:
        print("loop:", " <-> ".join(c))
    sys.exit(1 if cycles else 0)
