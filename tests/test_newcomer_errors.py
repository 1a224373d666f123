"""The mistakes a newcomer makes get one paragraph and exit 2, never a traceback: an unknown
report metric, a config path that is a folder, an option raysim does not have, a summary of
runs that all failed."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import quickstart_raw
from test_bad_input import run_cli

from raysim.cli import main
from raysim.errors import RaysimError
from raysim.results.manifest import write_manifest
from raysim.results.sink import ParquetSink


def _finished_root(tmp_path: Path) -> Path:
    root = tmp_path / "demo-20260101-100000"
    run_dir = root / "seed_0"
    run_dir.mkdir(parents=True)
    (root / "invocation.json").write_text("{}")
    write_manifest(run_dir, {"name": "demo", "algorithm": "fedavg", "seed": 0,
                             "status": "completed", "config": {"name": "demo"}})
    sink = ParquetSink(run_dir)
    sink.add("rounds", [{"round": r, "accuracy": 0.5 + 0.1 * r, "loss": 1.0 - 0.1 * r}
                        for r in range(3)])
    sink.flush()
    return root


@pytest.mark.parametrize("option", ["--metric", "--metrics"])
def test_report_of_an_unknown_metric_lists_the_recorded_ones(capsys, tmp_path, option):
    root = _finished_root(tmp_path)
    code = main(["report", str(root), option, "nosuch", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "'nosuch'" in err, err
    assert "accuracy, loss" in err


def test_a_config_path_that_is_a_folder_says_so(capsys, tmp_path):
    code = main(["validate", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "is a folder, not a config file" in err, err


def test_an_unknown_seed_option_points_to_the_config_field(capsys, tmp_path):
    with pytest.raises(SystemExit) as stopped:
        run_cli(capsys, tmp_path, quickstart_raw(), "--seed", "3", command="run")
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "--set 'seeds=[3]'" in err, err


def test_a_summary_of_runs_that_all_failed_is_a_paragraph(tmp_path):
    from raysim.api import Results
    from raysim.engine.runner import RunOutcome

    root = tmp_path / "demo-20260101-100000"
    (root / "seed_0").mkdir(parents=True)
    write_manifest(root / "seed_0", {"name": "demo", "algorithm": "fedavg", "seed": 0,
                                     "status": "failed", "config": {"name": "demo"}})
    failed = Results(root, (RunOutcome(0, root / "seed_0", None, "the data is corrupt", 1),))
    with pytest.raises(RaysimError, match=r"1 of 1 runs failed .*the data is corrupt"):
        failed.summary()


def test_a_data_root_that_is_a_file_is_refused(capsys, tmp_path):
    afile = tmp_path / "pneumoniamnist.npz"
    afile.write_bytes(b"")
    with pytest.raises(SystemExit) as stopped:
        run_cli(capsys, tmp_path, quickstart_raw(), "--data-root", str(afile))
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "is a file, not a folder" in err, err


def test_a_dataset_file_with_one_label_too_few_is_a_paragraph(capsys, tmp_path):
    import numpy as np

    images = np.zeros((20, 8, 8), np.uint8)
    np.savez(tmp_path / "mine.npz", train_images=images, train_labels=np.zeros(19, np.uint8),
             test_images=images[:5], test_labels=np.zeros(5, np.uint8))
    raw = quickstart_raw(dataset={"name": "mine", "path": str(tmp_path / "mine.npz")},
                         partition={"scheme": "iid", "num_clients": 2, "min_size": 1})
    code, err = run_cli(capsys, tmp_path, raw)
    assert code == 2 and "Traceback" not in err, err
    assert "20 samples but train_labels 19 labels" in err


def test_a_read_only_results_folder_is_a_paragraph_not_the_cleanups_error(tmp_path,
                                                                          monkeypatch):
    """On a read-only file system the temporary file's removal fails too (EROFS); that second
    error must not replace the paragraph naming the file (``raysim report`` on a read-only
    root, a checkpoint's state file)."""
    import errno
    import os

    from raysim.errors import ResultsNotWritable
    from raysim.results.atomic import write_atomically
    from raysim.state_codec import save_state

    def read_only(*_args, **_kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(ResultsNotWritable, match=r"summary\.csv"):
        write_atomically(tmp_path / "summary.csv", read_only, "free the disk")
    monkeypatch.setattr(os, "replace", read_only)
    with pytest.raises(OSError) as raised:
        save_state(tmp_path / "state.npz", {"a": 1}, "server", 1)
    assert raised.value.errno == errno.EROFS and "Read-only" in str(raised.value)


def test_the_printed_table_honours_evaluation_final_rounds(tmp_path):
    """A config that evaluates its last two rounds (FedDC's, whose single rounds alternate) is
    summarised by ``raysim run`` over those two, as ``raysim report --window 2`` would."""
    from raysim.cli import _import_summary_modules, _summarise
    from raysim.configuration.experiment import parse_config

    root = _finished_root(tmp_path)  # accuracy 0.5, 0.6, 0.7
    config = parse_config(quickstart_raw(evaluation={"every": 1, "final_rounds": 2}))
    lines = _summarise([], root, _import_summary_modules(), {"": config})
    assert any("last 2 evaluated rounds" in line for line in lines)
    assert any("0.6500" in line for line in lines), lines
    plain = _summarise([], root, _import_summary_modules(), {"": parse_config(quickstart_raw())})
    assert any("0.7000" in line for line in plain), plain


def test_rounds_below_the_evaluation_period_warn():
    from raysim.cli import config_warnings
    from raysim.configuration.experiment import parse_config

    few = parse_config(quickstart_raw(training={"rounds": 3}, evaluation={"every": 5}))
    said = config_warnings({"": few, "b": parse_config(quickstart_raw())})
    assert len(said) == 1 and "training.rounds (3) is below evaluation.every (5)" in said[0]


def test_ctrl_c_during_start_up_in_python_is_run_interrupted(monkeypatch):
    """Ctrl-C while an API call waits for CPU slots (or anywhere in start-up) raises the
    documented RunInterrupted, without a chained traceback."""
    import raysim
    from raysim.engine import invocation
    from raysim.errors import RunInterrupted

    def waiting(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(invocation, "invoke", waiting)
    with pytest.raises(RunInterrupted) as stopped:
        raysim.run(quickstart_raw(), progress=False)
    assert stopped.value.__suppress_context__ and stopped.value.root == ""


def test_a_checkpoint_that_cannot_be_read_marks_its_run_failed(tmp_path):
    """A resumed run whose checkpoint is refused (damaged, or a tree raysim cannot rebuild)
    stops with the refusal's paragraph, and its manifest says `failed`, not `running`."""
    from types import SimpleNamespace

    from raysim.engine.run.driver import Driver
    from raysim.results.manifest import read_manifest
    from raysim.rounds.checkpoint import CHECKPOINT_FILE

    run_dir = tmp_path / "seed_0"
    (run_dir / CHECKPOINT_FILE).parent.mkdir(parents=True)
    (run_dir / CHECKPOINT_FILE).write_bytes(b"not a state file")
    write_manifest(run_dir, {"name": "demo", "seed": 0, "status": "running"})
    driver = Driver.__new__(Driver)
    driver.spec, driver.run_dir = SimpleNamespace(resume=True), run_dir
    with pytest.raises(RaysimError, match="Cannot resume from"):
        driver.run()
    manifest = read_manifest(run_dir)
    assert manifest["status"] == "failed" and "Cannot resume from" in manifest["error"]


def test_an_estimate_without_its_data_says_so_before_ray_starts(tmp_path, monkeypatch):
    from raysim.api import run_estimate
    from raysim.engine import invocation
    from raysim.errors import DataError

    def no_ray(*_args, **_kwargs):
        raise AssertionError("Ray was started before the data was checked")

    monkeypatch.setattr(invocation, "ray_for", no_ray)
    raw = quickstart_raw(dataset={"name": "pneumoniamnist", "download": False,
                                  "verify_checksum": False})
    with pytest.raises(DataError, match=r"pneumoniamnist\.npz.*--stand-in-data"):
        run_estimate(raw, data_root=str(tmp_path / "empty"))


def test_the_closing_plot_shows_the_methods_headline_metric():
    import pandas as pd

    from raysim.cli import headline_metric
    from raysim.configuration.experiment import parse_config

    rounds = pd.DataFrame({"accuracy": [0.5], "personal_accuracy": [0.8]})
    mhpflid = parse_config(quickstart_raw(algorithm={"name": "mhpflid"}))
    fedavg = parse_config(quickstart_raw())
    assert headline_metric({"": mhpflid}, rounds) == "personal_accuracy"
    assert headline_metric({"a": mhpflid, "b": fedavg}, rounds) == "accuracy"
    assert headline_metric({"": mhpflid}, rounds.drop(columns="personal_accuracy")) == "accuracy"


def test_a_run_on_a_busy_machine_says_so(monkeypatch):
    import os

    from raysim.cli import busy_line

    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 0.5, 0.5))
    assert busy_line(2) is None  # a 2-CPU machine with one other job is not busy
    monkeypatch.setattr(os, "getloadavg", lambda: (7.0, 0.5, 0.5))
    assert "load average 7.0 on 2 CPUs" in str(busy_line(2))


def test_start_up_says_what_it_waits_for_on_a_terminal(capsys, monkeypatch):
    import sys

    from raysim.engine.launch.local_ray import say_starting

    say_starting("starting Ray")
    assert capsys.readouterr().err == ""  # a log gets the phases' times at the end instead
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    say_starting("starting Ray")
    assert capsys.readouterr().err == "start-up: starting Ray...\n"


def test_results_name_the_method_a_variant_amounts_to():
    """FedDC's config runs FedAvg as FedDC with daisy-chaining off: its results say fedavg."""
    from raysim.algorithms import ALGORITHMS
    from raysim.configuration.experiment import load_experiments

    experiments = load_experiments(Path(__file__).parents[1] / "experiments" / "feddc"
                                   / "pneumonia.yaml")
    named = {label: ALGORITHMS[c.algorithm.name].describe(c.algorithm)
             for label, c in experiments.items()}
    assert named["feddc"] == "feddc"
    assert named["fedavg_b1"] == named["fedavg_b10"] == "fedavg"
    assert ALGORITHMS["fedprox"].describe(parse_config_params("fedprox")) == "fedprox"


def parse_config_params(name: str):
    from raysim.configuration.experiment import parse_config

    return parse_config(quickstart_raw(algorithm={"name": name})).algorithm


def test_a_local_ray_that_does_not_start_is_one_paragraph():
    from raysim.engine.launch.local_ray import local_ray_failed

    raylet = RuntimeError("Traceback (most recent call last):\n  File ...\n"
                          "  ...\nFailed to start the raylet within 30 seconds.\n")
    said = local_ray_failed(raylet)
    assert "Failed to start the raylet within 30 seconds" in said and "\n" not in said
    assert "Traceback" not in said and "nothing was run or written" in said


def test_a_driver_that_cannot_run_names_the_first_line_and_the_way_out():
    from raysim.engine.follow import JOINED_HINT, first_line

    ray_text = RuntimeError("The actor died unexpectedly before it could answer.\n"
                            "\tclass_name: DriverHost\n\tactor_id: 7e1...\n\tpid: 99")
    assert first_line(ray_text) == "The actor died unexpectedly before it could answer."
    assert "--set engine.address=local" in JOINED_HINT and "--resume" in JOINED_HINT
