"""`models verify DIR`: the checks of `load_bundle`, one step at a time, for either format.

Each step yields (status, check, detail); the first failing step yields "FAIL" with the same one
sentence `load_bundle` would raise, and the steps after it (which depend on it) are not run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from edge_runtime.core.bundle.manifest import (
    Bundle,
    Manifest,
    MmprojManifest,
    check_schema,
    load_bundle,
    onnx_files,
    read_manifest,
    sha256_file,
)
from edge_runtime.core.errors import BundleError

Step = tuple[str, str, str]


def _mb(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.1f} MB"


def _sha(path: Path, role: str, sha256: str) -> str:
    if not path.is_file():
        raise BundleError(f"{path} is missing: bundle.yaml lists it as the {role} model")
    if sha256_file(path) != sha256:
        raise BundleError(f"{path} does not match its sha256 in bundle.yaml (corrupt or replaced file)")
    return f"{role} {path.name} ({_mb(path)}) matches"


def verify_steps(root: Path | str) -> Iterator[Step]:
    """Run the checks of a bundle folder in order; stop at the first failure."""
    root = Path(root).expanduser().resolve()
    steps: list[tuple[str, Callable[[], str]]] = []
    state: dict[str, object] = {}

    def manifest() -> str:
        path, m = read_manifest(root)
        state["manifest"] = m
        return f"{path}: format {m.format}, {m.name}@{m.version}"

    steps.append(("manifest", manifest))
    for status, check, detail in _run(steps):
        yield status, check, detail
        if status == "FAIL":
            return
    m = state["manifest"]
    bundle = Bundle(root, m)  # type: ignore[arg-type]
    if isinstance(m, MmprojManifest):
        yield from _run(_pair_steps(root, bundle, m))
    else:
        assert isinstance(m, Manifest)
        yield from _run(_onnx_steps(root, bundle, m))


def _run(steps: list[tuple[str, Callable[[], str]]]) -> Iterator[Step]:
    for check, step in steps:
        try:
            detail = step()
        except BundleError as exc:
            yield "FAIL", check, str(exc)
            return
        yield "ok", check, detail


def _pair_steps(root: Path, bundle: Bundle, m: MmprojManifest) -> list[tuple[str, Callable[[], str]]]:
    from edge_runtime.core.bundle.gguf_header import read_header
    from edge_runtime.core.bundle.mmproj import check_pair, quantization
    from edge_runtime.core.bundle.pair import check_pair_fit, check_prompt_template

    def headers() -> str:
        assert bundle.mmproj_path is not None
        lm, mm = read_header(bundle.language_path), read_header(bundle.mmproj_path)
        fit = check_pair(lm, mm)
        return (f"language: {lm.architecture}, {len(lm.tensors)} tensors, {quantization(lm) or '?'}; mmproj: "
                f"{fit.projector} ({fit.family}), {len(mm.tensors)} tensors")

    def fit() -> str:
        assert bundle.mmproj_path is not None
        check_pair_fit(bundle.language_path, bundle.mmproj_path, m.mtmd.projector, m.mtmd.embedding_dim,
                       m.prompt.template, root / "bundle.yaml")
        return (f"{m.mtmd.projector} outputs {m.mtmd.embedding_dim}-wide embeddings = the language model's "
                f"input width; image_max_tokens {m.mtmd.image_max_tokens}")

    def prompt() -> str:
        check_prompt_template(m.prompt.template, f"{root / 'bundle.yaml'}: prompt.template")
        check_schema(root / "bundle.yaml", m.verdict_schema)
        source = "from the GGUF's chat template" if m.chat_template else "given (the GGUF has no chat template)"
        return f"prompt template ({source}) and verdict schema are usable"

    return [("sha256", lambda: _sha(bundle.language_path, "language", m.files.language.sha256)),
            ("sha256", lambda: _sha(root / m.files.mmproj.path, "mmproj", m.files.mmproj.sha256)),
            ("headers", headers), ("fit", fit), ("prompt", prompt)]


def _onnx_steps(root: Path, bundle: Bundle, m: Manifest) -> list[tuple[str, Callable[[], str]]]:
    steps: list[tuple[str, Callable[[], str]]] = [
        ("sha256", lambda role=role, path=path, sha=entry.sha256: _sha(path, role, sha))  # type: ignore[misc]
        for role, path, entry in onnx_files(bundle, m)]

    def widths() -> str:
        load_bundle(root, verify_checksums=False)
        return (f"vision {m.vision.image_tokens} x {m.vision.embedding_dim} = the GGUF's embedding width; "
                "verdict schema usable")

    return [*steps, ("widths", widths)]
