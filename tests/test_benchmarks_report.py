"""BENCHMARKS.md and the README's headline table are rendered from the committed benchmark
records: a page that differs from its rendering, or a record changed without re-rendering,
fails here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _report():
    spec = importlib.util.spec_from_file_location(
        "benchmarks_report", ROOT / "experiments" / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
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
    target = next(r for r in changed if r["side"] == "raysim")
    target["wall_s"] = target["wall_s"] * 3 + 1.0
    assert report.render_full(changed) != report.render_full(records)
    assert report.render_headline(changed) != report.render_headline(records)
    mechanisms = report.load_mechanism_records()
    slower = json.loads(json.dumps(mechanisms))
    slower[0]["off"] = slower[0]["off"] * 2
    assert report.render_mechanisms(slower) != report.render_mechanisms(mechanisms)
