"""`raysim sweep`: grid x seeds, one directory and manifest per run, one report table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import quickstart_raw

from raysim.cli import main
from raysim.configuration.sweep import grid_label, parse_grid, sweep_experiments
from raysim.errors import ConfigError
from raysim.results import load
from raysim.results.report import summary_table


def test_sweep_runs_every_combination_and_reports_one_row_per_configuration(
        ray_session, tmp_path, capsys):
    config_path = tmp_path / "sweep.yaml"
    config_path.write_text(yaml.safe_dump(quickstart_raw(training={"rounds": 2})))
    output = tmp_path / "results"
    code = main(["sweep", str(config_path), "--grid", "training.optimizer.lr=0.01,0.1",
                 "--grid", "partition.beta=5", "--seeds", "0,1", "--output", str(output),
                 "--no-progress"])
    assert code == 0
    root = next(output.iterdir())
    runs = sorted(p.relative_to(root).as_posix() for p in root.glob("*/seed_*"))
    assert runs == [f"{label}/seed_{s}" for label in ("lr=0.01,beta=5", "lr=0.1,beta=5")
                    for s in (0, 1)]
    manifest = json.loads((root / "lr=0.1,beta=5" / "seed_1" / "manifest.json").read_text())
    assert manifest["grid"] == {"training.optimizer.lr": 0.1, "partition.beta": 5}
    assert manifest["config"]["training"]["optimizer"]["lr"] == 0.1
    assert manifest["config"]["partition"]["beta"] == 5 and manifest["seed"] == 1
    rounds = load(root)
    assert set(rounds["training.optimizer.lr"]) == {0.01, 0.1}  # grid values as columns
    table = summary_table(rounds)
    assert len(table) == 2 and (table["seeds"] == 2).all() and (table["completed"] == 2).all()
    capsys.readouterr()
    assert main(["report", str(root)]) == 0
    report_text = capsys.readouterr().out
    assert all(label in report_text for label in ("lr=0.01,beta=5", "lr=0.1,beta=5"))


def test_grid_points_are_validated_and_labelled(tmp_path):
    config_path = tmp_path / "sweep.yaml"
    config_path.write_text(yaml.safe_dump(quickstart_raw()))
    grid = parse_grid(["algorithm.name=fedavg,fedprox", "training.rounds=2"])
    experiments, labels = sweep_experiments(config_path, grid, [3, 4])
    assert list(experiments) == ["name=fedavg,rounds=2", "name=fedprox,rounds=2"]
    assert experiments["name=fedprox,rounds=2"].algorithm.name == "fedprox"
    assert all(c.seeds == [3, 4] for c in experiments.values())
    assert labels["name=fedavg,rounds=2"]["grid"] == {"algorithm.name": "fedavg",
                                                      "training.rounds": 2}
    assert grid_label({"model.hidden": [8, 8], "engine.x": None}) == "hidden=_8,_8_,x=null"
    with pytest.raises(ConfigError, match=r"partition\.beta"):
        sweep_experiments(config_path, parse_grid(["partition.beta=0.5,-1"]), None)


@pytest.mark.parametrize("argv, needle", [
    (["--grid", "training.rounds"], "expected `--grid key=v1,v2"),
    (["--grid", "training.rounds=1,"], "expected `--grid key=v1,v2"),
    (["--grid", "training.rounds=1", "--grid", "training.rounds=2"], "given twice"),
    (["--grid", "seeds=1,2"], "use --seeds"),
    (["--grid", "training.roundz=1,2"], "training.roundz"),
    (["--grid", "training.rounds=1", "--seeds", "0,x"], "comma-separated integers"),
    ([], "at least one `--grid"),
])
def test_bad_sweep_arguments_exit_2(tmp_path, capsys, argv, needle):
    config_path = tmp_path / "sweep.yaml"
    config_path.write_text(yaml.safe_dump(quickstart_raw()))
    code = main(["sweep", str(config_path), *argv, "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err
    assert not Path(tmp_path / "out").exists()
