"""`plugmq bench store` on a directory the user names: it measures, and leaves the directory as it found it."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from plugmq.cli import main


def test_a_named_directory_is_left_as_it_was(tmp_path: Path) -> None:
    workdir = tmp_path / "bench"
    workdir.mkdir()
    (workdir / "users-own-file").write_text("kept")
    result = CliRunner().invoke(main, ["bench", "store", "--dir", str(workdir), "--messages", "200",
                                       "--stores", "store_lmdb,store_mmap", "--sizes", "128", "--rounds", "1",
                                       "--no-redis", "--restart-log-mib", "0", "--json"], prog_name="plugmq")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert {r["store"] for r in rows} == {"store_lmdb", "store_mmap"}
    assert all(r["messages"] > 0 and r["seconds"] > 0 for r in rows)
    assert [p.name for p in workdir.iterdir()] == ["users-own-file"], "every store and raw file is removed"
