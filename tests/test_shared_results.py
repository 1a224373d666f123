"""A results directory from someone else runs nothing the user did not ask for: a resume
never imports the plug-ins a run root's record names (nor from the current directory, where a
planted module would be found), compares the stored config without importing its plug-ins,
never recalls a cluster address or a logging target, and says what it recalled."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import quickstart_raw
from test_bad_input import run_cli

from raysim.engine.recall import recall


def _planted(folder: Path, name: str, marker: Path) -> None:
    """A module in ``folder`` whose import leaves ``marker`` (code a directory would run)."""
    (folder / f"{name}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n")


def _run_root(tmp_path: Path, invocation: dict, config: dict | None = None) -> Path:
    from raysim.configuration.experiment import parse_config

    root = tmp_path / "results" / "quickstart-20260101-100000"
    (root / "seed_0").mkdir(parents=True)
    stored = config if config is not None else parse_config(
        quickstart_raw(training={"rounds": 2})).model_dump(mode="json")
    (root / "seed_0" / "manifest.json").write_text(json.dumps(
        {"config": stored, "status": "interrupted"}))
    (root / "invocation.json").write_text(json.dumps(invocation))
    return root


def test_a_resume_never_imports_the_plugins_a_run_root_names(capsys, tmp_path, monkeypatch):
    marker = tmp_path / "planted-ran"
    root = _run_root(tmp_path, {"command": "run", "plugins": ["planted_by_root"]})
    _planted(root, "planted_by_root", marker)
    monkeypatch.chdir(root)  # standing in the shared root, where the module lies
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    code, err = run_cli(capsys, tmp_path, quickstart_raw(training={"rounds": 2}),
                        "--no-progress", "--resume", str(root), command="run")
    assert code == 2 and "Traceback" not in err and err.count("error:") == 1, err
    assert "--plugin planted_by_root" in err and "never those a results directory names" in err
    assert not marker.exists() and "planted_by_root" not in sys.modules
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_a_stored_config_is_compared_without_importing_its_plugins(tmp_path, monkeypatch):
    from raysim.configuration.experiment import parse_config
    from raysim.engine.resume import stored_config_change

    marker = tmp_path / "planted-ran"
    config = parse_config(quickstart_raw(training={"rounds": 2}))
    stored = {**config.model_dump(mode="json"), "plugins": ["planted_by_manifest"]}
    root = _run_root(tmp_path, {}, stored)
    _planted(root, "planted_by_manifest", marker)
    monkeypatch.chdir(root)
    assert stored_config_change(root / "seed_0", config) == ["plugins"]
    assert not marker.exists() and "planted_by_manifest" not in sys.modules


def test_a_cluster_address_and_logging_targets_are_never_recalled():
    stored = {"overrides": ["training.rounds=2", "engine.address=10.0.0.9:6379",
                            "logging.mlflow=http://tracker.example:5000",
                            "logging.tensorboard=/elsewhere", "engine.num_workers=1"],
              "variants": ["b"], "data_root": "/data", "plugins": []}
    names = ("variants", "overrides", "data_root", "plugins")
    recalled = recall(names, {"variants": [], "overrides": [], "data_root": None,
                              "plugins": []}, stored, "ROOT")
    assert recalled.options == {"variants": ["b"], "data_root": "/data",
                                "overrides": ["training.rounds=2", "engine.num_workers=1"]}
    assert recalled.dropped == ["engine.address=10.0.0.9:6379",
                                "logging.mlflow=http://tracker.example:5000",
                                "logging.tensorboard=/elsewhere"]
    said = "\n".join(recalled.lines("ROOT"))
    assert "--variant b" in said and "--data-root /data" in said
    assert "--set engine.address=10.0.0.9:6379" in said and "not recalled" in said
    given = recall(names, {"variants": [], "overrides": ["training.rounds=3"],
                           "data_root": None, "plugins": []}, stored, "ROOT")
    assert "overrides" not in given.options  # what the user gives again wins


def test_a_resume_says_what_it_recalled_and_drops_the_address(capsys, tmp_path):
    """The CLI prints the recalled options and the dropped address before it compares the
    configs (here the stored one differs, so the resume stops with its paragraph)."""
    root = _run_root(tmp_path, {"command": "run", "plugins": [],
                                "overrides": ["engine.address=10.0.0.9:6379",
                                              "training.rounds=2"]})
    changed = quickstart_raw(training={"rounds": 5, "optimizer": {"name": "sgd", "lr": 0.5}})
    code, err = run_cli(capsys, tmp_path, changed, "--no-progress", "--resume", str(root),
                        command="run")
    assert code == 2 and "Traceback" not in err, err
    assert "recalled from" in err and "--set training.rounds=2" in err
    assert "not recalled" in err and "engine.address=10.0.0.9:6379" in err
    assert "different config" in err


@pytest.mark.parametrize("text", ["not json", "[1, 2]"])
def test_an_unreadable_record_of_the_first_command_is_one_paragraph(capsys, tmp_path, text):
    root = _run_root(tmp_path, {})
    (root / "invocation.json").write_text(text)
    code, err = run_cli(capsys, tmp_path, quickstart_raw(training={"rounds": 2}),
                        "--no-progress", "--resume", str(root), command="run")
    assert code == 2 and "Traceback" not in err and "invocation.json" in err, err


def test_resuming_another_configs_root_names_the_config_it_was_started_from(capsys, tmp_path):
    root = _run_root(tmp_path, {"command": "run", "plugins": [], "variants": ["feddc"],
                                "config": "/lab/experiments/feddc/pneumonia.yaml"})
    code, err = run_cli(capsys, tmp_path, quickstart_raw(training={"rounds": 2}),
                        "--no-progress", "--resume", str(root), command="run")
    assert code == 2 and "Traceback" not in err, err
    assert "started from /lab/experiments/feddc/pneumonia.yaml" in err
    assert "Unknown variant" not in err and "for --variant" not in err
