"""`raysim estimate --stand-in-data` beyond MedMNIST: missing segmentation sites and folders of
recordings replaced by generated files of their public set's layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fixtures import write_segmentation_sites

from raysim.configuration.experiment import parse_config
from raysim.data import load_dataset, public_layouts
from raysim.data.public_layouts import RecordingLayout, recording_layout, site_layout
from raysim.errors import DataError
from raysim.estimator.estimate import measure
from raysim.estimator.stand_in import stand_in_data


def polyp_config(real_site: Path, **dataset) -> dict:
    """Two sites: one whose folder is at hand, one (ETIS-LaribPolypDB's) whose folder is not."""
    return {"name": "stand-in", "dataset": {
        "name": "polyp", "resize": 16, "sites": [
            {"name": "discs", "path": str(real_site)},
            {"name": "etis_larib", "path": "polyp_etis_larib"}], **dataset},
        "partition": {"scheme": "sites", "num_clients": 2},
        "model": {"name": "unet", "channels": [4, 8]}, "algorithm": {"name": "fedavg"},
        "training": {"rounds": 10, "batch_size": 8, "loss": "dice_ce",
                     "optimizer": {"name": "sgd", "lr": 0.05}},
        "evaluation": {"every": 0}, "seeds": [0]}


@pytest.fixture(scope="module")
def real_site(tmp_path_factory) -> Path:
    return write_segmentation_sites(tmp_path_factory.mktemp("sites"), sites=1, images=10,
                                    size=16)[0]


def test_the_tables_hold_the_public_sets_sizes():
    assert site_layout("Kvasir-SEG").images == 1000 and site_layout("kvasir").images == 1000
    assert site_layout("cvc_clinicdb").images == 612 and site_layout("ETIS").images == 196
    assert site_layout("site0") is None
    assert recording_layout("sleep-edf-30s") == RecordingLayout(
        recording_layout("sleep-edf-30s").set_name, subjects=20, nights=2, epochs=42_308,
        length=3_000)
    assert recording_layout("sleep-edf") is None  # (5-s epochs: not a public layout)


def test_a_missing_site_is_stood_in_for_by_as_many_images_as_its_set_holds(real_site, tmp_path):
    config = parse_config(polyp_config(real_site))
    generated = stand_in_data(config, str(tmp_path / "empty"), tmp_path / "scratch")
    assert generated is not None
    real, stood_in = generated.dataset.sites
    assert real.path == str(real_site.resolve())  # the folder at hand is read as it is
    assert len(list(Path(stood_in.path, "images").iterdir())) == 196
    dataset = load_dataset(generated.dataset)
    assert len(dataset.train_y) + len(dataset.test_y) == 10 + 196
    assert dataset.train_x.shape[1:] == (16, 16, 3) and set(np.unique(dataset.train_y)) == {0, 1}
    written = Path(stood_in.path).stat().st_mtime_ns
    again = stand_in_data(config, str(tmp_path / "empty"), tmp_path / "other")
    assert again is not None and again.dataset.sites[1].path == stood_in.path  # written once
    assert Path(stood_in.path).stat().st_mtime_ns == written
    assert stand_in_data(config, str(real_site.parent), tmp_path / "scratch") is not None
    whole = parse_config(polyp_config(real_site, sites=[{"name": "a", "path": str(real_site)}]))
    assert stand_in_data(whole, None, tmp_path / "scratch") is None  # every folder at hand


def test_a_missing_site_of_a_set_raysim_does_not_know_is_refused(real_site, tmp_path):
    raw = polyp_config(real_site)
    raw["dataset"]["sites"][1] = {"name": "hospital_b", "path": "hospital_b"}
    with pytest.raises(DataError) as refused:
        stand_in_data(parse_config(raw), str(tmp_path), tmp_path / "scratch")
    message = str(refused.value)
    assert "site 'hospital_b'" in message and str(tmp_path / "hospital_b") in message
    assert "Kvasir-SEG" in message and "--data-root" in message and "Sleep-EDF-20" in message


def test_missing_recordings_are_stood_in_for_by_their_sets_layout(tmp_path, monkeypatch):
    small = RecordingLayout("Sleep-EDF-20", subjects=6, nights=2, epochs=118, length=300)
    monkeypatch.setitem(public_layouts.RECORDING_LAYOUTS, "sleepedf20", small)
    raw = {"name": "sleep", "dataset": {"name": "Sleep-EDF-20", "path": "sleep_edf_30s",
                                        "test_subjects": 2, "public_subjects": 1},
           "partition": {"scheme": "subjects", "num_clients": 3},
           "model": {"name": "tcn", "channels": 8, "levels": 2},
           "algorithm": {"name": "fedavg"}, "training": {"rounds": 2}, "seeds": [0]}
    generated = stand_in_data(parse_config(raw), str(tmp_path), tmp_path / "scratch")
    assert generated is not None
    assert len(list(Path(generated.dataset.path).glob("SC4*.npz"))) == 12  # 6 subjects x 2
    dataset = load_dataset(generated.dataset)
    held = len(dataset.train_y) + len(dataset.test_y) + len(dataset.public_y)
    assert held == 12 * 10 and dataset.train_x.shape[1:] == (1, 300)  # ceil(118 / 12) each
    assert dataset.info.num_classes == 5
    raw["dataset"]["name"] = "my-recordings"
    with pytest.raises(DataError, match="dataset 'my-recordings'"):
        stand_in_data(parse_config(raw), str(tmp_path), tmp_path / "scratch")


def test_a_sliced_probe_runs_on_a_stood_in_site(ray_session, real_site, tmp_path):
    """The slice of two clients is drawn from the stood-in sites, not from the missing folder."""
    raw = polyp_config(real_site)
    raw["partition"] = {"scheme": "sites", "num_clients": 4, "clients_per_site": 2}
    probes, _, _ = measure({"": parse_config(raw)}, rounds=2, data_root=str(tmp_path),
                           clients=2, stand_in=True)
    assert probes[""].refused is None and probes[""].stand_in and probes[""].round_s > 0
    assert probes[""].clients == 2


def test_a_slice_of_site_clients_keeps_every_site_and_refuses_an_uneven_count(real_site):
    from raysim.errors import ConfigError
    from raysim.estimator.estimate import sliced

    raw = polyp_config(real_site, sites=[{"name": "a", "path": str(real_site)},
                                         {"name": "b", "path": str(real_site)}])
    raw["partition"] = {"scheme": "sites", "num_clients": 6, "clients_per_site": [2, 4]}
    probe, _, _ = sliced(parse_config(raw), 4, None)
    assert (probe.partition.num_clients, probe.partition.clients_per_site) == (4, 2)
    with pytest.raises(ConfigError, match="multiple of 2"):
        sliced(parse_config(raw), 3, None)


def test_the_cli_refuses_an_unknown_missing_site_before_anything_starts(real_site, tmp_path,
                                                                       capsys, monkeypatch):
    from test_bad_input import run_cli

    from raysim.engine import invocation

    def no_ray(*args, **kwargs):
        raise AssertionError("a Ray was started")

    monkeypatch.setattr(invocation, "ray_for", no_ray)
    raw = polyp_config(real_site)
    raw["dataset"]["sites"][1] = {"name": "hospital_b", "path": "hospital_b"}
    code, err = run_cli(capsys, tmp_path, raw, "--stand-in-data", "--data-root",
                        str(tmp_path), command="estimate")
    assert code == 2 and "Traceback" not in err and "site 'hospital_b'" in err
    assert "a Ray was started" not in err  # refused before one started


def test_a_data_slice_is_extended_to_the_whole_split_of_the_stand_in(ray_session, real_site,
                                                                      tmp_path,
                                                                      monkeypatch):
    """--extrapolate dataset.train_subset=LOW,HIGH extends to the stood-in sites' training
    images when the real folders are not at hand (not to a folder that is missing)."""
    from raysim.estimator import estimate
    from raysim.estimator.extrapolation import Extrapolation

    probed: list[int | None] = []

    def probe(label, config, rounds, *args, **kwargs):
        probed.append(config.dataset.train_subset)
        return estimate.Probe(rounds, 1.0 + (config.dataset.train_subset or 0), 0.0, 1.0)

    monkeypatch.setattr(estimate, "_probe", probe)
    config = parse_config(polyp_config(real_site))
    probes, _, _ = measure({"": config}, rounds=2, data_root=str(tmp_path), stand_in=True,
                           extrapolation=Extrapolation.parse("dataset.train_subset=4,8"))
    whole = len(load_dataset(stand_in_data(config, str(tmp_path), tmp_path).dataset).train_y)
    assert probed == [4, 8] and whole > 8
    assert probes[""].round_s == pytest.approx(1.0 + whole)  # the line through 5 and 9


def test_without_the_option_missing_sites_are_named_with_the_remedy_before_ray(real_site,
                                                                               tmp_path,
                                                                               capsys):
    from test_bad_input import run_cli

    code, err = run_cli(capsys, tmp_path, polyp_config(real_site), "--data-root",
                        str(tmp_path), command="estimate")
    assert code == 2 and "Traceback" not in err
    assert f"site 'etis_larib': nothing at {tmp_path / 'polyp_etis_larib'}" in err
    assert "add --stand-in-data" in err and "site 'discs'" not in err  # (that one is there)
    raw = polyp_config(real_site)
    raw["dataset"]["sites"][1] = {"name": "hospital_b", "path": "hospital_b"}
    code, err = run_cli(capsys, tmp_path, raw, "--data-root", str(tmp_path),
                        command="estimate")
    assert code == 2 and "cannot stand in for site 'hospital_b'" in err
