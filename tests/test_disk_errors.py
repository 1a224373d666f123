"""A disk that fails under a run or a report (full, read-only): one paragraph naming the file
and how to continue, exit 2, a manifest whose status says what happened, no temporary file
left, and every file written before intact."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import SIGNAL_TESTS, quickstart_raw

from raysim.cli import main
from raysim.errors import ResultsNotWritable
from raysim.results import atomic, manifest, sink
from raysim.results.manifest import read_manifest, update_manifest, write_manifest
from raysim.results.sink import ParquetSink

pytestmark = SIGNAL_TESTS


def _disk_error(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


def _leftovers(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.name.endswith(".tmp")]


def test_a_full_disk_still_records_the_status_in_place_and_leaves_no_temporary_file(
        tmp_path, monkeypatch):
    write_manifest(tmp_path, {"status": "running", "config": {"name": "demo" * 50}})
    real_write = Path.write_bytes

    def full(path: Path, data: bytes) -> int:  # the temporary file finds no room
        real_write(path, data[:10])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_bytes", full)
    update_manifest(tmp_path, status="failed", error="ResultsNotWritable: ...")
    assert read_manifest(tmp_path)["status"] == "failed"
    assert _leftovers(tmp_path) == []


def test_a_full_disk_records_a_manifest_grown_past_its_blocks_in_compact_form(
        tmp_path, monkeypatch):
    """The failed run's manifest has grown past the blocks the running one held when indented
    (here: 5,000 bytes against 4,096) but fits without indentation."""
    write_manifest(tmp_path, {"status": "running", "notes": "x" * 2000})
    assert (tmp_path / "manifest.json").stat().st_blocks * 512 == 4096
    monkeypatch.setattr(Path, "write_bytes", _disk_error(errno.ENOSPC))
    update_manifest(tmp_path, status="failed", workers=list(range(1000, 1300)))
    assert read_manifest(tmp_path)["status"] == "failed"
    assert read_manifest(tmp_path)["workers"] == list(range(1000, 1300))


def test_a_read_only_directory_is_one_paragraph_naming_the_manifest(tmp_path, monkeypatch):
    write_manifest(tmp_path, {"status": "running"})
    monkeypatch.setattr(manifest.os, "replace", _disk_error(errno.EROFS))
    with pytest.raises(ResultsNotWritable, match="read-only") as error:
        update_manifest(tmp_path, status="completed")
    assert str(tmp_path / "manifest.json") in str(error.value) and "\n" not in str(error.value)
    assert read_manifest(tmp_path)["status"] == "running" and _leftovers(tmp_path) == []


def test_a_part_that_finds_no_room_is_one_paragraph_and_leaves_no_temporary_file(
        tmp_path, monkeypatch):
    run_dir = tmp_path / "demo-20260101-100000" / "seed_0"
    run_dir.mkdir(parents=True)
    (run_dir.parent / "invocation.json").write_text("{}")
    writer = ParquetSink(run_dir)
    writer.add("rounds", [{"round": 0, "accuracy": 0.5}])
    writer.flush()
    real_write = sink.pq.write_table

    def full(table, where, **kwargs):
        real_write(table, where, **kwargs)  # a whole temporary file, then the disk fills
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sink.pq, "write_table", full)
    writer.add("rounds", [{"round": 1, "accuracy": 0.6}])
    with pytest.raises(ResultsNotWritable, match="disk is full") as error:
        writer.flush()
    assert "part-000001.parquet" in str(error.value)
    assert f"--resume {run_dir.parent}" in str(error.value)
    assert sorted(p.name for p in (run_dir / "rounds").iterdir()) == ["part-000000.parquet"]


def _results(tmp_path: Path) -> Path:
    run_dir = tmp_path / "results" / "demo-20260101-100000" / "seed_0"
    run_dir.mkdir(parents=True)
    write_manifest(run_dir, {"name": "demo", "algorithm": "fedavg", "seed": 0,
                             "status": "completed", "config": {"name": "demo"}})
    writer = ParquetSink(run_dir)
    writer.add("rounds", [{"round": r, "accuracy": float(v), "macro_f1": float(v)}
                          for r, v in enumerate(np.linspace(0.5, 0.9, 5))])
    writer.flush()
    return run_dir.parent


def _listing(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_mtime_ns for p in directory.rglob("*")}


def test_report_with_csv_writes_its_files_there_and_leaves_the_results_untouched(tmp_path):
    root = _results(tmp_path)
    before = _listing(root)
    tables = tmp_path / "tables"
    assert main(["report", str(root), "--csv", str(tables)]) == 0
    assert _listing(root) == before
    assert {"summary.csv", "per_seed.csv", "learning_curves_accuracy.png"} <= {
        p.name for p in tables.iterdir()}


def test_report_of_several_roots_never_replaces_a_roots_own_plot(tmp_path):
    first, second = _results(tmp_path / "a"), _results(tmp_path / "b")
    assert main(["report", str(first)]) == 0
    own = (first / "learning_curves_accuracy.png").read_bytes()
    assert main(["report", str(first), str(second)]) == 0
    assert (first / "learning_curves_accuracy.png").read_bytes() == own
    assert len(list(first.glob("learning_curves_accuracy_with_*.png"))) == 1


def test_report_on_a_read_only_results_directory_prints_its_tables_then_one_paragraph(
        tmp_path, monkeypatch, capsys):
    root = _results(tmp_path)
    monkeypatch.setattr(atomic.os, "replace", _disk_error(errno.EROFS))
    assert main(["report", str(root)]) == 2
    out, err = capsys.readouterr()
    assert "accuracy" in out and "Traceback" not in err
    assert err.startswith("error: Cannot write ") and "read-only" in err
    assert err.count("\n") == 1 and "--output DIR" in err
    assert _leftovers(root) == [] and not list(root.glob("*.png"))


def test_report_with_an_impossible_request_writes_nothing(tmp_path, capsys):
    root = _results(tmp_path)
    before = _listing(root)
    assert main(["report", str(root), "--time"]) == 2  # runs without a simulated clock
    assert _listing(root) == before


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def test_a_run_into_a_full_disk_says_so_marks_its_runs_failed_and_resumes_identically(
        ray_session, tmp_path):
    """A real full disk (a small tmpfs; where mounting one is not allowed, skipped)."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "80k"):
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        config = tmp_path / "run.yaml"
        config.write_text(yaml.safe_dump(quickstart_raw(
            training={"rounds": 80}, evaluation={"every": 1}, seeds=[0],
            engine={"num_workers": 1, "cpus_per_worker": 1})))
        run = subprocess.run(
            [sys.executable, "-m", "raysim.cli", "run", str(config), "--output",
             str(disk / "results"), "--no-progress"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
        assert "the disk is full" in run.stderr and "--resume" in run.stderr
        root = next((disk / "results").iterdir())
        assert json.loads((root / "seed_0" / "manifest.json").read_text())["status"] == "failed"
        assert _leftovers(disk) == [] and not list(root.glob("*.png"))
        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
        assert main(["run", str(config), "--resume", str(root), "--no-progress"]) == 0
        assert main(["run", str(config), "--output", str(tmp_path / "clean"),
                     "--no-progress"]) == 0
        from raysim.results import load

        resumed, clean = load(root), load(next((tmp_path / "clean").iterdir()))
        assert resumed["round"].tolist() == list(range(80))
        assert np.array_equal(resumed["accuracy"].to_numpy(), clean["accuracy"].to_numpy())
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
