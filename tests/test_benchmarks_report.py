"""BENCHMARKS.md and the README's headline table are rendered from the committed benchmark
records: a page that differs from its rendering, or a record changed without re-rendering,
fails here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _report():
    spec = importlib.util.spec_from_file_location(
        "benchmarks_report", ROOT / "experiments" / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_pages_show_the_records_as_rendered():
    report = _report()
    assert report.load_records() and report.load_mechanism_records(), "no committed records"
    blocks = report.rendered_blocks()
    for page, markers in report.PAGES.items():
        text = (ROOT / page).read_text()
        for marker in markers:
            assert report.rendered_page(text, marker, blocks[marker]) == text, (
                f"{page} differs from the records; run `python experiments/benchmarks/report.py`")


def test_a_changed_record_changes_the_rendering():
    report = _report()
    records = report.load_records()
    changed = json.loads(json.dumps(records))
    target = max((r for r in changed  # the newest of the side the headline shows
                  if r["side"] == "raysim_2x1cpu" and r.get("wall_s") and r["device"] == "CPU"),
                 key=lambda r: (r["date"], r["measured_at"]))
    for record in changed:  # each repeat of that measurement (a median moves with all of them)
        if all(record.get(key) == target[key] for key in ("side", "workload", "measured_at")):
            record["wall_s"] = record["wall_s"] * 30 + 100.0
    assert report.render_full(changed) != report.render_full(records)
    assert report.render_headline(changed) != report.render_headline(records)
    mechanisms = report.load_mechanism_records()
    slower = json.loads(json.dumps(mechanisms))
    slower[0]["off"] = slower[0]["off"] * 2
    assert report.render_mechanisms(slower) != report.render_mechanisms(mechanisms)


def test_repeated_sides_show_their_median_and_a_failed_side_says_why():
    report = _report()
    common = {"workload": "mlp32-1000x4-synthetic", "device": "CPU", "cpus": 2, "rounds": 50,
              "commit": "abc1234", "date": "2026-01-01", "versions": {"torch": "x"},
              "records_file": "peers_cpu-2cores_abc1234.jsonl"}
    records = [{**common, "side": "raysim_2x1cpu", "repeat": i, "wall_s": wall,
                "rounds_per_s": rate} for i, (wall, rate) in enumerate([(10.0, 9.0), (12.0, 8.0),
                                                                         (30.0, 7.0)])]
    records += [{**common, "side": "flower", "repeat": i, "wall_s": 40.0 + i,
                 "rounds_per_s": 1.0} for i in range(3)]
    records += [{**common, "side": "pfl_research_2proc", "repeat": i, "wall_s": 5.0,
                 "error": "timed out after 5 s"} for i in range(3)]
    table = report.render_full(records)
    whole = next(line for line in table.splitlines() if "whole process of 50" in line)
    assert "12.0 s (10.0-30.0, n=3)" in whole and "41.0 s (40.0-42.0, n=3)" in whole
    assert "0.29x time" in whole and "did not finish: timed out after 5 s" in whole
    rate = next(line for line in table.splitlines() if "rounds/s over 50" in line)
    assert "8.00 (7.00-9.00, n=3)" in rate and "8.0x rate" in rate


def test_a_side_measured_again_replaces_only_its_own_figures():
    report = _report()
    common = {"workload": "cnn-1000x50-cifar-shape", "device": "GPU X", "cpus": 16,
              "rounds": 20, "versions": {"torch": "x"}}
    first = {**common, "commit": "aaaaaaa", "date": "2026-01-01",
             "records_file": "peers_gpu_aaaaaaa.jsonl"}
    later = {**common, "commit": "bbbbbbb", "date": "2026-01-02",
             "records_file": "peers_gpu_bbbbbbb.jsonl"}
    records = [{**first, "side": "raysim_vectorized_1gpu", "rounds_per_s": 10.0},
               {**first, "side": "pfl_research_4proc", "rounds_per_s": 4.0, "wall_s": 20.0},
               {**first, "side": "on_device_vmap_reference", "rounds_per_s": 50.0}]
    records += [{**later, "side": "raysim_vectorized_1gpu", "repeat": i, "rounds_per_s": rate,
                 "wall_s": 9.0} for i, rate in enumerate([19.0, 20.0, 21.0])]
    records.append({**later, "side": "on_device_vmap_reference", "rounds_per_s": 40.0})
    rows = [line for line in report.render_full(records).splitlines() if "GPU X" in line]
    assert len(rows) == 1, "no whole-process row where no peer ran repeatedly"
    assert "20.00 (19.00-21.00, n=3)" in rows[0] and "| 4.00 (4proc), 20.0 s whole |" in rows[0]
    assert "5.00x rate" in rows[0] and "| 0.50 |" in rows[0]
    assert "aaaaaaa + bbbbbbb, 2026-01-02" in rows[0]


def test_the_startup_tables_show_the_newest_run_of_each_side_and_each_configuration():
    report = _report()
    common = {"workload": "mlp32-1000x4-synthetic", "rounds": 50, "device": "CPU", "cpus": 2}
    old = {**common, "commit": "aaaaaaa", "date": "2026-01-01", "measured_at": "2026-01-01T00:00Z"}
    new = {**common, "commit": "bbbbbbb", "date": "2026-01-02", "measured_at": "2026-01-02T00:00Z"}
    peers = [{**old, "side": "raysim_2x1cpu", "wall_s": 99.0, "machine_cpu_s": 150.0},
             {**new, "side": "raysim_2x1cpu", "wall_s": 10.0, "machine_cpu_s": 15.0, "repeat": 0},
             {**new, "side": "raysim_2x1cpu", "wall_s": 12.0, "machine_cpu_s": 19.0, "repeat": 1},
             {**new, "side": "pfl_research_2proc", "wall_s": 8.0, "machine_cpu_s": 12.0,
              "repeat": 0},
             {**new, "side": "pfl_research_2proc", "wall_s": 8.0, "machine_cpu_s": 12.0,
              "repeat": 1},
             {**new, "side": "plain_pytorch_loop", "rounds_per_s": 20.0}]  # no process: left out
    phases = {"imports": 1.0, "data": 2.0, "ray": 3.0, "workers": 4.0, "first_round": 9.0}
    startup = [{"suite": "startup", "label": "quickstart", "tree": "this", "command_s": 15.0,
                "machine_cpu_s": 30.0, "load_at_start": 0.5, "device": "cpu-2cores",
                "commit": "bbbbbbb", "date": "2026-01-02", "measured_at": "2026-01-02T00:00Z",
                **phases},
               {"suite": "startup", "label": "quickstart", "tree": "baseline", "command_s": 99.0,
                "machine_cpu_s": 99.0, "load_at_start": 0.5, "device": "cpu-2cores",
                "commit": "bbbbbbb", "date": "2026-01-02", "measured_at": "2026-01-02T00:00Z",
                **phases}]
    text = report.render_startup(peers, startup)
    rows = [line for line in text.splitlines() if line.startswith("| MLP")]
    assert [row.split(" | ")[1] for row in rows] == ["pfl_research_2proc", "raysim_2x1cpu"]
    assert "| 11.0 (10.0-12.0) | 17.0 (15.0-19.0) | 1.54 |" in rows[1]  # the newest run only
    assert "| 1.38 (t = 3.00, p = 0.20, 2 pairs) |" in rows[1]  # 10/8 and 12/8, by repeat
    assert "| 1.50 | - |" in rows[0]  # (pfl-research against itself: no pairs)
    assert "99" not in text.split("| configuration")[0]
    quickstart = next(line for line in text.splitlines() if line.startswith("| quickstart"))
    assert "| 15.0 (15.0-15.0) | 1.0 (1.0-1.0) |" in quickstart and "99" not in quickstart
    assert "2 CPUs" in quickstart and "--config experiments/quickstart.yaml" in quickstart


def test_the_task_rounds_show_the_newest_summary_of_each_workload_and_device():
    report = _report()
    base = {"side": "summary", "rounds": 3, "threads": 1, "load_at_start": 0.5,
            "date": "2026-12-04", "raysim_loop_over_plain_n": 3,
            "plain_pytorch_loop_median_rounds_per_s": 2.0,
            "raysim_loop_median_rounds_per_s": 2.0, "raysim_vectorized_median_rounds_per_s": 1.0,
            "raysim_loop_over_plain_ratio_mean": 1.0, "raysim_loop_over_plain_ratio_t": 0.1,
            "raysim_vectorized_over_plain_ratio_mean": 0.5,
            "raysim_vectorized_over_plain_ratio_t": -9.0}
    records = [{**base, "workload": "unet", "device": "cpu-2cores", "commit": "new",
                "description": "U-Net"},  # (a file named before the older one)
               {**base, "workload": "unet", "device": "cpu-2cores", "commit": "old",
                "date": "2026-12-02"},
               {**base, "workload": "tcn", "device": "nvidia-h200", "commit": "gpu",
                "threads": None, "raysim_vectorized_median_rounds_per_s": 8.0}]
    rows = report.render_task_rounds(records).splitlines()[2:]
    assert len(rows) == 2 and rows[0].startswith("| U-Net | cpu-2cores | 1 |") and "new" in rows[0]
    assert "| tcn | nvidia-h200 | - |" in rows[1] and "8.00 rounds/s" in rows[1]
    assert "--workloads tcn --device cuda --rounds 3 --repeats 3" in rows[1]


def test_a_gpu_runs_files_are_filed_by_device_and_commit_once(tmp_path, monkeypatch):
    import tarfile

    spec = importlib.util.spec_from_file_location(
        "device_unpack", ROOT / "experiments" / "benchmarks" / "device" / "unpack.py")
    unpack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unpack)
    monkeypatch.setattr(unpack, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(unpack, "ESTIMATES", tmp_path / "estimates")
    (tmp_path / "records").mkdir()
    (tmp_path / "estimates").mkdir()
    back = tmp_path / "back"
    (back / "estimates").mkdir(parents=True)
    lines = [json.dumps({"suite": "task_rounds", "device": "nvidia-h200", "commit": "abc1234",
                         "side": side}) for side in ("a", "b")]
    (back / "task_rounds_gpu.jsonl").write_text("\n".join(lines) + "\n")
    (back / "estimates" / "polyp_gpu.csv").write_text("variant,round_s\nfedavg,1.5\n")
    with tarfile.open(back / "estimates.tar", "w") as tar:
        tar.add(back / "estimates", arcname="estimates")
    for _ in range(2):  # filed twice: the records once
        target = unpack.file_records(back / "task_rounds_gpu.jsonl", "task_rounds")
        filed = unpack.file_estimates(back / "estimates.tar")
    assert target == tmp_path / "records" / "task_rounds_nvidia-h200_abc1234.jsonl"
    assert target.read_text().splitlines() == lines
    assert filed == [tmp_path / "estimates" / "polyp_gpu.csv"]
    assert "fedavg,1.5" in filed[0].read_text()
    assert unpack.file_records(back / "peers_gpu.jsonl", "peers") is None  # not brought back
    assert unpack.device_slug("NVIDIA H200") == "nvidia-h200"
