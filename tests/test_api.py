"""raysim from Python: ``raysim.run`` runs a config (a dict or a YAML path, with overrides and
variants) like ``raysim run`` and returns its results as DataFrames; bad input is an exception
with the command line's paragraph, and nothing runs."""

from __future__ import annotations

import pytest
from conftest import small_federation

import raysim
from raysim.errors import RaysimError


def test_run_returns_the_results_of_every_variant_and_resume_finds_them_complete(tmp_path):
    raw = {**small_federation(name="api"), "variants": {"fedavg": {}, "local": {
        "algorithm": {"name": "local"}}}}
    results = raysim.run(raw, overrides=["training.rounds=2"], output=str(tmp_path),
                         progress=False)
    assert results is not None and not results.failed
    assert results.root.parent == tmp_path and len(results.outcomes) == 2
    summary = results.summary(["accuracy"])
    assert summary["experiment"].tolist() == ["fedavg", "local"]
    assert summary["rounds"].tolist() == [2, 2]
    assert set(results.table("clients")["experiment"]) == {"fedavg", "local"}
    assert raw["variants"]["fedavg"] == {}  # the caller's dict is left as it was
    assert raysim.run(raw, overrides=["training.rounds=2"], output=str(tmp_path),
                      resume=results.root, progress=False) is None  # all complete


def test_bad_input_is_one_paragraph_and_nothing_runs(tmp_path):
    with pytest.raises(RaysimError, match=r"training\.rounds") as error:
        raysim.run(small_federation(name="bad"), overrides=["training.rounds=0"],
                   output=str(tmp_path))
    assert "\n" not in str(error.value)
    with pytest.raises(RaysimError, match="Unknown variant 'nope'"):
        raysim.run(small_federation(name="bad"), variants=["nope"], output=str(tmp_path))
    assert not any(tmp_path.iterdir())


def test_sweep_runs_every_grid_point_and_records_it(tmp_path):
    config = tmp_path / "small.yaml"
    import yaml

    config.write_text(yaml.safe_dump(small_federation(name="grid")))
    results = raysim.run_sweep(config, {"training.optimizer.lr": [0.01, 0.1]},
                           overrides=["training.rounds=1"], output=str(tmp_path / "out"),
                           progress=False)
    assert results is not None and len(results.outcomes) == 2 and not results.failed
    assert len(set(results.table("rounds")["experiment"])) == 2


def test_run_estimate_refuses_bad_input_before_ray_starts(tmp_path):
    with pytest.raises(RaysimError, match="Invalid --rounds 1"):
        raysim.run_estimate(small_federation(name="estimate"), rounds=1)
    with pytest.raises(RaysimError, match="Unknown variant 'nope'"):
        raysim.run_estimate(small_federation(name="estimate"), variants=["nope"])
