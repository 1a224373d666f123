"""Bad input: one clear paragraph naming the problem, exit code 2, no traceback."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import pytest
import yaml
from conftest import quickstart_raw
from fixtures import write_medmnist_npz

from raysim.cli import main


def run_cli(capsys, tmp_path: Path, raw, *extra: str, command: str = "validate") -> tuple[int, str]:
    config = tmp_path / "config.yaml"
    config.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw))
    code = main([command, str(config), *extra])
    captured = capsys.readouterr()
    return code, captured.err


CONFIG_CASES = [
    ("unknown top-level key", quickstart_raw(trainig={"rounds": 3}), [], "trainig"),
    ("typo in a section", quickstart_raw(partition={"betta": 0.1}), [], "partition.betta"),
    ("unknown algorithm", quickstart_raw(algorithm={"name": "fedawg"}), [], "algorithm.name"),
    ("unknown model", quickstart_raw(model={"name": "vgg99"}), [], "model.name"),
    ("negative rounds", quickstart_raw(), ["--set", "training.rounds=-3"], "training.rounds"),
    ("negative FedProx mu", quickstart_raw(algorithm={"name": "fedprox", "mu": -1}), [],
     "algorithm.mu"),
    ("epochs and steps", quickstart_raw(training={"local_steps": 2, "local_epochs": 1}), [],
     "local_steps"),
    ("too many clients per round", quickstart_raw(training={"clients_per_round": 11}), [],
     "clients_per_round"),
    ("bad image size", quickstart_raw(dataset={"name": "pneumoniamnist", "size": 32}), [],
     "dataset.size"),
    ("bad override syntax", quickstart_raw(), ["--set", "training.rounds"], "--set key=value"),
    ("override into a scalar", quickstart_raw(), ["--set", "seeds.x=1"], "seeds"),
    ("not a mapping", "- just\n- a list\n", [], "YAML mapping"),
    ("broken YAML", "dataset: {name: [\n", [], "not valid YAML"),
    ("repeated seed", quickstart_raw(seeds=[0, 0]), [], "seeds"),
]


@pytest.mark.parametrize("label, raw, extra, needle", CONFIG_CASES,
                         ids=[case[0] for case in CONFIG_CASES])
def test_config_errors_exit_2_with_clear_message(capsys, tmp_path, label, raw, extra, needle):
    code, err = run_cli(capsys, tmp_path, raw, *extra)
    assert code == 2
    assert needle in err
    assert "Traceback" not in err
    assert err.startswith("error: ") and err.count("\n") == 1  # one paragraph


def test_missing_config_file(capsys, tmp_path):
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def _run_with(capsys, tmp_path, dataset, partition=None, model=None):
    raw = quickstart_raw(dataset=dataset, **({"partition": partition} if partition else {}))
    if model:
        raw["model"] = model
    return run_cli(capsys, tmp_path, raw, "--no-progress", command="run")


def test_missing_medmnist_file_offline_names_file_and_data_root(capsys, tmp_path):
    code, err = _run_with(capsys, tmp_path, {"name": "breastmnist", "root": str(tmp_path),
                                             "download": False})
    assert code == 2
    assert "breastmnist.npz" in err and "--data-root" in err and "zenodo" in err


def test_failed_download_names_file_url_and_data_root(capsys, tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr("urllib.request.urlopen", offline)
    missing_root = tmp_path / "not" / "there"
    code, err = _run_with(capsys, tmp_path, {"name": "breastmnist", "size": 64,
                                             "root": str(missing_root)})
    assert code == 2
    assert "breastmnist_64.npz" in err and "--data-root" in err and "https://" in err
    assert not (tmp_path / "not").exists()  # the failed download made no empty directory


def test_a_misspelt_key_or_dataset_gets_the_name_it_resembles(capsys, tmp_path):
    for raw, suggestion in ((quickstart_raw(trainig={"rounds": 3}), "did you mean `training`?"),
                            (quickstart_raw(training={"rouns": 3}), "did you mean `rounds`?"),
                            (quickstart_raw(model={"name": "mlp", "hiden": [4]}),
                             "did you mean `hidden`?")):
        code, err = run_cli(capsys, tmp_path, raw)
        assert code == 2 and suggestion in err, err
    code, err = _run_with(capsys, tmp_path, {"name": "pneumonimnist", "download": False})
    assert code == 2 and "did you mean 'pneumoniamnist'?" in err
    for built_in in ("synthetic", "synthetic-susy", "synthetic-100"):  # the whole list
        assert built_in in err


def test_checksum_mismatch_is_reported(capsys, tmp_path):
    write_medmnist_npz(tmp_path, "pneumoniamnist")
    code, err = _run_with(capsys, tmp_path, {"name": "pneumoniamnist", "root": str(tmp_path)})
    assert code == 2 and "MD5" in err and "verify_checksum" in err


def test_truncated_npz_is_reported(capsys, tmp_path):
    path = write_medmnist_npz(tmp_path, "pneumoniamnist")
    path.write_bytes(path.read_bytes()[:5000])
    code, err = _run_with(capsys, tmp_path, {"name": "pneumoniamnist", "root": str(tmp_path),
                                             "verify_checksum": False})
    assert code == 2 and "corrupt or truncated" in err


def test_unknown_datasets_are_rejected(capsys, tmp_path):
    code, err = _run_with(capsys, tmp_path, {"name": "cifar10"})
    assert code == 2 and "dataset.name" in err and "breast-cancer" in err
    assert "adrenalmnist3d" in err and "chestmnist" in err  # the whole family is allowed


FAMILY_CASES = [
    ("3D volumes of the wrong shape", "adrenalmnist3d", 28,
     lambda a: {"train_images": a["train_images"][:, :20]}, None, "(N, 28, 28, 28)"),
    ("2D images in a 3D subset", "adrenalmnist3d", 28,
     lambda a: {"test_images": a["test_images"][:, 0]}, None, "3D subset"),
    ("ChestMNIST labels not 14 wide", "chestmnist", 28,
     lambda a: {"train_labels": a["train_labels"][:, :13]}, None, "14 binary labels"),
    ("ChestMNIST labels that are not 0/1", "chestmnist", 28,
     lambda a: {"val_labels": a["val_labels"] * 2}, None, "other than 0 and 1"),
    ("a 2D model on 3D volumes", "adrenalmnist3d", 28, None, {"name": "convnet"},
     "convnet3d"),
    ("a 3D model on 2D images", "chestmnist", 28, None, {"name": "convnet3d"},
     "2D images"),
    ("a 3D subset at an unreleased size", "adrenalmnist3d", 128, None, None, "28 or 64"),
]


@pytest.mark.parametrize("label, flag, size, change, model, needle", FAMILY_CASES,
                         ids=[c[0] for c in FAMILY_CASES])
def test_medmnist_family_bad_input_exit_2_with_one_paragraph(capsys, tmp_path, label, flag,
                                                             size, change, model, needle):
    import numpy as np
    from fixtures import write_multilabel_npz, write_volume_npz

    if flag == "chestmnist":
        path = write_multilabel_npz(tmp_path, n_train=40, n_test=20)
    else:
        path = write_volume_npz(tmp_path, n_train=16, n_test=8, size=min(size, 64))
    if change is not None:
        arrays = dict(np.load(path))
        arrays.update(change(arrays))
        np.savez(path, **arrays)
    code, err = _run_with(capsys, tmp_path, {"name": flag, "root": str(tmp_path), "size": size,
                                             "verify_checksum": False},
                          model=model or {"name": "convnet3d" if flag.endswith("3d")
                                          else "convnet", "width": 4})
    assert code == 2 and needle in err, err
    assert "Traceback" not in err and err.startswith("error: ") and err.count("\n") == 1
    assert not list(tmp_path.glob("results*"))


def test_convnet_on_tabular_data_is_rejected(capsys, tmp_path):
    code, err = _run_with(capsys, tmp_path, {"name": "breast-cancer"},
                          model={"name": "convnet"})
    assert code == 2 and "tabular" in err


def test_impossible_partition_is_rejected_before_running(capsys, tmp_path):
    code, err = _run_with(capsys, tmp_path, {"name": "breast-cancer"},
                          partition={"scheme": "iid", "num_clients": 100, "min_size": 1,
                                     "samples_per_client": 10, "beta": 0.5})
    assert code == 2 and "samples_per_client" in err
    assert not list(tmp_path.glob("results*"))


def test_report_on_missing_path(capsys, tmp_path):
    assert main(["report", str(tmp_path / "none")]) == 2
    assert "does not exist" in capsys.readouterr().err


# ----- cases that once ended in a traceback -----
def test_duplicated_yaml_key_and_binary_config_exit_2(capsys, tmp_path):
    code, err = run_cli(capsys, tmp_path, "name: a\ntraining: {rounds: 3}\nname: b\n")
    assert code == 2 and "`name` twice (line 1 and line 3)" in err and "Traceback" not in err
    config = tmp_path / "binary.yaml"
    config.write_bytes(bytes(range(256)) * 4)
    code = main(["validate", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and "not a text file" in err and "Traceback" not in err


NPZ_CASES = [
    ("labels of another length", lambda a: {"train_labels": a["train_labels"][:-3]},
     "one label per image"),
    ("images of another size", lambda a: {"train_images": a["train_images"][:, :, :17]},
     "(N, 28, 28)"),
    ("three channels in a grey subset",
     lambda a: {"test_images": a["test_images"][..., None].repeat(3, axis=-1)}, "grey"),
    ("labels outside the classes", lambda a: {"train_labels": a["train_labels"] + 5},
     "2 classes"),
]


@pytest.mark.parametrize("label, change, needle", NPZ_CASES, ids=[c[0] for c in NPZ_CASES])
def test_hand_made_npz_that_does_not_fit_its_subset_exit_2(capsys, tmp_path, label, change,
                                                          needle):
    import numpy as np

    path = write_medmnist_npz(tmp_path, "pneumoniamnist", n_train=40, n_test=20)
    arrays = dict(np.load(path))
    arrays.update(change(arrays))
    np.savez(path, **arrays)
    code, err = _run_with(capsys, tmp_path, {"name": "pneumoniamnist", "root": str(tmp_path),
                                             "verify_checksum": False})
    assert code == 2 and needle in err and "does not fit" in err and "Traceback" not in err


def test_unwritable_output_exit_2_before_any_run_starts(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, err = run_cli(capsys, tmp_path, quickstart_raw(training={"rounds": 1}), "--output",
                        str(blocker / "results"), "--no-progress", command="run")
    assert code == 2 and "cannot be written" in err and "--output" in err
    assert "Traceback" not in err and not (tmp_path / "results").exists()


def test_more_gpus_per_worker_than_any_node_has_exit_2(ray_session, capsys, tmp_path):
    code, err = run_cli(capsys, tmp_path, quickstart_raw(engine={"gpus_per_worker": 2}),
                        "--no-progress", command="run")
    assert code == 2 and "could never be scheduled" in err


def test_checksums_of_unchanged_files_are_remembered_and_changed_files_read_again(
        tmp_path, monkeypatch):
    import hashlib
    import os

    from raysim.data import medmnist_io

    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "file.npz"
    path.write_bytes(b"first")
    assert medmnist_io._file_md5(path) == hashlib.md5(b"first").hexdigest()
    first, second = hashlib.md5(b"first").hexdigest(), hashlib.md5(b"second").hexdigest()
    reads = []
    original = hashlib.md5
    monkeypatch.setattr(medmnist_io.hashlib, "md5",
                        lambda *args, **kwargs: reads.append(1) or original(*args, **kwargs))
    assert medmnist_io._file_md5(path) == first
    assert reads == []  # the unchanged file was not read again
    path.write_bytes(b"second")  # a changed file (size and modification time) is read again
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))
    assert medmnist_io._file_md5(path) == second and reads == [1]


# ----- resume into the wrong directory -----
def test_validate_exits_2_on_a_present_but_broken_data_file_and_skips_an_absent_one(
        capsys, tmp_path):
    import numpy as np

    path = write_medmnist_npz(tmp_path, "pneumoniamnist", n_train=40, n_test=20)
    arrays = dict(np.load(path))
    arrays["train_labels"] = np.concatenate([arrays["train_labels"]] * 2)  # 80 labels, 40 images
    np.savez(path, **arrays)
    broken = quickstart_raw(dataset={"name": "pneumoniamnist", "root": str(tmp_path),
                                     "verify_checksum": False})
    code, err = run_cli(capsys, tmp_path, broken)
    assert code == 2 and "does not fit" in err and "Traceback" not in err
    absent = quickstart_raw(dataset={"name": "breastmnist", "root": str(tmp_path),
                                     "download": False})
    code, _ = run_cli(capsys, tmp_path, absent)
    assert code == 0  # an absent file is reported as not checked, not as an error


def test_resume_into_a_directory_that_is_not_a_run_root_exits_2_and_writes_nothing(
        capsys, tmp_path):
    stranger = tmp_path / "notes"
    stranger.mkdir()
    (stranger / "todo.txt").write_text("not a run")
    code, err = run_cli(capsys, tmp_path, quickstart_raw(training={"rounds": 1}),
                        "--no-progress", "--resume", str(stranger), command="run")
    assert code == 2 and "not a raysim run root" in err and "Traceback" not in err
    assert [p.name for p in stranger.iterdir()] == ["todo.txt"]


def test_resume_of_an_empty_directory_or_a_results_parent_exits_2_naming_the_run_root(
        capsys, tmp_path):
    raw = quickstart_raw(training={"rounds": 1})
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = run_cli(capsys, tmp_path, raw, "--no-progress", "--resume", str(empty),
                        command="run")
    assert code == 2 and "it is empty" in err and "Traceback" not in err
    assert not any(empty.iterdir())
    parent = tmp_path / "results"
    for stamp in ("20260101-100000", "20260101-110000"):  # two earlier run roots
        (parent / f"quickstart-{stamp}" / "seed_0").mkdir(parents=True)
        (parent / f"quickstart-{stamp}" / "seed_0" / "manifest.json").write_text(
            '{"status": "completed"}')  # the layout <parent>/<root>/seed_<s>/manifest.json
        (parent / f"quickstart-{stamp}" / "invocation.json").write_text("{}")
    before = sorted(parent.rglob("*"))
    code, err = run_cli(capsys, tmp_path, raw, "--no-progress", "--resume", str(parent),
                        command="run")
    assert code == 2 and "Traceback" not in err
    assert f"did you mean '{parent / 'quickstart-20260101-110000'}'?" in err
    assert sorted(parent.rglob("*")) == before  # nothing written into the parent


@pytest.mark.parametrize("algorithm", ["fedvck", "feddm", "mhpflid"])
def test_a_method_that_needs_images_on_a_tabular_set_is_one_message(capsys, tmp_path, algorithm):
    raw = quickstart_raw(algorithm={"name": algorithm})
    raw["model"] = {"name": "convnet"}  # whatever the model, the data kind is the mismatch
    code, err = run_cli(capsys, tmp_path, raw)
    assert code == 2 and "Traceback" not in err
    assert f"algorithm `{algorithm}` works on images" in err and "only" in err
    assert "breast-cancer" in err and "digits" in err and "fedavg" in err
    assert err.count("error:") == 1


def test_resume_with_another_seed_list_and_config_is_refused_whatever_the_seeds(
        capsys, tmp_path):
    """A root interrupted with seeds [0] is not continued by a config with seeds [2] and
    another learning rate: the stored run's config is compared even though no seed is shared,
    so two configs never end up in one root (and one experiment in ``raysim report``)."""
    import json

    from raysim.configuration.experiment import parse_config

    original = quickstart_raw(training={"rounds": 2}, seeds=[0])
    root = tmp_path / "results" / "quickstart-20260101-100000"
    (root / "seed_0").mkdir(parents=True)
    (root / "seed_0" / "manifest.json").write_text(json.dumps(
        {"config": parse_config(original).model_dump(mode="json"), "status": "interrupted"}))
    (root / "invocation.json").write_text("{}")
    before = sorted(root.rglob("*"))
    other = quickstart_raw(training={"rounds": 2, "optimizer": {"name": "sgd", "lr": 0.5}},
                           seeds=[2])
    code, err = run_cli(capsys, tmp_path, other, "--no-progress", "--resume", str(root),
                        command="run")
    assert code == 2 and "Traceback" not in err and "different config" in err, err
    assert "seeds" in err and "training" in err and err.count("error:") == 1
    assert sorted(root.rglob("*")) == before


class _RunsACommand:
    """A pickle whose loading runs a command (a crafted checkpoint)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("kind", ["earlier format", "crafted pickle"])
