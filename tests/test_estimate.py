"""`raysim estimate`: a whole config's wall time and device-hours, projected from a few rounds
measured here."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import quickstart_raw
from fixtures import write_recordings

from raysim.configuration.experiment import parse_config
from raysim.estimator.estimate import Probe, evaluations, makespan, measure, project

PAPER_CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "feddc" / "pneumonia_paper.yaml"


def test_runs_are_scheduled_in_order_on_the_slots_that_free_first():
    assert makespan([10, 10, 10], 1) == 30
    assert makespan([10, 10, 10], 2) == 20
    assert makespan([10, 1, 1, 1], 2) == 10  # the short runs take the free slot in turn
    assert makespan([], 3) == 0


def test_a_run_evaluates_every_k_rounds_and_after_the_last():
    config = parse_config(quickstart_raw(training={"rounds": 10}, evaluation={"every": 4}))
    assert evaluations(config) == 3  # rounds 3, 7 and 9
    assert evaluations(config.model_copy(update={
        "evaluation": config.evaluation.model_copy(update={"every": 0})})) == 0


def test_the_projection_counts_every_seed_and_variant():
    fast = parse_config(quickstart_raw(training={"rounds": 100}, evaluation={"every": 50},
                                       seeds=[0, 1, 2]))
    slow = fast.model_copy(update={"seeds": [0, 1]})
    probes = {"fast": Probe(3, 0.5, 2.0, 4.0), "slow": Probe(3, 1.0, 2.0, 4.0)}
    estimate = project({"fast": fast, "slow": slow}, probes, concurrent_runs=2,
                       uses_gpus=False)
    fast_run, slow_run = 100 * 0.5 + 2 * 2.0, 100 * 1.0 + 2 * 2.0
    assert [c.run_s for c in estimate.variants] == [fast_run, slow_run]
    assert estimate.wall_s == pytest.approx(4.0 + makespan([fast_run] * 3 + [slow_run] * 2, 2))
    cpus = fast.engine.num_workers * fast.engine.cpus_per_worker
    assert estimate.device_hours == pytest.approx((3 * fast_run + 2 * slow_run) * cpus / 3600)
    assert estimate.device == "CPU"


def test_a_probe_measures_steady_rounds_of_the_first_seed(ray_session, capsys):
    config = parse_config(quickstart_raw(training={"rounds": 40}, seeds=[0, 1, 2]))
    probes, concurrent, gpus = measure({"": config}, rounds=3, data_root=None)
    assert "probed quickstart (1 of 1)" in capsys.readouterr().err  # said as each probe ends
    probe = probes[""]
    assert probe.rounds == 3 and probe.round_s > 0 and probe.evaluation_s >= 0
    assert concurrent >= 1 and gpus is False
    traffic = probe.traffic  # the probe counted its hand-offs (for a cluster projection)
    assert traffic is not None and traffic.broadcast_bytes > 0 and traffic.sum_bytes_per_root > 0
    assert traffic.client_samples is not None and len(traffic.client_samples) == 10
    estimate = project({"": config}, probes, concurrent, gpus)
    assert estimate.variants[0].runs == 3
    assert estimate.variants[0].run_s >= 40 * probe.round_s


def test_the_estimate_as_csv_rows_holds_each_variant_and_the_whole_projection():
    from raysim.estimator.estimate import table_rows

    config = parse_config(quickstart_raw(training={"rounds": 100}, evaluation={"every": 50},
                                         seeds=[0, 1]))
    estimate = project({"a": config, "b": config}, {"a": Probe(3, 0.5, 2.0, 4.0),
                                                    "b": Probe(3, 1.5, 2.0, 4.0)},
                       concurrent_runs=1, uses_gpus=False)
    rows = table_rows(estimate, "a machine")
    assert [row["variant"] for row in rows] == ["a", "b"]
    assert rows[1]["run_hours"] == round((100 * 1.5 + 2 * 2.0) / 3600, 3)
    assert {row["all_runs_wall_hours"] for row in rows} == {round(estimate.wall_s / 3600, 3)}
    assert rows[0]["machine"] == "a machine" and rows[0]["runs"] == 2


def test_a_slice_trains_fewer_clients_and_scales_its_rounds_back_up():
    from raysim.estimator.estimate import sliced

    every = parse_config(quickstart_raw(partition={"scheme": "iid", "num_clients": 150,
                                                   "samples_per_client": 2},
                                        evaluation={"clients": False},
                                        engine={"num_workers": 2}))
    probe, round_scale, evaluation_scale = sliced(every, 4)
    assert probe.partition.num_clients == 4 and probe.clients_per_round == 4
    assert round_scale == 75 / 2 and evaluation_scale == 1.0  # ceil(150/2) / ceil(4/2)
    sampling = parse_config(quickstart_raw(training={"clients_per_round": 50},
                                           partition={"num_clients": 60},
                                           evaluation={"clients": True},
                                           engine={"num_workers": 4}))
    probe, round_scale, evaluation_scale = sliced(sampling, 5)
    assert probe.partition.num_clients == 60 and probe.training.clients_per_round == 5
    assert round_scale == evaluation_scale == 13 / 2  # every client's model evaluated too
    assert sliced(sampling, 50)[1:] == (1.0, 1.0) and sliced(sampling, None)[0] is sampling
    # a scheme that splits the whole training set: K clients get K / C of it (the quickstart's
    # 10 Dirichlet clients share breast-cancer's 455 training rows)
    split = parse_config(quickstart_raw())
    probe = sliced(split, 2)[0]
    assert probe.partition.num_clients == 2 and probe.dataset.train_subset == 91


def test_a_sliced_probe_projects_the_configs_rounds():
    config = parse_config(quickstart_raw(training={"rounds": 100}, evaluation={"every": 50}))
    whole = project({"": config}, {"": Probe(3, 0.5, 2.0, 4.0)}, 1, False).variants[0]
    scaled = project({"": config}, {"": Probe(3, 0.5, 2.0, 4.0, round_scale=4.0,
                                              evaluation_scale=2.0, clients=3)},
                     1, False).variants[0]
    assert whole.run_s == 100 * 0.5 + 2 * 2.0 and scaled.run_s == 100 * 2.0 + 2 * 4.0


def test_a_missing_medmnist_file_is_stood_in_for_by_one_of_its_layout(tmp_path):
    import numpy as np

    from raysim.estimator.stand_in import stand_in_data

    config = parse_config(quickstart_raw(dataset={"name": "breastmnist", "size": 64}))
    generated = stand_in_data(config, str(tmp_path / "empty"), tmp_path / "scratch")
    assert generated is not None and not generated.dataset.verify_checksum
    arrays = np.load(f"{generated.dataset.root}/breastmnist_64.npz")
    assert arrays["train_images"].shape == (546, 64, 64)  # MedMNIST's official split sizes
    assert len(arrays["val_images"]) == 78 and len(arrays["test_images"]) == 156
    assert stand_in_data(config, generated.dataset.root, tmp_path / "scratch") is None
    builtin = parse_config(quickstart_raw())
    assert stand_in_data(builtin, str(tmp_path / "empty"), tmp_path / "scratch") is None


def test_a_probe_runs_on_the_stand_in_when_the_file_is_missing(ray_session, tmp_path):
    config = parse_config(quickstart_raw(dataset={"name": "breastmnist"},
                                         training={"rounds": 20}))
    probes, _, _ = measure({"": config}, rounds=2, data_root=str(tmp_path), clients=4,
                           stand_in=True)
    assert probes[""].stand_in and probes[""].clients == 4 and probes[""].round_s > 0
    assert list(tmp_path.iterdir()) == []  # the stand-in lives in the probe's scratch


def test_a_variant_that_cannot_be_probed_is_named_and_left_out(ray_session, capsys):
    """A slice of one client leaves FedSM, which needs two, unprobeable; FedAvg is probed."""
    from raysim.estimator.estimate import describe

    plain = parse_config(quickstart_raw(training={"rounds": 20}))
    fedsm = parse_config(quickstart_raw(training={"rounds": 20}, algorithm={"name": "fedsm"}))
    configs = {"fedavg": plain, "fedsm": fedsm}
    probes, concurrent, gpus = measure(configs, rounds=2, data_root=None, clients=1)
    assert probes["fedsm"].refused and "at least 2 clients" in probes["fedsm"].refused
    assert "not probed fedsm" in capsys.readouterr().err
    estimate = project(configs, probes, concurrent, gpus)
    assert [cost.label for cost in estimate.variants] == ["fedavg"]
    assert "not in the projection: fedsm" in describe(estimate, "here")


def test_fedsm_extra_is_probed_for_each_kind_of_round(ray_session, capsys):
    """Its 5 selector rounds follow 15 main rounds: the probe runs 2 of each, and a round's
    seconds are the two kinds' weighted 15 to 5."""
    from raysim.estimator.estimate import phased, table_rows

    extra = parse_config(quickstart_raw(
        training={"rounds": 20},
        algorithm={"name": "fedsm", "variant": "extra", "extra_rounds": 5}))
    probe_config = phased(extra, "algorithm.extra_rounds", 2)
    assert probe_config.training.rounds == 4 and probe_config.algorithm.extra_rounds == 2
    probes, concurrent, gpus = measure({"fedsm_extra": extra}, rounds=2, data_root=None)
    probe = probes["fedsm_extra"]
    assert probe.refused is None and probe.rounds == 4 and probe.round_s > 0
    main, tail = (float(part.split(" s per round")[0]) for part in probe.phases.split(", "))
    assert probe.round_s == pytest.approx((15 * main + 5 * tail) / 20, abs=1e-3)  # (3 decimals)
    assert "of its first 15" in probe.phases and "of its last 5" in probe.phases
    assert "(" + probe.phases + ")" in capsys.readouterr().err
    row = table_rows(project({"fedsm_extra": extra}, probes, concurrent, gpus), "here")[0]
    assert row["phases"] == probe.phases and row["rounds"] == 20


