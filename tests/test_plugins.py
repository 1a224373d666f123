"""Plug-ins: a method, a model and a dataset from the user's own module (the example,
``experiments/plugins/fedtrim.py``) become config names everywhere a shipped one is, keep the
algorithm contract and the refusals, and run on Ray's workers like shipped ones; datasets from
a ``.npz`` file in MedMNIST's layout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from inprocess import check_contract, simulate

from raysim.configuration.experiment import parse_config
from raysim.errors import ConfigError

PLUGINS = Path(__file__).resolve().parents[1] / "experiments" / "plugins"


def moons_raw(**sections):
    """The example plug-in's config, small: 6 clients, 3 rounds, one seed."""
    raw = yaml.safe_load((PLUGINS / "fedtrim.yaml").read_text())
    raw.pop("variants")
    raw.update({"partition": {"scheme": "iid", "num_clients": 6}, "seeds": [0],
                "training": {"rounds": 3, "local_steps": 2, "batch_size": 16,
                             "optimizer": {"name": "sgd", "lr": 0.1}},
                "evaluation": {"every": 1}, **sections})
    return raw


def test_a_plugins_names_validate_and_keep_the_algorithm_contract():
    config = parse_config(moons_raw(), near=PLUGINS)
    assert (config.algorithm.name, config.model.name, config.dataset.name) == (
        "fedtrim", "bilinear", "moons")
    assert config.plugins == ["fedtrim"]
    check_contract(config)


def test_without_trimming_the_plugin_is_the_plain_mean_and_with_it_an_outlier_is_dropped():
    """The plug-in's mechanism: beta 0 is FedAvg's unweighted mean; beta > 0 moves away from
    it, towards the models' centre (one far-off model barely counts)."""
    trimmed = simulate(parse_config(moons_raw(algorithm={"name": "fedtrim", "beta": 0.2}),
                                    near=PLUGINS))
    plain = simulate(parse_config(moons_raw(algorithm={"name": "fedtrim", "beta": 0.0}),
                                  near=PLUGINS))
    fedavg = simulate(parse_config(moons_raw(algorithm={"name": "fedavg", "weighted": False}),
                                   near=PLUGINS))
    for key in fedavg.server_state:
        np.testing.assert_allclose(plain.server_state[key], fedavg.server_state[key],
                                   rtol=1e-5, atol=1e-6)
    assert any(not np.allclose(trimmed.server_state[key], fedavg.server_state[key])
               for key in fedavg.server_state)
    models = [{"w": np.array([0.0, 1.0])}, {"w": np.array([1.0, 2.0])},
              {"w": np.array([2.0, 3.0])}, {"w": np.array([100.0, -100.0])}]
    algorithm = type(trimmed.algorithm)(parse_config(
        moons_raw(algorithm={"name": "fedtrim", "beta": 0.25}), near=PLUGINS).algorithm,
        trimmed.algorithm.context)
    merged = algorithm.aggregate({"w": np.zeros(2)}, [models[:2], models[2:]], 0)
    np.testing.assert_allclose(merged["w"], [1.5, 1.5])  # the outlier and one extreme dropped


def test_a_misspelt_plugin_name_is_suggested_and_refusals_hold():
    with pytest.raises(ConfigError, match=r"fedtirm.*allowed names: .*'fedtrim'") as error:
        parse_config(moons_raw(algorithm={"name": "fedtirm"}), near=PLUGINS)
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=r"`algorithm.betta`.*did you mean `beta`"):
        parse_config(moons_raw(algorithm={"name": "fedtrim", "betta": 0.1}), near=PLUGINS)
    from raysim.layers.client_dp import check as check_privacy

    private = parse_config(moons_raw(privacy={"clip": 1.0, "noise_multiplier": 1.0}),
                           near=PLUGINS)
    with pytest.raises(ConfigError, match="trimmed mean of the clients' models"):
        check_privacy(private)


def test_a_missing_or_broken_plugin_module_is_one_paragraph(tmp_path):
    with pytest.raises(ConfigError, match=r"Cannot import the plug-in module 'no_such_lab.fedfoo'"
                       r".*PYTHONPATH") as error:
        parse_config(moons_raw(plugins=["no_such_lab.fedfoo"]), near=tmp_path)
    assert "\n" not in str(error.value)
    (tmp_path / "broken_plugin.py").write_text("import nonexistent_dependency_xyz\n")
    with pytest.raises(ConfigError, match=r"'broken_plugin' failed while being imported: "
                       r"ModuleNotFoundError.*nonexistent_dependency_xyz"):
        parse_config(moons_raw(plugins=["broken_plugin"]), near=tmp_path)
    with pytest.raises(ConfigError, match="dotted module name"):
        parse_config(moons_raw(plugins=["plugins/fedtrim.py"]), near=tmp_path)


def test_a_plugin_cannot_take_a_shipped_name(tmp_path):
    (tmp_path / "clash_plugin.py").write_text(
        "from typing import Literal\n"
        "from raysim.algorithms.base import register_algorithm\n"
        "from raysim.algorithms.fedavg import FedAvg\n"
        "from raysim.configuration.schema import StrictModel\n"
        "class P(StrictModel):\n    name: Literal['fedavg'] = 'fedavg'\n"
        "@register_algorithm\nclass Clash(FedAvg):\n    params_class = P\n")
    with pytest.raises(ConfigError, match=r"'fedavg' of clash_plugin\.Clash is taken by "
                       r"raysim\.algorithms\.fedavg\.FedAvg"):
        parse_config(moons_raw(plugins=["clash_plugin"]), near=tmp_path)


