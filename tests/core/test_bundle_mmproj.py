"""Format-2 bundles (a llama.cpp language GGUF + its mmproj GGUF): every bad file or pair is one
BundleError sentence naming the file, read by the bounded header reader before llama.cpp sees it."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
import yaml
from edge_runtime_models.pair_import import import_pair

from edge_runtime.core.bundle.gguf_header import read_header
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.bundle.mmproj import check_pair
from edge_runtime.core.errors import BundleError
from tests.support.gguf_files import QWEN_CHAT, huge_array_file, huge_tensor_count_file, write_lm, write_mmproj
from tests.support.tiny_pairs import TinyPair


@pytest.fixture
def pair_dir(tmp_path: Path) -> Path:
    return import_pair(write_lm(tmp_path / "lm.gguf"), write_mmproj(tmp_path / "mm.gguf"), tmp_path / "bundle")


def _edit(bundle: Path, change: dict[str, object], section: str | None = None) -> None:
    manifest = yaml.safe_load((bundle / "bundle.yaml").read_text())
    (manifest[section] if section else manifest).update(change)
    (bundle / "bundle.yaml").write_text(yaml.safe_dump(manifest))


def _replace_file(bundle: Path, role: str, data: bytes) -> Path:
    """Overwrite a bundle file and fix its sha256, so the header check (not the checksum) must catch it."""
    manifest = yaml.safe_load((bundle / "bundle.yaml").read_text())
    path = bundle / manifest["files"][role]["path"]
    path.unlink()  # the import may have linked it: never write through to the source
    path.write_bytes(data)
    manifest["files"][role]["sha256"] = hashlib.sha256(data).hexdigest()
    (bundle / "bundle.yaml").write_text(yaml.safe_dump(manifest))
    return path


def test_pair_bundle_loads_with_its_contract_attributes(pair_dir: Path) -> None:
    bundle = load_bundle(pair_dir)
    assert bundle.kind == "mmproj" and bundle.vision_path is None
    assert bundle.mmproj_path == pair_dir / "mm.gguf" and bundle.language_path == pair_dir / "lm.gguf"
    assert bundle.manifest.mtmd is not None and bundle.manifest.mtmd.projector == "qwen2.5vl_merger"
    assert bundle.manifest.mtmd.embedding_dim == 64
    described = bundle.describe()
    assert described["projector"] == "qwen2.5vl_merger" and described["image_max_tokens"] == 1024
    assert described["files"] == {"language": "lm.gguf", "mmproj": "mm.gguf"} and "image_tokens" not in described
    assert described["quantization"] == "F16"
    with pytest.raises(BundleError, match="not an ONNX-encoder bundle"):
        bundle.onnx_manifest  # noqa: B018 - the property raises


def test_changed_mmproj_fails_its_checksum(pair_dir: Path) -> None:
    (pair_dir / "mm.gguf").unlink()
    write_mmproj(pair_dir / "mm.gguf", width=64, deepstack=1)
    with pytest.raises(BundleError, match=r"mm\.gguf does not match its sha256"):
        load_bundle(pair_dir)


def test_mmproj_of_another_width_does_not_fit(pair_dir: Path, tmp_path: Path) -> None:
    _replace_file(pair_dir, "mmproj", write_mmproj(tmp_path / "other.gguf", width=32).read_bytes())
    with pytest.raises(BundleError, match=r"mm\.gguf \(qwen2\.5vl_merger\) outputs embeddings 32 wide, but "
                                          r".*lm\.gguf takes 64: the mmproj belongs to a different model"):
        load_bundle(pair_dir)


def test_unknown_projector_type_is_named(pair_dir: Path, tmp_path: Path) -> None:
    _replace_file(pair_dir, "mmproj", write_mmproj(tmp_path / "o.gguf", projector="warp9_merger").read_bytes())
    with pytest.raises(BundleError, match=r"mm\.gguf has projector type 'warp9_merger', which edge-runtime "
                                          r"does not know \(known: gemma3, "):
        load_bundle(pair_dir)


def test_manifest_projector_must_match_the_file(pair_dir: Path) -> None:
    _edit(pair_dir, {"projector": "gemma3"}, "mtmd")
    with pytest.raises(BundleError, match=r"is a qwen2\.5vl_merger projector, but bundle\.yaml says "
                                          r"mtmd\.projector 'gemma3'"):
        load_bundle(pair_dir)


@pytest.mark.parametrize(("projector", "arch", "width"), [("gemma3", "gemma3", 48), ("idefics3", "llama", 80),
                                                     ("kimivl", "deepseek2", 40)])
def test_width_rule_per_projector_type(projector: str, arch: str, width: int, tmp_path: Path) -> None:
    lm = write_lm(tmp_path / "lm.gguf", arch=arch, width=width)
    out = import_pair(lm, write_mmproj(tmp_path / "mm.gguf", projector=projector, width=width), tmp_path / "b")
    assert load_bundle(out).describe()["embedding_dim"] == width
    wrong = write_mmproj(tmp_path / "wrong.gguf", projector=projector, width=width + 16)
    with pytest.raises(BundleError, match=f"outputs embeddings {width + 16} wide, but .* takes {width}"):
        import_pair(lm, wrong, tmp_path / "b2")


def test_qwen3_vl_deepstack_widths_count_on_both_sides(tmp_path: Path) -> None:
    lm = write_lm(tmp_path / "lm.gguf", arch="qwen3vl", width=64, deepstack=3)
    fits = write_mmproj(tmp_path / "mm.gguf", projector="qwen3vl_merger", width=64, deepstack=3)
    bundle = load_bundle(import_pair(lm, fits, tmp_path / "b"))
    assert bundle.describe()["embedding_dim"] == 256  # n_embd_inp = 64 x (1 + 3)
    short = write_mmproj(tmp_path / "mm2.gguf", projector="qwen3vl_merger", width=64, deepstack=2)
    with pytest.raises(BundleError, match=r"outputs embeddings 192 wide, but .* takes 256"):
        import_pair(lm, short, tmp_path / "b2")


def test_deepstack_layers_reaching_the_last_layer_are_refused(tmp_path: Path) -> None:
    """llama.cpp aborts the process on such a qwen3vl model (docs/models.md): one sentence instead."""
    mm = write_mmproj(tmp_path / "mm.gguf", projector="qwen3vl_merger", width=64, deepstack=2)
    for layers, fits in ((2, False), (3, True)):
        w = gguf.GGUFWriter(str(tmp_path / f"lm{layers}.gguf"), "qwen3vl")
        w.add_embedding_length(64)
        w.add_block_count(layers)
        w.add_uint32("qwen3vl.n_deepstack_layers", 2)
        w.add_chat_template(QWEN_CHAT)
        w.add_tensor("token_embd.weight", np.zeros((4, 64), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        if fits:
            assert check_pair(read_header(tmp_path / f"lm{layers}.gguf"), read_header(mm)).embedding_dim == 192
        else:
            with pytest.raises(BundleError, match=r"qwen3vl.n_deepstack_layers 2 is not below its block_count 2; "
                                                  r"llama.cpp aborts on such a model"):
                check_pair(read_header(tmp_path / f"lm{layers}.gguf"), read_header(mm))


def test_swapped_files_are_named(tmp_path: Path) -> None:
    lm, mm = write_lm(tmp_path / "lm.gguf"), write_mmproj(tmp_path / "mm.gguf")
    with pytest.raises(BundleError, match=r"lm\.gguf is not an mmproj file .* give the language model first"):
        import_pair(mm, lm, tmp_path / "b")


def test_truncated_language_model_is_named(pair_dir: Path) -> None:
    data = (pair_dir / "lm.gguf").read_bytes()
    _replace_file(pair_dir, "language", data[:-100])
    with pytest.raises(BundleError, match=r"lm\.gguf is truncated or corrupt: tensor .* lies outside the file"):
        load_bundle(pair_dir)
    _replace_file(pair_dir, "language", data[:200])
    with pytest.raises(BundleError, match=r"lm\.gguf is not a readable GGUF file: truncated"):
        load_bundle(pair_dir)


def test_non_gguf_mmproj_is_named(pair_dir: Path) -> None:
    _replace_file(pair_dir, "mmproj", b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(BundleError, match=r"mm\.gguf is not a GGUF file \(it starts with b'PK\\x03\\x04'"):
        load_bundle(pair_dir)


def test_absurd_array_length_is_refused_at_once(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(BundleError, match="the length of x 1099511627776 is over the limit"):
        read_header(huge_array_file(tmp_path / "x.gguf"))
    assert time.monotonic() - t0 < 1.0  # gguf's GGUFReader loops over the 2^40 declared elements


def test_absurd_tensor_count_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="tensor count 4611686018427387904 is over the limit"):
        read_header(huge_tensor_count_file(tmp_path / "x.gguf"))


def test_file_names_must_stay_inside_the_bundle(pair_dir: Path) -> None:
    manifest = yaml.safe_load((pair_dir / "bundle.yaml").read_text())
    manifest["files"]["mmproj"]["path"] = "../mm.gguf"
    (pair_dir / "bundle.yaml").write_text(yaml.safe_dump(manifest))
    with pytest.raises(BundleError, match=r"files\.mmproj\.path '\.\./mm\.gguf' must be a file name inside"):
        load_bundle(pair_dir)


@pytest.mark.parametrize(("template", "match"), [
    ("{image}{prompt}{camera}", r"has a placeholder \{camera\}"),
    ("{prompt} only", r"must hold \{image\} and \{prompt\} exactly once each"),
    ("{image}{prompt} {", r"is not a valid template"),
])
def test_prompt_template_must_be_fillable(pair_dir: Path, template: str, match: str) -> None:
    _edit(pair_dir, {"template": template}, "prompt")
    with pytest.raises(BundleError, match=match):
        load_bundle(pair_dir)


@pytest.mark.parametrize(("arch", "projector"), [("llama", "qwen2.5vl_merger"), ("qwen2vl", "idefics3"),
                                                 ("gemma3", "kimivl")])
def test_mrope_and_gemma_projectors_need_their_own_language_model(arch: str, projector: str, tmp_path: Path) -> None:
    lm = write_lm(tmp_path / "lm.gguf", arch=arch, width=64)
    mm = write_mmproj(tmp_path / "mm.gguf", projector=projector, width=64)
    with pytest.raises(BundleError, match=rf"(is a {projector} projector .*, but .*lm\.gguf is {arch}|lm\.gguf "
                                          rf"is a {arch} language model, which needs a .*, but .* is {projector}):"):
        import_pair(lm, mm, tmp_path / "b")


def test_gemma3_mmproj_on_a_qwen_lm_is_refused(tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    """libmtmd itself loads this pair (both 64 wide): only the family rule refuses it."""
    qwen, gemma = tiny_pairs("qwen2.5-vl"), tiny_pairs("gemma3")
    with pytest.raises(BundleError, match=r"is a gemma3 projector \(Gemma 3\), which needs a gemma3 language "
                                          r"model, but .* is qwen2vl"):
        import_pair(qwen.language, gemma.mmproj, tmp_path / "b")


def test_long_string_arrays_are_walked_within_bounds(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list([f"t{i}" for i in range(5000)])  # over KEEP_ARRAY: walked, not decoded
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    header = read_header(path)
    assert header.get("tokenizer.ggml.tokens").length == 5000
    assert read_header(path, keep=frozenset({"tokenizer.ggml.tokens"})).get("tokenizer.ggml.tokens")[4999] == "t4999"
    data = path.read_bytes()
    path.write_bytes(data[:-13])  # the last element ("t4999": 8-byte length + 5 bytes) gone
    with pytest.raises(BundleError, match=r"truncated while reading an element of tokenizer\.ggml\.tokens"):
        read_header(path)
    path.write_bytes(data[:-2])  # its length says 5 bytes, 3 are left
    with pytest.raises(BundleError, match=r"an element of tokenizer\.ggml\.tokens is 5 bytes long: .*past the end"):
        read_header(path)