def test_resume_of_a_checkpoint_of_an_earlier_format_exits_2_before_anything_starts(
        capsys, tmp_path, kind):
    """A run interrupted under an earlier raysim left a pickled checkpoint, or a colleague's
    results directory holds a crafted one where the checkpoint belongs: --resume refuses it
    with one paragraph naming the file before Ray starts, reads no pickle (the crafted file's
    command never runs), and changes nothing in the run root."""
    import json
    import pickle

    from raysim.configuration.experiment import parse_config

    raw = quickstart_raw(training={"rounds": 2}, seeds=[0])
    root = tmp_path / "results" / "quickstart-20260101-100000"
    run_dir = root / "seed_0"
    (run_dir / "checkpoint").mkdir(parents=True)
    marker = tmp_path / "command-ran"
    manifest = {"status": "interrupted", "checkpoint_round": 1}
    if kind == "earlier format":
        checkpoint = run_dir / "checkpoint" / "latest.pt"
        checkpoint.write_bytes(b"an earlier layout")
        needle = "written by an earlier version of raysim"
    else:
        checkpoint = run_dir / "checkpoint" / "latest.npz"
        checkpoint.write_bytes(pickle.dumps(_RunsACommand(marker)))
        manifest["checkpoint_format"] = 3
        needle = "it is not a raysim state file"
    config = parse_config(raw).model_dump(mode="json")
    (run_dir / "manifest.json").write_text(json.dumps({"config": config, **manifest}))
    (root / "invocation.json").write_text("{}")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    code, err = run_cli(capsys, tmp_path, raw, "--no-progress", "--resume", str(root),
                        command="run")
    assert code == 2 and "Traceback" not in err, err
    assert needle in err and err.count("error:") == 1 and str(checkpoint) in err
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    assert not marker.exists()


