"""Reports list variants in the order the config gives them, not alphabetically."""

from __future__ import annotations

import numpy as np

from raysim.results import load
from raysim.results.manifest import write_manifest
from raysim.results.report import summary_table
from raysim.results.sink import ParquetSink


def _variant(root, label: str, index: int, accuracy: float) -> None:
    for seed in (0, 1):
        run_dir = root / label / f"seed_{seed}"
        run_dir.mkdir(parents=True)
        write_manifest(run_dir, {"name": "demo", "algorithm": "fedavg", "seed": seed,
                                 "status": "completed", "variant_index": index,
                                 "config": {"name": "demo"}})
        sink = ParquetSink(run_dir)
        sink.add("rounds", [{"round": r, "accuracy": accuracy + 0.01 * seed}
                            for r in range(3)])
        sink.flush()


def test_variants_come_in_the_configs_order(tmp_path):
    root = tmp_path / "demo-20260101-100000"
    root.mkdir()
    (root / "invocation.json").write_text("{}")
    for index, (label, accuracy) in enumerate([("zeta", 0.9), ("mid", 0.7), ("alpha", 0.5)]):
        _variant(root, label, index, accuracy)
    rounds = load(root)
    assert list(dict.fromkeys(rounds["experiment"])) == ["zeta", "mid", "alpha"]
    table = summary_table(rounds)
    assert table["experiment"].tolist() == ["zeta", "mid", "alpha"]
    np.testing.assert_allclose(table["accuracy_mean"], [0.905, 0.705, 0.505])
