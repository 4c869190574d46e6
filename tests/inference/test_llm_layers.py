"""Only the owning wrappers call llama.cpp: `inference/llm/handles.py` (model, context, batch,
sampler, vocabulary), `inference/llm/mtmd.py` (libmtmd) and `inference/llm/runtime.py` (the library's
log, buffer types and build). Every other module of the daemon and
its benchmarks goes through their checked methods (`Context.decode` raising on a non-zero code,
`Context.memory_seq_rm -> bool`, ...), so a raw `llama_cpp.*` call cannot slip back in.

The source is read with `ast`, so every way of reaching the binding counts: `llama_cpp.f()`, an
alias (`from edge_runtime.inference.engines import llama_cpp as L`), a name imported from it
(`from llama_cpp import llama_decode`), a submodule (`mtmd_cpp`), `engines.llama_cpp.f()`.
`llama_cpp.llama_grammar` is exempt: a pure-Python GBNF converter, no llama.cpp call (grammar.py).
The offline model builders (`models/`, package `edge_runtime_models`) are not walked: they call
llama.cpp's quantizer and may import nothing of the daemon's engines (import-linter's `builders`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WALKED = ("edge_runtime", "benchmarks")
OWNERS = frozenset({"edge_runtime/inference/llm/handles.py", "edge_runtime/inference/llm/mtmd.py",
                    "edge_runtime/inference/llm/runtime.py"})
LOADER = "edge_runtime/inference/engines.py"  # imports llama_cpp after onnxruntime and re-exports it
ENGINES = "edge_runtime.inference.engines"
PURE_PYTHON = ("llama_cpp.llama_grammar",)


def _native(dotted: str) -> bool:
    """Does this dotted name lie in llama_cpp's bindings (not its pure-Python grammar converter)?"""
    if dotted.startswith(ENGINES + ".llama_cpp"):
        dotted = dotted[len(ENGINES) + 1:]
    if dotted != "llama_cpp" and not dotted.startswith("llama_cpp."):
        return False
    return not any(dotted == p or dotted.startswith(p + ".") for p in PURE_PYTHON)


def _dotted(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


@dataclass
class Uses:
    imports: list[str] = field(default_factory=list)  # "line: module" of imports of the bindings
    calls: list[str] = field(default_factory=list)  # "line: dotted.name()" of calls into them


def llama_cpp_uses(source: str) -> Uses:
    """Where a module's source imports llama_cpp's bindings and where it calls them."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> the dotted name it stands for
    uses = Uses()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if _native(a.name):
                    uses.imports.append(f"{node.lineno}: {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                aliases[a.asname or a.name] = full
                if _native(full):
                    uses.imports.append(f"{node.lineno}: {full}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            parts = _dotted(node.func)
            if parts and parts[0] in aliases:
                dotted = ".".join([aliases[parts[0]], *parts[1:]])
                if _native(dotted):
                    uses.calls.append(f"{node.lineno}: {'.'.join(parts)}()")
    return uses


def _modules() -> list[tuple[str, str]]:
    out = []
    for root in WALKED:
        for path in sorted((REPO / root).rglob("*.py")):
            out.append((path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8")))
    assert len(out) > 50 and any(rel in OWNERS for rel, _ in out)  # the walk found the package
    return out


def test_no_module_but_the_owning_wrappers_calls_llama_cpp() -> None:
    found = {rel: uses.calls for rel, src in _modules() if rel not in OWNERS
             if (uses := llama_cpp_uses(src)).calls}
    assert not found, f"raw llama_cpp calls outside handles.py/mtmd.py/runtime.py (add a checked method there): {found}"


def test_no_module_but_the_owners_and_the_loader_imports_the_bindings() -> None:
    found = {rel: uses.imports for rel, src in _modules() if rel not in OWNERS and rel != LOADER
             if (uses := llama_cpp_uses(src)).imports}
    assert not found, ("llama_cpp imported outside handles.py/mtmd.py/runtime.py/engines.py (use handles' re-exports): "
                       f"{found}")


def test_the_owners_do_call_llama_cpp() -> None:
    # the walk sees what it is meant to see: the owners' calls are found (runtime.py makes three)
    for rel, src in _modules():
        if rel in OWNERS:
            assert len(llama_cpp_uses(src).calls) > (2 if rel.endswith("/runtime.py") else 10), rel


@pytest.mark.parametrize("source", [
    "import llama_cpp\nllama_cpp.llama_decode(ctx, batch)",
    "import llama_cpp as L\nL.llama_free(ctx)",
    "from edge_runtime.inference.engines import llama_cpp\nllama_cpp.llama_memory_clear(m, True)",
    "from edge_runtime.inference.engines import llama_cpp as L\nL.llama_get_logits_ith(ctx, -1)",
    "from edge_runtime.inference import engines\nengines.llama_cpp.llama_decode(ctx, batch)",
    "import edge_runtime.inference.engines\nedge_runtime.inference.engines.llama_cpp.llama_synchronize(ctx)",
    "from llama_cpp import llama_decode\nllama_decode(ctx, batch)",
    "from llama_cpp import mtmd_cpp\nmtmd_cpp.mtmd_free(ctx)",
    "import llama_cpp.llama_cpp as C\nC.llama_decode(ctx, batch)",
    "def f():\n    from edge_runtime.inference.engines import llama_cpp\n    return llama_cpp.Llama(model_path='x')",
])
def test_every_way_of_calling_the_binding_is_found(source: str) -> None:
    uses = llama_cpp_uses(source)
    assert len(uses.calls) == 1


@pytest.mark.parametrize("source", [
    "from llama_cpp.llama_grammar import SchemaConverter\nSchemaConverter(prop_order={})",
    "from llama_cpp import llama_grammar\nllama_grammar.SchemaConverter(prop_order={})",
    "from edge_runtime.inference.llm.handles import Context\nContext.default_params()",
    "import edge_runtime.inference.engines\nedge_runtime.inference.llm.runtime.engine_info()",
    "import numpy as np\nnp.zeros(3)",
])
def test_the_pure_python_grammar_and_the_wrappers_are_not_raw_calls(source: str) -> None:
    uses = llama_cpp_uses(source)
    assert uses.calls == [] and uses.imports == []