@pytest.mark.parametrize("extra, needle", [(["--rounds", "1"], "--rounds 1"),
                                           (["--clients", "0"], "--clients 0")])
def test_an_estimate_that_cannot_measure_exits_2_before_starting(capsys, tmp_path, extra,
                                                                   needle):
    code, err = run_cli(capsys, tmp_path, quickstart_raw(), *extra, command="estimate")
    assert code == 2 and needle in err and "Traceback" not in err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_switching_a_model_or_method_by_name_starts_its_section_afresh():
    """`--set model.name=cnn` on an MLP config must not fail on the MLP's `hidden`; fields
    given beside the new name still apply, whichever order they come in."""
    from raysim.configuration.experiment import apply_overrides, parse_config

    raw = quickstart_raw(dataset={"name": "pneumoniamnist"}, model={"name": "mlp",
                                                                     "hidden": [32]},
                         algorithm={"name": "fedprox", "mu": 0.1})
    switched = apply_overrides(raw, ["model.channels=[8, 16]", "model.name=cnn",
                                     "algorithm.name=fedavg"])
    assert switched["model"] == {"channels": [8, 16], "name": "cnn"}
    assert switched["algorithm"] == {"name": "fedavg"}
    assert parse_config(switched).model.name == "cnn"
    assert apply_overrides(raw, ["model.name=mlp"])["model"] == raw["model"]  # same name: kept
