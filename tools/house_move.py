"""One mechanical step: move the flat package into folders shaped like the data flow (issue 21).

    python tools/house_move.py ROOT

1. Every import of an `edge_runtime` module (relative or absolute, in the package, the tests, the
   benchmarks, the model builders and tools) is rewritten by its syntax tree to the absolute name of
   the module that really defines each imported name: shims and re-exports are skipped over.
2. The files move with `git mv` (history follows).
3. Every remaining dotted reference (`edge_runtime.worker` in strings: monkeypatch targets, logger
   names, pyproject, docs) is renamed, longest name first.
Kept in the repository as the record of how the tree was moved; it is not used at run time.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

# old module (below edge_runtime) -> new module
MOVES: dict[str, str] = {
    "cli": "cli.main", "cli_tools": "cli.tools", "doctor": "cli.doctor", "bench": "cli.bench",
    "app": "app.daemon", "device_services": "app.services", "reload": "app.reload", "verdicts": "app.verdicts",
    "config": "config.schema", "config_yaml": "config.loader", "offload.config": "config.offload",
    "contracts": "core.contracts", "errors": "core.errors", "result": "core.result", "bundle": "core.bundle",
    "images": "core.images", "supervise": "core.supervise", "systemd": "core.systemd", "samples": "core.samples",
    "schema_budget": "core.schema_budget", "inspection_queue": "core.inspection_queue",
    "capture": "capture.camera", "sources": "capture.sources", "scheduler": "capture.scheduler",
    "rigs": "capture.rig",
    "inspector": "inference.inspector", "worker": "inference.worker", "vision": "inference.vision",
    "prompt_layout": "inference.prompt_layout", "token_cache": "inference.token_cache",
    "model_source": "inference.model_source", "engines": "inference.engines", "grammar": "inference.llm.grammar",
    "llm": "inference.llm",
    "journal": "verdicts.journal", "rules": "verdicts.rules", "rules_config": "config.rules",
    "evidence": "verdicts.evidence",
    "review": "verdicts.review", "outbox": "verdicts.messages",
    "mqtt": "delivery.mqtt.client", "commands": "delivery.mqtt.commands", "webhooks": "delivery.webhooks",
    "offload": "fleet.offload", "offload.http": "core.http",
    "api.inspection": "api.review",
}
# shims and re-exports: (old module, name) -> old module that defines it; a module here is deleted
SHIMS = {"language", "constraint", "picker"}
REEXPORTS: dict[tuple[str, str], str] = {
    ("language", n): "llm.feed" for n in ("Generation", "ImagePart", "image_segments")} | {
    ("language", "LanguageModel"): "llm.model"} | {
    ("language", n): "llm.picker" for n in ("GREEDY", "Candidates", "Sampling", "TokenPicker")} | {
    ("constraint", n): "llm.constraint" for n in ("GuidedPicker", "VocabTokenizer", "lark_for", "tokenizer_for")} | {
    ("picker", n): "llm.picker" for n in ("GREEDY", "Candidates", "PickerHost", "Sampling", "TokenPicker")} | {
    ("evidence", "EvidenceConfig"): "config", ("rigs", "UnknownCamera"): "contracts",
    ("mqtt", "CommandError"): "contracts",
    ("power.sensors", "Sensor"): "power.snapshot", ("power.sensors", "Snapshot"): "power.snapshot",
    ("scheduler", "Gate"): "contracts", ("scheduler", "OpenGate"): "contracts",
    ("scheduler", "QueueFull"): "contracts", ("scheduler", "GateDecision"): "contracts",
    ("scheduler", "InspectionQueue"): "inspection_queue", ("scheduler", "InspectionRequest"): "inspection_queue",
    ("scheduler", "ScheduleStats"): "inspection_queue", ("scheduler", "InspectionWorker"): "worker",
    ("vision", "decode_image"): "images",
}
PKG = "edge_runtime"
NEW = "EDGE_RUNTIME_MOVED"  # stands for PKG between the two passes


def new_name(old: str) -> str:
    """edge_runtime.<old> -> edge_runtime.<new> (longest moved prefix wins)."""
    assert old == PKG or old.startswith(PKG + ".")
    rest = old[len(PKG) + 1:]
    for src in sorted(MOVES, key=len, reverse=True):
        if rest == src or rest.startswith(src + "."):
            return f"{PKG}.{MOVES[src]}{rest[len(src):]}"
    return old


def module_of(path: Path, root: Path) -> tuple[str, bool]:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts = parts[:-1]
    if parts and parts[0] == "models":
        parts[0] = "edge_runtime_models"
    return ".".join(parts), is_pkg


def resolve(node: ast.ImportFrom, module: str, is_pkg: bool) -> str | None:
    if node.level == 0:
        return node.module
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def is_module(root: Path, dotted: str) -> bool:
    rel = Path(*dotted.split("."))
    return (root / rel).with_suffix(".py").is_file() or (root / rel / "__init__.py").is_file()


def rewrite_imports(path: Path, root: Path) -> bool:
    src = path.read_text()
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return False
    module, is_pkg = module_of(path, root) if path.is_relative_to(root) else ("", False)
    lines = src.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        target = resolve(node, module, is_pkg)
        if target is None or not (target == PKG or target.startswith(PKG + ".")):
            continue
        groups: dict[str, list[str]] = {}
        for alias in node.names:
            old_rel = target[len(PKG) + 1:] if target != PKG else ""
            src_mod = target
            if old_rel and (old_rel, alias.name) in REEXPORTS:
                src_mod = f"{PKG}.{REEXPORTS[(old_rel, alias.name)]}"
            same = alias.asname is None or alias.asname == alias.name
            text = alias.name if same else f"{alias.name} as {alias.asname}"
            sub = f"{src_mod}.{alias.name}"
            if is_module(root, sub) and new_name(sub) != sub:  # `from pkg import module` of a moved module
                new = NEW + new_name(sub)[len(PKG):]  # final already: the reference pass must not rename it
                parent, leaf = new.rsplit(".", 1)
                local = alias.asname or alias.name
                groups.setdefault(parent, []).append(leaf if leaf == local else f"{leaf} as {local}")
                continue
            groups.setdefault(src_mod, []).append(text)  # old name: the reference pass renames it
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        indent = re.match(r"\s*", lines[first]).group(0)  # type: ignore[union-attr]
        comment = next((m.group(0) for ln in lines[first:last + 1] if (m := re.search(r"  #.*$", ln.rstrip("\n")))),
                       "")
        out = [f"{indent}from {mod} import {', '.join(names)}" for mod, names in groups.items()]
        out[0] += comment
        edits.append((first, last, "\n".join(out) + "\n"))
    if not edits:
        return False
    for first, last, text in sorted(edits, reverse=True):
        lines[first:last + 1] = [text]
    new = "".join(lines)
    if new != src:
        path.write_text(new)
        return True
    return False


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True)


def move_files(root: Path) -> None:
    pkg = root / PKG
    def order(src: str) -> tuple[int, int]:
        # offload.config before offload; whole packages (llm/) before modules move into their new folders
        return (-src.count("."), 0 if (pkg / Path(*src.split("."))).is_dir() else 1)

    for src in sorted(MOVES, key=order):
        old = pkg / Path(*src.split("."))
        new = pkg / Path(*MOVES[src].split("."))
        old_path = old.with_suffix(".py") if old.with_suffix(".py").is_file() else old
        if not old_path.exists():
            continue
        new_path = new.with_suffix(".py") if old_path.suffix == ".py" else new
        new_path.parent.mkdir(parents=True, exist_ok=True)
        git(root, "mv", str(old_path.relative_to(root)), str(new_path.relative_to(root)))
    for shim in SHIMS:
        git(root, "rm", "-q", "-f", f"{PKG}/{shim}.py")


REFERENCE = re.compile(r"\bedge_runtime((?:\.\w+)+)")


def rename_references(path: Path) -> None:
    text = path.read_text()

    def sub(m: re.Match[str]) -> str:
        dotted = PKG + m.group(1)
        parts = dotted.split(".")
        # the longest prefix that names a moved or shim module decides
        for n in range(len(parts), 1, -1):
            head = ".".join(parts[:n])
            rel = head[len(PKG) + 1:]
            if rel in SHIMS:
                name = parts[n] if n < len(parts) else None
                real = REEXPORTS.get((rel, name), "") if name else ""
                base = new_name(f"{PKG}.{real}") if real else new_name(f"{PKG}.llm")
                return ".".join([base, *parts[n:]])
            if new_name(head) != head:
                return ".".join([new_name(head), *parts[n:]])
        return dotted

    new = REFERENCE.sub(sub, text).replace(NEW, PKG)
    if new != text:
        path.write_text(new)


# tests mirror the package: file-name patterns (first match wins) -> folder under tests/
TEST_FOLDERS: list[tuple[str, str]] = [
    (r"test_(api|http|status_page|inspection_page|review_form|session|cookie)", "api"),
    (r"test_capture", "capture"),
    (r"test_(cli|bench\b|bench\.|doctor)", "cli"),
    (r"test_(bundle|images|supervise|schema_budget)", "core"),
    (r"test_benchmarks|test_shipping|test_wheel|test_docs|test_image", "shipping"),
    (r"test_(config|hostile_config)", "config"),
    (r"test_(inspector|constraint|construction_leaks|prompt_limits|schema_support|demo|grammar|worker)", "inference"),
    (r"test_(journal|evidence|rules|reask|side_effects|inspection|disk_full|dataset|review)", "verdicts"),
    (r"test_(mqtt|webhook)", "delivery"),
    (r"test_(offload|bridge)", "fleet"),
    (r"test_power", "power"),
    (r"test_(daemon|lifecycle|reload)", "app"),
    (r"test_export", "models"),
]
HELPERS = ("broker", "browser", "daemon_http", "folder_rss", "fuzzing", "hostile", "images", "mjpeg", "receiver",
           "tiny_vlms", "tmpfs", "waiting")
BARE = re.compile(rf"^(\s*)(from|import) ({'|'.join(HELPERS)})\b", re.M)


def move_tests(root: Path) -> None:
    tests = root / "tests"
    unplaced = []
    for path in sorted(tests.glob("*.py")):
        name = path.name
        if name in ("conftest.py", "__init__.py"):
            continue
        if name.startswith("test_"):
            folder = next((f for pat, f in TEST_FOLDERS if re.match(pat, name)), None)
            if folder is None:
                unplaced.append(name)
                continue
        elif path.stem in HELPERS:
            folder = "support"
        else:
            unplaced.append(name)
            continue
        (tests / folder).mkdir(exist_ok=True)
        git(root, "mv", str(path.relative_to(root)), f"tests/{folder}/{name}")
        moved = tests / folder / name
        text = moved.read_text()
        text = text.replace("Path(__file__).resolve().parent.parent", "Path(__file__).resolve().parents[2]")
        fixtures = 'Path(__file__).resolve().parents[1] / "fixtures"'
        text = text.replace('Path(__file__).resolve().parent / "fixtures"', fixtures)
        text = text.replace('Path(__file__).parent / "fixtures"', fixtures)
        moved.write_text(text)
    if unplaced:
        raise SystemExit(f"no folder for: {unplaced} (add a pattern to TEST_FOLDERS)")
    for folder in [tests, *[d for d in tests.iterdir() if d.is_dir() and d.name not in ("fixtures", "__pycache__")]]:
        init = folder / "__init__.py"
        if not init.exists():
            init.write_text("")
            git(root, "add", str(init.relative_to(root)))
    placed = {p.stem: p.parent.name for p in tests.glob("*/test_*.py")}
    sibling = re.compile(rf"^(\s*)from ({'|'.join(placed)}) import", re.M)
    for path in [*tests.rglob("*.py"), *(root / "benchmarks").glob("*.py")]:
        text = path.read_text()
        new = BARE.sub(lambda m: f"{m.group(1)}{m.group(2)} tests.support.{m.group(3)}", text)
        new = sibling.sub(lambda m: f"{m.group(1)}from tests.{placed[m.group(2)]}.{m.group(2)} import", new)
        if new != text:
            path.write_text(new)


def rename_doc_paths(root: Path, test_places: dict[str, str]) -> None:
    """File names in the docs: `worker.py` -> `inference/worker.py`, `llm/picker.py` ->
    `inference/llm/picker.py`, `tests/test_x.py` -> `tests/<folder>/test_x.py`."""
    files = {f"{old.replace('.', '/')}.py": f"{new.replace('.', '/')}.py" for old, new in MOVES.items()}
    files |= {"llm/": "inference/llm/", "offload/": "fleet/offload/"}
    pattern = re.compile(r"`((?:tests/)?[a-z_/]+(?:\.py|/))`")

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name.startswith("tests/"):
            rest = name[len("tests/"):]
            stem = rest[:-3] if rest.endswith(".py") else rest
            if stem in test_places:
                return f"`tests/{test_places[stem]}/{rest}`"
            return m.group(0)
        for old in sorted(files, key=len, reverse=True):
            if name == old or (old.endswith("/") and name.startswith(old)):
                return f"`{files[old]}{name[len(old):]}`"
        return m.group(0)

    for doc in [*(root / "docs").glob("*.md"), root / "README.md", root / "pyproject.toml", root / "Makefile"]:
        text = doc.read_text()
        new = pattern.sub(sub, text)
        if new != text:
            doc.write_text(new)


def main() -> None:
    root = Path(sys.argv[1]).resolve()
    py = [p for d in ("edge_runtime", "models", "tests", "benchmarks", "tools") for p in (root / d).rglob("*.py")
          if p.name != "house_move.py"]
    for p in py:
        rewrite_imports(p, root)
    move_files(root)
    move_tests(root)
    tests = root / "tests"
    places = {p.stem: p.parent.name for p in tests.glob("*/*.py") if p.parent.name not in ("fixtures",)}
    rename_doc_paths(root, places)
    files = [p for d in ("edge_runtime", "models", "tests", "benchmarks", "tools", "docs", "build", "l4t_docker",
                         "systemd") for p in (root / d).rglob("*")
             if p.is_file() and p.suffix in (".py", ".md", ".toml", ".sh", ".yaml", ".cfg", ".service", "")
             and p.name != "house_move.py" and "bench-results" not in p.parts]
    files += [root / "pyproject.toml", root / "Makefile", root / "README.md", root / "setup.py"]
    for p in files:
        if p.is_file():
            try:
                rename_references(p)
            except UnicodeDecodeError:
                pass


if __name__ == "__main__":
    main()