def test_a_paper_scale_engine_is_fitted_to_a_small_machine_and_said_so():
    from raysim.configuration.experiment import load_experiments
    from raysim.estimator.estimate import fit_to_machine

    experiments = load_experiments(str(PAPER_CONFIG), [])
    fitted, notice = fit_to_machine(experiments, 2)
    engine = fitted["feddc"].engine
    assert (engine.num_workers, engine.cpus_per_worker) == (2, 1.0)
    assert engine.gpus_per_worker == experiments["feddc"].engine.gpus_per_worker
    assert notice is not None and "8 x 2" in notice and "engine.num_workers=2" in notice
    assert fit_to_machine(experiments, 16) == (experiments, None)


TWO_CPU_ESTIMATE = """
import os, sys
os.cpu_count = lambda: 2  # a 2-CPU machine, whatever this one has
from raysim.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_readmes_estimate_runs_on_a_two_cpu_machine(tmp_path):
    """The README's command on the paper-scale config, here on one variant, a slice, the
    stand-in data and 28 px images (the whole config takes minutes on 2 CPUs), in a process
    of its own (it starts and stops a Ray of its own)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", TWO_CPU_ESTIMATE, "estimate", str(PAPER_CONFIG), "--data-root",
         str(tmp_path), "--variant", "fedavg_b10", "--rounds", "2", "--clients", "2",
         "--stand-in-data", "--set", "dataset.size=28", "--nodes", "1", "4",
         "--gpus-per-node", "8", "--link-gbps", "10", "100", "--cluster-csv",
         str(tmp_path / "cluster.csv")], capture_output=True, text=True,
        timeout=600, cwd=tmp_path, env={**os.environ, "RAYSIM_CPU_SLOTS": "off"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "engine.num_workers=2" in done.stderr and "projected wall time" in done.stdout
    assert "on the cluster:" in done.stdout
    cluster = pd.read_csv(tmp_path / "cluster.csv")
    assert list(zip(cluster["nodes"], cluster["link_gbps"], strict=True)) == [
        (1, 10), (1, 100), (4, 10), (4, 100)]
    one, four = cluster.iloc[0], cluster.iloc[2]
    assert one["broadcast_s"] == one["partials_s"] == 0  # nothing leaves a single node
    assert four["compute_s"] < one["compute_s"] and four["gpu_hours"] > one["gpu_hours"]
    assert "no partials in the probe: fedavg_b10" in done.stdout  # b=10 beyond 2 rounds


def test_an_interrupted_estimate_projects_the_variants_it_probed(monkeypatch, capsys):
    from raysim.estimator import estimate

    calls = []

    def probe_then_interrupt(configs, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return [SimpleNamespace(error=None, run_dir=None)]

    table = pd.DataFrame({"wall_time": [1.0, 1.5, 2.0], "seconds_evaluate": [0.1, 0.1, 0.1]})
    monkeypatch.setattr("raysim.engine.invocation.run_experiments", probe_then_interrupt)
    monkeypatch.setattr("raysim.results.load",
                        lambda run_dir, name="rounds": table if name == "rounds" else
                        pd.DataFrame())
    monkeypatch.setattr("raysim.engine.invocation.concurrent_runs", lambda configs: 1)
    monkeypatch.setattr("raysim.engine.invocation.uses_gpus", lambda config: False)
    from raysim.configuration.experiment import load_experiments

    experiments = load_experiments(str(PAPER_CONFIG), [])
    probes, _, _ = estimate.measure(experiments, 3, None)
    assert probes["feddc"].refused is None
    assert all(probes[label].refused == "interrupted before its probe ended"
               for label in experiments if label != "feddc")
    assert (f"interrupted: projecting the 1 of {len(experiments)} variants probed"
            in capsys.readouterr().err)
    assert estimate.project(experiments, probes, 1, False).variants[0].label == "feddc"


def test_an_extrapolation_extends_the_line_through_two_probes_to_the_configs_value():
    from raysim.estimator.estimate import extended, own_value, train_size
    from raysim.estimator.extrapolation import Extrapolation

    line = Extrapolation.parse("algorithm.iterations=10,20")
    config = parse_config(quickstart_raw(algorithm={"name": "fedvck", "iterations": 5000},
                                         dataset={"name": "digits"},
                                         model={"name": "convnet", "width": 8, "depth": 2}))
    assert own_value(line, config) == 5000
    assert line.at(config, 10).algorithm.iterations == 10  # an int where the config's is one
    low, high = Probe(2, 3.0, 1.0, 5.0), Probe(2, 5.0, 1.0, 7.0)
    probe = extended(line, low, high, 5000)
    assert probe.round_s == pytest.approx(3.0 + 0.2 * (5000 - 10))  # 1 + 0.2 s/iteration
    assert probe.evaluation_s == 1.0 and probe.startup_s == 5.0
    assert "3.000 s per round at 10" in probe.extrapolated
    noisy = extended(line, Probe(2, 5.0, 2.0, 5.0), Probe(2, 4.0, 1.0, 5.0), 5000)
    assert noisy.round_s == 5.0 and noisy.evaluation_s == 2.0  # never below a measurement
    fedavg = parse_config(quickstart_raw())
    assert own_value(line, fedavg) is None  # no such key: probed as it is
    data = Extrapolation.parse("dataset.train_subset=40,80")
    assert own_value(data, fedavg) == train_size(fedavg) > 40  # unset: the whole split
    assert data.at(fedavg, 40).dataset.train_subset == 40


def test_the_whole_split_of_a_users_dataset_is_read_under_the_data_root(tmp_path):
    from raysim.estimator.estimate import own_value, train_size
    from raysim.estimator.extrapolation import Extrapolation

    write_recordings(tmp_path / "sleep", subjects=4, nights=1, epochs=10)
    raw = quickstart_raw(dataset={"name": "gen-sleep", "path": "sleep", "test_subjects": 1},
                         model={"name": "tcn", "channels": 4, "levels": 1})
    config = parse_config(raw)
    assert train_size(config, str(tmp_path)) == 30  # three subjects of 10 epochs train
    data = Extrapolation.parse("dataset.train_subset=4,8")
    assert own_value(data, config, str(tmp_path)) == 30


def test_the_training_split_of_sites_folders_is_counted_for_an_extrapolation(tmp_path):
    from fixtures import write_segmentation_sites

    from raysim.data import load_dataset
    from raysim.estimator.estimate import train_size

    write_segmentation_sites(tmp_path / "sites", sites=2, images=10, size=24)
    raw = quickstart_raw(
        dataset={"name": "discs", "resize": 16, "sites": [
            {"name": "site0", "path": "sites/site0"}, {"name": "site1", "path": "sites/site1"}]},
        partition={"scheme": "sites", "num_clients": 2},
        model={"name": "unet", "channels": [4, 8]}, training={"loss": "dice_ce"})
    config = parse_config(raw)
    expected = len(load_dataset(config.dataset, str(tmp_path)).train_y)
    assert 0 < expected < 20 and train_size(config, str(tmp_path)) == expected


@pytest.mark.parametrize("text", ["iterations=10,20", "algorithm.iterations=20,10",
                                  "algorithm.iterations=10", "algorithm.iterations",
                                  "algorithm.iterations=0,5", "algorithm.iterations=a,b"])
def test_a_bad_extrapolation_is_refused_in_one_paragraph(text):
    from raysim.errors import RaysimError
    from raysim.estimator.extrapolation import Extrapolation

    with pytest.raises(RaysimError, match="expected KEY=LOW,HIGH"):
        Extrapolation.parse(text)


def test_an_extrapolated_variant_is_probed_at_both_values_and_the_rest_as_they_are(
        ray_session, capsys):
    from raysim.estimator.estimate import describe
    from raysim.estimator.extrapolation import Extrapolation

    configs = {"long": parse_config(quickstart_raw(training={"rounds": 20})),
               "fedvck": parse_config(quickstart_raw(
                   training={"rounds": 20}, dataset={"name": "digits"},
                   algorithm={"name": "fedvck", "iterations": 3, "real_per_class": 8,
                              "server_epochs": 1, "server_batch_size": 16},
                   model={"name": "convnet", "width": 8, "depth": 2}))}
    line = Extrapolation.parse("algorithm.iterations=2,4")
    probes, concurrent, gpus = measure(configs, rounds=2, data_root=None, extrapolation=line)
    assert probes["long"].extrapolated is None  # FedAvg has no algorithm.iterations
    assert probes["fedvck"].extrapolated and "extended to 3" in probes["fedvck"].extrapolated
    assert "(algorithm.iterations" in capsys.readouterr().err
    text = describe(project(configs, probes, concurrent, gpus), "here", line)
    assert "extrapolated: 1 of 2 variants were probed at algorithm.iterations = 2 and 4" in text
