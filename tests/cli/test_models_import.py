"""`edge-runtime models import LM.gguf MMPROJ.gguf DIR` and `models verify DIR`: the round trip, and
every bad input as one line and exit code 2 (corrupt files in a real subprocess: no abort)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from edge_runtime_models.chat_template import TemplateRefused, derive_prompt_template

from edge_runtime.cli.main import main
from edge_runtime.core.bundle.manifest import load_bundle
from tests.support.gguf_files import huge_array_file, huge_tensor_count_file, write_lm, write_mmproj
from tests.support.tiny_pairs import TinyPair


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_runtime", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "EDGE_RUNTIME_DATA": "/nonexistent-edge-data"})


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return write_lm(tmp_path / "lm.gguf"), write_mmproj(tmp_path / "mmproj.gguf")


def test_import_then_verify_prints_one_line_per_check(pair: tuple[Path, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bundle"
    assert main(["models", "import", str(pair[0]), str(pair[1]), str(out), "--name", "line-7",
                 "--prompt", "Is the label straight?", "--image-max-tokens", "256"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["name"] == "line-7" and described["image_max_tokens"] == 256
    manifest = yaml.safe_load((out / "bundle.yaml").read_text())
    assert manifest["prompt"]["template"] == ("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
                                              "{image}{prompt}<|im_end|>\n<|im_start|>assistant\n")
    assert manifest["prompt"]["default"] == "Is the label straight?"
    assert manifest["chat_template"].startswith("{% for m in messages %}")
    assert main(["models", "verify", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["ok", "manifest"], ["ok", "sha256"], ["ok", "sha256"],
                                                    ["ok", "headers"], ["ok", "fit"], ["ok", "prompt"]]
    assert main(["models", "verify", "--json", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_verify_stops_at_the_failing_check(pair: tuple[Path, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bundle"
    assert main(["models", "import", str(pair[0]), str(pair[1]), str(out)]) == 0
    with (out / "mmproj.gguf").open("ab") as f:
        f.write(b"\0")
    capsys.readouterr()
    assert main(["models", "verify", str(out)]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("FAIL  sha256") and "mmproj.gguf does not match its sha256" in lines[-1]
    assert len(lines) == 3  # manifest, language sha256, then the failure: nothing after it runs


def test_verify_checks_an_onnx_bundle_too(demo_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "verify", str(demo_dir)]) == 0
    checks = [line.split()[1] for line in capsys.readouterr().out.splitlines()]
    assert checks == ["manifest", "sha256", "sha256", "widths"]


def test_link_mode_hard_links_the_files(pair: tuple[Path, Path], tmp_path: Path) -> None:
    assert main(["models", "import", str(pair[0]), str(pair[1]), str(tmp_path / "b"), "--link"]) == 0
    assert (tmp_path / "b" / "lm.gguf").stat().st_ino == pair[0].stat().st_ino
    assert load_bundle(tmp_path / "b").kind == "mmproj"


def _corrupt(kind: str, tmp: Path) -> tuple[Path, Path, str]:
    lm, mm = write_lm(tmp / "lm.gguf"), write_mmproj(tmp / "mmproj.gguf")
    if kind == "truncated":
        lm.write_bytes(lm.read_bytes()[:-64])
        return lm, mm, r"lm\.gguf is truncated or corrupt: tensor "
    if kind == "not-gguf":
        mm.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
        return lm, mm, r"mmproj\.gguf is not a GGUF file"
    if kind == "huge-array":
        return huge_array_file(tmp / "lm.gguf"), mm, r"lm\.gguf is not a readable GGUF file: the length of x"
    if kind == "huge-tensor-count":
        return lm, huge_tensor_count_file(tmp / "mmproj.gguf"), r"mmproj\.gguf is not a readable GGUF .*tensor count"
    mm = write_mmproj(tmp / "mmproj.gguf", width=96)
    return lm, mm, r"mmproj\.gguf \(qwen2\.5vl_merger\) outputs embeddings 96 wide, but .*lm\.gguf takes 64"


@pytest.mark.parametrize("kind", ["truncated", "not-gguf", "huge-array", "huge-tensor-count", "wrong-width"])
def test_bad_pair_is_one_line_and_no_crash(kind: str, tmp_path: Path) -> None:
    import re

    lm, mm, expected = _corrupt(kind, tmp_path)
    t0 = time.monotonic()
    proc = _cli("models", "import", str(lm), str(mm), str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr  # a clean user error, not a signal (abort: -6) nor a traceback
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("edge-runtime: error: ")
    assert re.search(expected, proc.stderr), proc.stderr
    assert not (tmp_path / "out").exists() and time.monotonic() - t0 < 30


def test_gguf_without_chat_template_needs_prompt_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lm, mm = write_lm(tmp_path / "lm.gguf", chat_template=None), write_mmproj(tmp_path / "mmproj.gguf")
    assert main(["models", "import", str(lm), str(mm), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "has no chat template (tokenizer.chat_template): give --prompt-template" in err
    template = "USER: {image}{prompt}\nASSISTANT:"
    assert main(["models", "import", str(lm), str(mm), str(tmp_path / "out"), "--prompt-template", template]) == 0
    manifest = yaml.safe_load((tmp_path / "out" / "bundle.yaml").read_text())
    assert manifest["chat_template"] is None and manifest["prompt"]["template"] == template
    assert manifest["prompt"]["system"] == ""  # the template has no {system}


def test_bad_prompt_template_is_one_line(pair: tuple[Path, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "import", str(pair[0]), str(pair[1]), str(tmp_path / "o"), "--prompt-template", "{x}"]) == 2
    assert "--prompt-template has a placeholder {x}" in capsys.readouterr().err


@pytest.mark.parametrize(("template", "why"), [
    ("{% for m in messages %}{{ m['content'] | upper }}{% endfor %}", "does not keep the message text as is"),
    ("{% for m in messages %}{{ m['content'] }}{{ m['content'] }}{% endfor %}", "writes a message twice"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
     "SecurityError"),
    ("{{ messages.append(1) }}{% for m in messages %}{{ m['content'] }}{% endfor %}", "SecurityError"),
    ("{{ 'x' * 4000000000 }}", "needs more than 1024 MiB of memory"),
    ("{% for m in messages %}", "is not valid jinja"),
])
def test_hostile_chat_templates_are_refused(template: str, why: str) -> None:
    with pytest.raises(TemplateRefused, match=why):
        derive_prompt_template(template)


def test_literal_braces_in_a_chat_template_survive() -> None:
    chat = "{% for m in messages %}<{{ m['role'] }}>{\"x\": {0}} {{ m['content'] }}\n{% endfor %}"
    template = derive_prompt_template(chat)
    assert template.format(system="S", image="I", prompt="P") == '<system>{"x": {0}} S\n<user>{"x": {0}} IP\n'


def test_a_template_that_runs_for_ever_is_stopped() -> None:
    t0 = time.monotonic()
    with pytest.raises(TemplateRefused, match="took longer than 1 s"):
        derive_prompt_template("{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}",
                               timeout=1)
    assert time.monotonic() - t0 < 5


def test_huge_chat_template_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lm = write_lm(tmp_path / "lm.gguf", chat_template="{# pad #}" * 20000 + "{{ messages }}")
    assert main(["models", "import", str(lm), str(write_mmproj(tmp_path / "mm.gguf")), str(tmp_path / "o")]) == 2
    assert "its chat template is 180014 characters long (limit 131072)" in capsys.readouterr().err


def test_template_with_bos_gets_it_once(tmp_path: Path) -> None:
    gemma = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
             "<end_of_turn>\n{% endfor %}<start_of_turn>model\n")
    lm = write_lm(tmp_path / "lm.gguf", arch="gemma3", chat_template=gemma, add_bos=True)
    mm = write_mmproj(tmp_path / "mm.gguf", projector="gemma3")
    assert main(["models", "import", str(lm), str(mm), str(tmp_path / "b")]) == 0
    template = load_bundle(tmp_path / "b").manifest.prompt.template
    assert template.startswith("<bos><start_of_turn>system\n{system}") and template.count("<bos>") == 1


def test_doctor_describes_a_pair_bundle(pair: tuple[Path, Path], tmp_path: Path) -> None:
    from edge_runtime.cli.doctor import Doctor
    from edge_runtime.config import Config

    out = tmp_path / "b"
    assert main(["models", "import", str(pair[0]), str(pair[1]), str(out), "--image-max-tokens", "300"]) == 0
    check = Doctor(Config(data_dir=tmp_path / "data"), str(out)).bundle()
    assert check.status == "ok"
    assert "lm.gguf (F16) + mmproj.gguf (qwen2.5vl_merger), image_max_tokens 300" in check.detail


# The projector type and LM width libmtmd reports for each tiny family (clip.cpp / llama_model_n_embd_inp).
TINY = {"qwen2.5-vl": "qwen2.5vl_merger", "gemma3": "gemma3", "smolvlm": "idefics3", "qwen3-vl": "qwen3vl_merger",
        "lfm2-vl": "lfm2", "internvl": "internvl", "kimi-vl": "kimivl", "minicpm-v": "minicpmv4_6"}


@pytest.mark.parametrize("family", sorted(TINY))
def test_tiny_pairs_import_and_verify(family: str, tiny_pairs: Callable[[str], TinyPair], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    pair = tiny_pairs(family)
    out = tmp_path / family
    assert main(["models", "import", str(pair.language), str(pair.mmproj), str(out),
                 "--image-max-tokens", str(pair.image_max_tokens)]) == 0
    bundle = load_bundle(out)
    assert bundle.manifest.mtmd is not None and bundle.manifest.mtmd.projector == TINY[family]
    assert bundle.manifest.mtmd.embedding_dim == _n_embd_inp(pair.language)
    template = bundle.manifest.prompt.template
    assert template.count("{image}") == 1 and template.index("{image}") < template.index("{prompt}")
    capsys.readouterr()
    assert main(["models", "verify", str(out)]) == 0
    assert all(line.startswith("ok") for line in capsys.readouterr().out.splitlines())


def _n_embd_inp(path: Path) -> int:
    """What llama.cpp itself says the model takes (a full load: the tiny weights are kilobytes), independent
    of our header reader."""
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    try:
        return int(llama_cpp.llama_model_n_embd_inp(model))
    finally:
        llama_cpp.llama_model_free(model)


def test_import_never_replaces_a_folder_of_other_files(pair: tuple[Path, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    assert main(["models", "import", str(pair[0]), str(pair[1]), str(tmp_path)]) == 2
    assert "is not empty and is not a bundle folder" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "keep me" and pair[0].is_file()


def test_reimport_over_a_bundle_from_its_own_files(pair: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "b"
    assert main(["models", "import", str(pair[0]), str(pair[1]), str(out)]) == 0
    assert main(["models", "import", str(out / "lm.gguf"), str(out / "mmproj.gguf"), str(out), "--name", "v2"]) == 0
    assert load_bundle(out).manifest.name == "v2"
    with pytest.raises(SystemExit):  # argparse: --copy and --link are exclusive
        main(["models", "import", str(pair[0]), str(pair[1]), str(out), "--copy", "--link"])
    assert main(["models", "import", str(out / "lm.gguf"), str(out / "mmproj.gguf"), str(out), "--link"]) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")
def test_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    lm = write_lm(tmp_path / "lm.gguf")
    big = tmp_path / "big-mmproj.gguf"
    write_mmproj(big, tensors={"mm.2.bias": (64,), "v.pad.weight": (3 << 20,)})  # 12 MB of zeros
    assert big.stat().st_size > 12e6
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], check=True)
    try:
        proc = _cli("models", "import", str(lm), str(big), str(disk / "b"))
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "cannot write " in proc.stderr and "No space left on device" in proc.stderr
        assert list(disk.iterdir()) == []  # the half-written folder is gone
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_tool_and_generation_constructs_of_real_templates_render() -> None:
    """Shapes from the chat templates llama.cpp ships (Hermes tool use, LFM2.5 / Laguna generation tags)."""
    chat = ("{% for tool in tools %}{{ tool }}{% endfor %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
            "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{% endgeneration %}"
            "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
    assert derive_prompt_template(chat) == ("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
                                            "{image}{prompt}<|im_end|>\n<|im_start|>assistant")
