"""The daemon started with its journal on a full disk (a real tmpfs, filled): the journal cannot be
opened (SQLite cannot create its WAL files), and `edge-runtime run` says so in one line naming the
journal and the free space, exit 2, instead of "internal error: OperationalError: disk I/O error".
Once space returns the journal opens (the service manager's restart then starts the daemon)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from edge_runtime.verdicts.journal import Journal
from tests.support.tmpfs import fill_disk, tmpfs


def test_run_on_a_full_journal_disk_says_disk_full_in_one_line_and_the_journal_opens_once_space_returns(
        tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "1m") as disk:
        data = disk / "data"
        config = tmp_path / "config.yaml"
        config.write_text(f"device_id: full-start\ndata_dir: {data}\nmqtt: {{enabled: false}}\n"
                          "api: {enabled: false}\ngovernor: {enabled: false}\n")
        data.mkdir()
        filler = fill_disk(disk)
        run = subprocess.run([sys.executable, "-m", "edge_runtime", "run", "--config", str(config)],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2, run.stderr
        assert "internal error" not in run.stderr and "Traceback" not in run.stderr, run.stderr
        last = run.stderr.strip().splitlines()[-1]  # after the start's own warnings (no cameras here)
        assert last.startswith("edge-runtime: error: disk full: the journal "), run.stderr
        assert str(data / "journal.sqlite3") in last and "KiB free" in last
        filler.unlink()
        journal = Journal(data / "journal.sqlite3")
        assert journal.counts()["total"] == 0
        journal.close()