def test_a_dataset_from_an_npz_file_in_medmnists_layout(tmp_path):
    from raysim.data import load_dataset, make_partition

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "scans.npz",
             train_images=rng.integers(0, 255, (40, 12, 12), dtype=np.uint8),
             train_labels=rng.integers(0, 3, (40, 1)),
             test_images=rng.integers(0, 255, (10, 12, 12), dtype=np.uint8),
             test_labels=rng.integers(0, 3, (10, 1)))
    raw = moons_raw(dataset={"name": "my-scans", "path": "scans.npz"},
                    model={"name": "cnn"}, algorithm={"name": "fedavg"})
    config = parse_config(raw, near=PLUGINS)
    dataset = load_dataset(config.dataset, str(tmp_path))
    assert dataset.info.kind == "image" and dataset.info.input_shape == (1, 12, 12)
    assert dataset.info.num_classes == 3 and dataset.train_y.shape == (40,)
    partition = make_partition(dataset.train_y, dataset.test_y, config.partition, 3, 0)
    assert sum(len(indices) for indices in partition.train) == 40
    simulate(config.model_copy(update={"dataset": config.dataset.model_copy(
        update={"path": str(tmp_path / "scans.npz")})}))
    with pytest.raises(ConfigError, match=r"`dataset.path` = 'missing.npz': no file"):
        load_dataset(config.dataset.model_copy(update={"path": "missing.npz"}), str(tmp_path))


def test_the_command_line_imports_a_plugin_beside_the_config(tmp_path):
    """``--plugin`` with the module beside the config (a config that does not list it):
    ``raysim validate`` knows its names. (Ray's workers import it in tests/test_cluster.py.)"""
    shutil.copy(PLUGINS / "fedtrim.py", tmp_path / "fedtrim.py")
    raw = moons_raw()
    raw.pop("plugins")
    config_path = tmp_path / "moons.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "raysim.cli", "validate", str(config_path)]
    refused = subprocess.run(command, cwd=tmp_path.parent, env=environment,
                             capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2 and "fedtrim" in refused.stderr
    done = subprocess.run([*command, "--plugin", "fedtrim"], cwd=tmp_path.parent,
                          env=environment, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "valid (fedtrim on moons" in done.stdout


def test_a_dataset_from_a_folder_of_images_per_class(tmp_path):
    from PIL import Image

    from raysim.data import load_dataset

    rng = np.random.default_rng(1)
    for split, count in (("train", 6), ("test", 2)):
        for name in ("normal", "tumour"):
            folder = tmp_path / "scans" / split / name
            folder.mkdir(parents=True)
            for k in range(count):
                Image.fromarray(rng.integers(0, 255, (10, 10), dtype=np.uint8)).save(
                    folder / f"{k}.png")
    raw = moons_raw(dataset={"name": "scan-folders", "path": "scans"}, model={"name": "cnn"},
                    algorithm={"name": "fedavg"}, partition={"scheme": "iid", "num_clients": 3})
    config = parse_config(raw, near=PLUGINS)
    dataset = load_dataset(config.dataset, str(tmp_path))
    assert dataset.info.input_shape == (1, 10, 10) and dataset.info.task == "binary-class"
    assert dataset.info.label_names == ("normal", "tumour")
    assert dataset.train_x.shape == (12, 10, 10) and sorted(set(dataset.test_y)) == [0, 1]
    Image.fromarray(np.zeros((12, 12), dtype=np.uint8)).save(
        tmp_path / "scans" / "test" / "normal" / "odd.png")
    with pytest.raises(ConfigError, match="2 different sizes"):
        load_dataset(config.dataset, str(tmp_path))


def _fednova_raw(**sections):
    raw = yaml.safe_load((PLUGINS / "fednova.yaml").read_text())
    raw.pop("variants")
    raw.update({"seeds": [0], "training": {"rounds": 3, "local_epochs": 1, "batch_size": 8,
                                           "optimizer": {"name": "sgd", "lr": 0.05}},
                "evaluation": {"every": 1}, **sections})
    return raw


def test_the_worked_fednova_keeps_the_contract_and_normalises_by_steps():
    """docs/plugins.md's worked example: with equal local steps (an IID split of equal
    shares) FedNova is FedAvg; with steps that differ (quantity skew) the normalisation moves
    the model elsewhere. Its refusals are its own."""
    equal = {"partition": {"scheme": "iid", "num_clients": 5}}
    config = parse_config(_fednova_raw(**equal), near=PLUGINS)
    check_contract(config)
    nova = simulate(config)
    fedavg = simulate(parse_config(_fednova_raw(**equal, algorithm={"name": "fedavg"}),
                                   near=PLUGINS))
    for key in fedavg.server_state:
        np.testing.assert_allclose(nova.server_state[key], fedavg.server_state[key],
                                   rtol=1e-4, atol=1e-6)
    skewed = simulate(parse_config(_fednova_raw(), near=PLUGINS))
    skewed_fedavg = simulate(parse_config(_fednova_raw(algorithm={"name": "fedavg"}),
                                          near=PLUGINS))
    assert any(not np.allclose(skewed.server_state[key], skewed_fedavg.server_state[key],
                               rtol=1e-3, atol=1e-5) for key in skewed_fedavg.server_state)
    with pytest.raises(ConfigError, match="normalised updates"):
        from raysim.preparation import prepare

        prepare(parse_config(_fednova_raw(privacy={"clip": 1.0, "noise_multiplier": 1.0}),
                             near=PLUGINS), None)
