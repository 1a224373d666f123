"""Units below the engine: models, batch plans, aggregation, metrics, FedProx's term."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from raysim.data.dataset import DataInfo
from raysim.models import MODELS, build_model
from raysim.rounds.placement import assign_groups, client_groups
from raysim.training.evaluation import classification_metrics
from raysim.training.runtime import batch_plans, proximal_term
from raysim.vectors.reduction_tree import aligned_spans, combine, reduce_span, subtree_roots
from raysim.vectors.weighted_sum import WeightedSum, weighted_mean

GRAY28 = DataInfo("fixture", "image", 2, (1, 28, 28), (0.5,), (0.5,))


def _params(name, **options):
    return MODELS[name].params(**options)


def test_convnet_has_about_300k_parameters_at_width_128_depth_3():
    model = build_model(_params("convnet", width=128, depth=3), GRAY28)
    count = sum(p.numel() for p in model.parameters())
    assert 280_000 <= count <= 320_000
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 2)


@pytest.mark.parametrize("norm, kind", [("batch", torch.nn.BatchNorm2d),
                                        ("instance", torch.nn.GroupNorm)])
def test_convnet_norm_option_selects_layer(norm, kind):
    model = build_model(_params("convnet", width=8, norm=norm), GRAY28)
    assert any(isinstance(m, kind) for m in model.modules())


def test_resnet18_stems_for_small_and_large_inputs():
    small = build_model(_params("resnet18"), GRAY28)
    large = build_model(_params("resnet18"), DataInfo("x", "image", 3, (3, 224, 224),
                                                      (0.5,) * 3, (0.5,) * 3))
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in small.modules())
    assert any(isinstance(m, torch.nn.MaxPool2d) for m in large.modules())
    assert 11_000_000 < sum(p.numel() for p in small.parameters()) < 11_300_000
    assert large(torch.zeros(1, 3, 224, 224)).shape == (1, 3)


def test_mlp_without_hidden_layers_is_linear():
    model = build_model(_params("mlp", hidden=()), DataInfo("t", "tabular", 2, (30,)))
    assert [type(m) for m in model.net] == [torch.nn.Flatten, torch.nn.Linear]


def test_batch_plan_epochs_cover_every_sample_once_per_epoch():
    plan = batch_plans(10, 4, epochs=2, steps=None, seed=0, round_=3, clients=np.arange(5))
    for client in range(5):
        counts = np.bincount(np.concatenate([step[client] for step in plan]), minlength=10)
        assert (counts == 2).all()
    assert not (plan[0][0] == plan[0][1]).all()  # clients have their own orders


def test_batch_plan_steps_and_singleton_merge():
    plan = batch_plans(9, 4, epochs=None, steps=5, seed=0, round_=0, clients=np.array([7]))
    assert len(plan) == 5
    assert [step.shape[1] for step in plan[:2]] == [4, 5]  # the lone ninth sample joined a batch


def test_client_streams_do_not_depend_on_which_clients_are_drawn_together():
    together = batch_plans(6, 3, 1, None, seed=1, round_=2, clients=np.array([4, 9, 11]))
    alone = batch_plans(6, 3, 1, None, seed=1, round_=2, clients=np.array([9]))
    assert all((t[1] == a[0]).all() for t, a in zip(together, alone, strict=True))


def test_weighted_mean_matches_numpy_and_is_grouping_independent():
    rng = np.random.default_rng(0)
    models = [{"w": rng.normal(size=(3, 4)).astype(np.float32),
               "n": np.array(k, dtype=np.int64)} for k in range(6)]
    sizes = [5.0, 1.0, 3.0, 8.0, 2.0, 7.0]
    mean = weighted_mean([WeightedSum.of(models, sizes)])
    expected = np.average(np.stack([m["w"] for m in models]), axis=0, weights=sizes)
    np.testing.assert_allclose(mean["w"], expected, rtol=1e-6)
    assert mean["w"].dtype == np.float32 and mean["n"].dtype == np.int64
    grouped = weighted_mean([WeightedSum.of(models[:2], sizes[:2]),
                             WeightedSum.of(models[2:], sizes[2:])])
    np.testing.assert_allclose(grouped["w"], mean["w"], rtol=1e-6)


def test_client_groups_contiguous_balanced_and_aligned():
    groups = client_groups(100, 64)
    assert len(groups) == 64 and sum(len(g) for g in groups) == 100
    loads = [float(len(g)) for g in groups]
    assignment = assign_groups(loads, 2)
    assert [g for owned in assignment for g in owned] == list(range(64))  # contiguous ranges
    totals = [sum(loads[g] for g in owned) for owned in assignment]
    assert max(totals) <= 1.05 * 50.0  # within the tolerance of the even split
    for workers in (2, 4, 8):  # equal groups: one aligned block, so one subtree, per worker
        for owned in assign_groups([1.0] * 64, workers):
            assert aligned_spans(owned[0], owned[-1] + 1) == [(owned[0], owned[-1] + 1)]
    skewed = assign_groups([10.0, 1.0, 1.0, 1.0, 1.0, 10.0], 2)
    assert skewed == [[0, 1, 2], [3, 4, 5]]


def test_reduction_tree_gives_the_same_merges_for_any_split_of_the_groups():
    def merge(left: str, right: str) -> str:
        return f"({left}+{right})"

    partials = {g: str(g) for g in range(13) if g % 3}  # groups 0, 3, 6, ... have no clients
    single = combine(subtree_roots(partials, 0, 13, merge), merge)
    assert single == reduce_span(partials, (0, 16), merge)
    for bounds in ([0, 5, 13], [0, 1, 2, 9, 13], [0, 8, 13], [0, 4, 8, 12, 13]):
        subtrees = [s for lo, hi in itertools.pairwise(bounds)
                    for s in subtree_roots(partials, lo, hi, merge)]
        assert combine(subtrees, merge) == single
    assert combine([], merge) is None


def test_the_driver_frees_a_rounds_partials_as_soon_as_it_drops_them():
    # merging the workers' subtree roots must not leave a reference cycle: the partials are
    # object-store buffers and float64 sums, and a cycle keeps them until Python's cyclic
    # collector runs (rounds later), so every round's new objects land on fresh memory
    import gc
    import weakref

    class Partial:
        def __init__(self, value: int):
            self.value = value

    def merge(left: Partial, right: Partial) -> Partial:
        return Partial(left.value + right.value)

    gc.disable()
    try:
        leaves = {g: Partial(g) for g in range(16)}
        subtrees = [s for lo, hi in ((0, 5), (5, 16))
                    for s in subtree_roots(leaves, lo, hi, merge)]
        root = combine(subtrees, merge)
        assert root.value == sum(range(16))
        watched = [weakref.ref(s.partial) for s in subtrees] + [weakref.ref(root)]
        del subtrees, root, leaves
        assert all(ref() is None for ref in watched)  # freed by reference counting alone
    finally:
        gc.enable()


def test_metrics_binary_auc_matches_sklearn_and_single_class_gives_nan():
    labels = np.array([0, 1, 1, 0, 1])
    probs = np.array([[0.8, 0.2], [0.3, 0.7], [0.6, 0.4], [0.9, 0.1], [0.2, 0.8]])
    metrics = classification_metrics(labels, probs)
    assert metrics["accuracy"] == pytest.approx(0.8)
    assert metrics["auc"] == pytest.approx(roc_auc_score(labels, probs[:, 1]))
    assert math.isnan(classification_metrics(np.array([1, 1]), probs[:2])["auc"])


def test_proximal_term_gradient_pulls_towards_anchor():
    model = torch.nn.Linear(3, 1)
    anchor = {name: np.zeros(p.shape, np.float32) for name, p in model.named_parameters()}
    term = proximal_term(model, anchor, mu=2.0)
    term().backward()
    torch.testing.assert_close(model.weight.grad, 2.0 * model.weight.detach())


def test_summary_shows_n_1_where_one_seed_leaves_the_spread_undefined_and_version(capsys):
    import pandas as pd

    from raysim.cli import main
    from raysim.results.report import _KEYS, format_summary

    row = {key: "x" for key in _KEYS}
    table = pd.DataFrame([{**row, "seeds": 1, "completed": 1, "rounds": 3,
                           "accuracy_mean": 0.75, "accuracy_std": float("nan")},
                          {**row, "seeds": 3, "completed": 3, "rounds": 3,
                           "accuracy_mean": 0.5, "accuracy_std": 0.1}])
    text = format_summary(table)
    assert "0.7500 (n=1)" in text and "0.5000 ± 0.1000" in text and "± 0.0000" not in text
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("raysim ")


def test_curve_labels_drop_run_timestamps_and_repeat_no_algorithm():
    from raysim.results.report import _curve_label

    assert _curve_label("retina-20261122-234926", "fedavg") == "retina (fedavg)"
    assert _curve_label("retina-20261122-234926-2", "fedavg") == "retina (fedavg)"
    assert _curve_label("fedvck", "fedvck") == "fedvck"
    assert _curve_label("fedvck_no_latent", "fedvck") == "fedvck_no_latent (fedvck)"


def test_every_cli_argument_has_help():
    from raysim.cli_parser import parser as _parser

    parser = _parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name, command in commands.items():
        for action in command._actions:
            if action.dest != "help":
                assert action.help, f"raysim {name}: {action.option_strings or action.dest}"


def test_a_wait_for_another_invocations_cpus_is_its_own_start_up_phase():
    from raysim.engine.startup_phases import startup_phases

    manifest = {"startup": {"command_at": 0.0, "ray_started_at": 1.0, "prepared_at": 4.0,
                            "ray_ready_at": 125.0, "cpu_wait_s": 119.0},
                "workers_ready_at": 127.0, "first_dispatch_at": 128.0}
    phases = startup_phases(manifest)
    assert phases is not None
    assert phases["cpu_wait"] == 119.0 and phases["ray"] == 5.0  # not "Ray 124 s"
    assert phases["first_round"] == 128.0


def test_compiling_the_step_is_a_start_up_phase_of_the_slowest_worker():
    from raysim.engine.startup_phases import startup_phases

    manifest = {"startup": {"command_at": 0.0, "entered_at": 1.0, "prepared_at": 3.0,
                            "ray_ready_at": 4.0},
                "workers_ready_at": 6.0, "first_dispatch_at": 20.0,
                "worker_data": [{"device": "cpu", "step_compile_s": 12.5},
                                {"device": "cpu", "step_compile_s": 13.0}]}
    phases = startup_phases(manifest)
    assert phases is not None and phases["compile_step"] == 13.0
    assert startup_phases({**manifest, "worker_data": [{"device": "cpu"}]})["compile_step"] == 0


def test_costs_writes_its_table_as_csv(tmp_path):
    import pandas as pd
    import yaml
    from conftest import quickstart_raw

    from raysim.cli import main
    from raysim.configuration.schema import DatasetConfig
    from raysim.data import load_dataset
    from raysim.models import build_model

    raw = quickstart_raw(seeds=[0])
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["costs", str(config), "--csv", str(tmp_path / "costs.csv")]) == 0
    table = pd.read_csv(tmp_path / "costs.csv")
    from raysim.configuration.experiment import parse_config

    info = load_dataset(DatasetConfig(name=raw["dataset"]["name"])).info
    model = build_model(parse_config(raw).model, info)
    assert set(table["experiment"]) == {raw["name"]}
    assert table["params"].iloc[0] == sum(p.numel() for p in model.parameters())


def test_the_sink_writes_column_batches_as_the_rows_they_were_given(tmp_path):
    """Column batches are converted at the flush, consecutive batches of the same columns in
    one go: the part holds every row in order, batches with other columns or dtypes keep their
    own (nulls where a column is missing), and row dicts in between stay in place."""
    import pandas as pd

    from raysim.results.sink import ParquetSink

    sink = ParquetSink(tmp_path, flush_seconds=1e9)
    sink.add_columns("clients", {"round": np.array([0, 0]), "client": np.array([3, 1]),
                                 "loss": np.array([0.5, 0.25])})
    sink.add_columns("clients", {"round": np.array([1]), "client": np.array([2]),
                                 "loss": np.array([0.75])})
    sink.add("clients", [{"round": 2, "client": 7, "note": "row"}])
    sink.add_columns("clients", {"round": np.array([3]), "client": np.array([4]),
                                 "tier": np.array(["cpu"], dtype=object)})
    sink.add_columns("clients", {"round": np.array([4]), "client": np.array([5]),
                                 "loss": np.array([1], dtype=np.int64)})
    sink.flush()
    written = pd.read_parquet(tmp_path / "clients" / "part-000000.parquet")
    assert written["round"].tolist() == [0, 0, 1, 2, 3, 4]
    assert written["client"].tolist() == [3, 1, 2, 7, 4, 5]
    np.testing.assert_array_equal(written["loss"].to_numpy(),
                                  [0.5, 0.25, 0.75, np.nan, np.nan, 1.0])
    assert written["tier"].tolist()[4] == "cpu" and written["note"].tolist()[3] == "row"


def test_row_batches_are_converted_once_per_flush_and_a_bad_one_loses_no_other_row(
        tmp_path, monkeypatch):
    """Rows (``add``: one rounds row per round) are buffered as copies of their dicts and
    converted at the flush, every consecutive batch in one Arrow conversion, not one per
    round; a batch that cannot convert is dropped, its error raised after the others are
    written."""
    import pandas as pd
    import pyarrow as pa

    from raysim.results import sink as sink_module

    conversions = []
    original = sink_module._rows_table
    monkeypatch.setattr(sink_module, "_rows_table",
                        lambda rows: conversions.append(len(rows)) or original(rows))
    sink = sink_module.ParquetSink(tmp_path, flush_seconds=1e9)
    rows = [{"round": r, "accuracy": 0.5 + r / 100} for r in range(10)]
    for row in rows:
        sink.add("rounds", [row])
    rows[3]["accuracy"] = -1.0  # changed after it was added: not what was added
    sink.add("rounds", [{"round": 10, "note": "last"}])
    assert conversions == []
    sink.flush()
    assert conversions == [11]  # every row of the flush in one conversion
    written = pd.read_parquet(tmp_path / "rounds" / "part-000000.parquet")
    assert written["round"].tolist() == list(range(11))
    assert written["accuracy"].tolist()[3] == pytest.approx(0.53)
    assert written["note"].tolist()[10] == "last" and written["note"].isna().sum() == 10

    sink.add("rounds", [{"round": 11, "accuracy": 0.6}])
    sink.add("rounds", [{"round": 12, "accuracy": object()}])
    sink.add("rounds", [{"round": 13, "accuracy": 0.7}])
    with pytest.raises(pa.ArrowException):
        sink.flush()
    kept = pd.read_parquet(tmp_path / "rounds" / "part-000001.parquet")
    assert kept["round"].tolist() == [11, 13]
    sink.flush()  # nothing left that fails


def test_a_column_batch_arrow_cannot_convert_loses_no_other_row(tmp_path):
    """The batch is dropped and its error raised once the rows that convert are written; the
    next flush does not fail on it again."""
    import pandas as pd
    import pyarrow as pa

    from raysim.results.sink import ParquetSink

    sink = ParquetSink(tmp_path, flush_seconds=1e9)
    sink.add_columns("clients", {"round": np.array([0]), "note": np.array(["a"], dtype=object)})
    sink.add_columns("clients", {"round": np.array([1]),
                                 "note": np.array([object()], dtype=object)})
    sink.add_columns("clients", {"round": np.array([2]), "note": np.array(["c"], dtype=object)})
    sink.add("rounds", [{"round": 2, "accuracy": 0.5}])
    with pytest.raises(pa.ArrowException):
        sink.flush()
    written = pd.read_parquet(tmp_path / "clients" / "part-000000.parquet")
    assert written["round"].tolist() == [0, 2] and written["note"].tolist() == ["a", "c"]
    assert pd.read_parquet(tmp_path / "rounds" / "part-000000.parquet")["round"].tolist() == [2]
    sink.flush()  # nothing left that fails
