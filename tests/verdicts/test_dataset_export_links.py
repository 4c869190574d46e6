"""`dataset export DIR` never writes through a link planted in the output, never keeps a file it did
not write, and fails with one clear line (no temporary folder left) on a full disk, a link loop, /proc."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.verdicts.review import MARKER, ExportPathError, export_dataset
from tests.support.tmpfs import tmpfs

CLI = Path(sys.executable).parent / "edge-runtime"


class Rows:
    def __init__(self, n: int) -> None:
        self.rows = [{"id": f"r{i:03d}", "camera": "c", "ts": "t", "verdict": {"defect": False}, "review":
                      {"state": "confirmed"}} for i in range(n)]

    def iterate(self, f: Any) -> Any:
        return iter(self.rows)


def _images(tmp: Path, n: int, size: int = 100) -> Path:
    src = tmp / "evidence"
    src.mkdir()
    for i in range(n):
        (src / f"r{i:03d}.jpg").write_bytes(b"\xff\xd8" + bytes(size))
    return src


def _export(tmp: Path, out: Path, n: int = 26, size: int = 100) -> dict[str, int]:
    src = tmp / "evidence" if (tmp / "evidence").exists() else _images(tmp, n, size)
    return export_dataset(Rows(n), lambda rid: src / f"{rid}.jpg", out)  # type: ignore[arg-type]


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file() and not p.is_symlink()}


def test_planted_links_are_refused_and_nothing_outside_is_written(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    before = _tree(victim)
    # 1. train/.<id>.jpg.tmp -> a victim file
    out1 = tmp_path / "out1"
    (out1 / "train").mkdir(parents=True)
    (out1 / "train" / ".r000.jpg.tmp").symlink_to(victim / "precious.txt")
    # 2. train -> the victim folder
    out2 = tmp_path / "out2"
    out2.mkdir()
    (out2 / "train").symlink_to(victim)
    # 3. train/<id>.jpg -> /etc/passwd
    out3 = tmp_path / "out3"
    (out3 / "train").mkdir(parents=True)
    (out3 / "train" / "r000.jpg").symlink_to("/etc/passwd")
    # 4. the target itself a link
    out4 = tmp_path / "out4"
    out4.symlink_to(victim)
    for out in (out1, out2, out3, out4):
        with pytest.raises(ExportPathError, match="symbolic link"):
            _export(tmp_path, out)
    assert _tree(victim) == before
    assert not [p for p in tmp_path.iterdir() if ".export-" in p.name]


def test_a_planted_link_in_an_earlier_export_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _export(tmp_path, out)["images"] == 26
    (out / "train" / "r001.jpg").unlink()
    (out / "train" / "r001.jpg").symlink_to("/etc/passwd")
    with pytest.raises(ExportPathError, match="symbolic link"):
        _export(tmp_path, out)


def test_an_earlier_export_is_replaced_whole_and_a_foreign_folder_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _export(tmp_path, out)
    (out / "train" / "stale.jpg").write_bytes(b"not ours")  # a file this export did not write
    (out / "train" / "r002.jpg").write_bytes(b"tampered")
    _export(tmp_path, out)
    assert not (out / "train" / "stale.jpg").exists()
    assert (out / "train" / "r002.jpg").read_bytes().startswith(b"\xff\xd8")
    assert (out / MARKER).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evidence", "out"]
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("x")
    with pytest.raises(ExportPathError, match="not empty"):
        _export(tmp_path, foreign)


def test_a_full_disk_fails_cleanly(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "1m") as disk:
        with pytest.raises(OSError):
            _export(tmp_path, disk / "out", n=26, size=100_000)
        assert os.listdir(disk) == []


# ---- the real CLI --------------------------------------------------------------------------------------

def _cli(tmp_path: Path, out: str) -> subprocess.CompletedProcess[str]:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    sqlite3.connect(data / "journal.sqlite3").close()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"data_dir: {data}\n")
    return subprocess.run([str(CLI), "--config", str(cfg), "dataset", "export", out], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("case", ["link", "loop", "proc"])
def test_cli_errors_are_one_clear_line(tmp_path: Path, case: str) -> None:
    if case == "link":
        (tmp_path / "out").symlink_to(tmp_path)
        out = str(tmp_path / "out")
    elif case == "loop":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        out = str(tmp_path / "a" / "sub")
    else:
        out = "/proc/self/edge-export"
    run = _cli(tmp_path, out)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "internal error" not in lines[0] and "edge-runtime: error:" in lines[0], run.stderr
    assert not [p for p in tmp_path.iterdir() if ".export-" in p.name]


def _populated(tmp_path: Path, n: int) -> Path:
    """A real journal with `n` confirmed results with evidence (the real classes, no daemon)."""
    import numpy as np

    from edge_runtime.config import load_config
    from edge_runtime.verdicts.evidence import EvidenceStore
    from edge_runtime.verdicts.journal import Journal
    from edge_runtime.verdicts.review import ReviewStore
    from tests.verdicts.test_journal import make_result

    data = tmp_path / "data"
    data.mkdir()
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(f"data_dir: {data}\nevidence:\n  keep_passes: 1.0\n")
    cfg = load_config(cfg_file)
    db = cfg.journal_path()
    journal = Journal(db)
    evidence = EvidenceStore(cfg.evidence, cfg.evidence.path or data / "evidence", db)
    reviews = ReviewStore(db)
    rng = np.random.default_rng(0)
    for i in range(n):
        r = make_result(n=i)
        journal.add(r)
        evidence.save(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8), r.id, r.verdict)
        reviews.write(journal.get(r.id) or {}, "confirm")
    for closable in (reviews, evidence, journal):
        closable.close()
    return cfg_file


def test_cli_disk_full_on_a_real_tmpfs_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    cfg = _populated(tmp_path, 30)
    with tmpfs(tmp_path / "disk", "1m") as disk:
        run = subprocess.run([str(CLI), "--config", str(cfg), "dataset", "export", str(disk / "out")],
                             capture_output=True, text=True, timeout=60)
        lines = run.stderr.strip().splitlines()
        assert run.returncode != 0 and len(lines) == 1, run.stderr
        assert "No space left on device" in lines[0] and "internal error" not in lines[0]
        assert os.listdir(disk) == []
    ok = subprocess.run([str(CLI), "--config", str(cfg), "dataset", "export", str(tmp_path / "out")],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert '"images": 30' in ok.stdout
    assert len((tmp_path / "out" / "train" / "metadata.jsonl").read_text().splitlines()) == 30
