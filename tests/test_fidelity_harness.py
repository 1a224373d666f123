"""The fidelity harness's edits of the authors' FedDC script (experiments/fidelity/): each is
an exact text replacement applied once, and a changed authors' file is refused, not
mis-edited; the harness's statistics read as render_docs' do."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

FIDELITY = Path(__file__).resolve().parents[1] / "experiments" / "fidelity"


def _module(name: str):
    sys.path[:0] = [str(FIDELITY), str(FIDELITY.parent)]
    try:
        spec = importlib.util.spec_from_file_location(name, FIDELITY / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        del sys.path[:2]


def _fake_checkout(root: Path, edits: dict) -> None:
    """A Pneumonia/ folder whose files hold every text the edits replace, once."""
    folder = root / "Pneumonia"
    folder.mkdir(parents=True)
    for name, pairs in edits.items():
        (folder / name).write_text("# authors' file\n" + "".join(old + "\n" for old, _ in pairs))
    (folder / "averaging.py").write_text("# untouched\n")


def test_every_edit_is_applied_once_and_a_changed_file_is_refused(tmp_path):
    authors = _module("authors_feddc")
    _fake_checkout(tmp_path / "checkout", authors.EDITS)
    script = authors.prepare_copy(tmp_path / "checkout", tmp_path / "work")
    text = script.read_text()
    assert "fidelity_shim.common_model()" in text and "torchvision.models" not in text
    assert 'torch.device("cpu")' in text and "fidelity_shim.daisy_chain(" in text
    assert (tmp_path / "work" / "fidelity_shim.py").is_file()
    assert (tmp_path / "work" / "averaging.py").read_text() == "# untouched\n"
    changed = tmp_path / "changed"
    _fake_checkout(changed, authors.EDITS)
    target = changed / "Pneumonia" / authors.SCRIPT
    target.write_text(target.read_text().replace("mode = 'gpu'", "mode = 'tpu'"))
    with pytest.raises(authors.EditFailed, match=r"mode = 'gpu'.*found it 0 times"):
        authors.prepare_copy(changed, tmp_path / "work2")


def test_the_comparison_is_welch_and_tost_per_variant_and_metric():
    side = _module("side_by_side")
    summary = pd.DataFrame({
        "experiment": ["raysim_feddc", "authors_feddc"], "variant": ["feddc", "feddc"],
        "seeds": [5, 5], "accuracy_mean": [0.84, 0.83], "accuracy_std": [0.01, 0.012],
        "loss_mean": [0.40, 0.42], "loss_std": [0.02, 0.03]})
    table = side.compare(summary, 0.03).set_index("metric")
    assert table.loc["accuracy", "difference"] == pytest.approx(0.01)
    assert table.loc["accuracy", "tost_p"] < 0.05 < table.loc["accuracy", "p"]
    gaps = pd.DataFrame({"variant": ["feddc"] * 3, "round": [0, 10, 20],
                         "accuracy_gap": [0.0, 0.002, 0.01], "loss_gap": [0.0, 0.001, 0.02]})
    assert side.lockstep_summary(gaps).iloc[0]["first_round_apart"] == 20


def test_the_fedvck_copy_is_edited_once_and_a_changed_file_is_refused(tmp_path):
    authors = _module("authors_fedvck")
    checkout = tmp_path / "checkout"
    for name in authors.FILES:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        if not name.endswith("__init__.py"):
            pairs = authors.EDITS.get(name, [])
            (checkout / name).write_text("# authors' file\n" + "".join(old for old, _ in pairs))
    main = authors.prepare_copy(checkout, tmp_path / "work")
    assert "fidelity_split_file(args)" in main.read_text()
    server = (tmp_path / "work" / "src" / "server.py").read_text()
    assert "num_workers=0" in server and "return 0, 0, 0" in server
    assert (tmp_path / "work" / "src" / "__init__.py").read_text() == ""
    assert (tmp_path / "work" / "fidelity_shim.py").is_file()
    utils = checkout / "src" / "utils.py"
    utils.write_text(utils.read_text().replace("net_width=128", "net_width=64"))
    with pytest.raises(authors.EditFailed, match=r"src/utils\.py"):
        authors.prepare_copy(checkout, tmp_path / "work2")


def test_the_fedvck_flags_follow_the_config_and_the_log_is_read_per_round():
    side = _module("fedvck_side_by_side")
    from raysim.configuration.experiment import load_experiments

    config = load_experiments(FIDELITY / "fedvck_pneumonia.yaml")["fedvck"]
    flags = side.authors_arguments(config, 3)
    value = {flag: flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag.startswith("--")}
    assert value["--seed"] == "3" and value["--communication_rounds"] == "5"
    # their loops run range(n + 1): one step and one epoch more than the flag
    assert value["--dc_iterations"] == "200" and value["--model_epochs"] == "30"
    assert value["--lamda"] == "0.5" and value["--topk"] == "2"  # the class and 1 hard negative
    assert value["--compression_ratio"] == "0.01" and value["--dc_batch_size"] == "64"
    log = ("round 0 evaluation: test acc is 0.3750, test loss = 0.704765\n"
           "epoch 0, train loss avg now = 0.7\n"
           "round 0 evaluation: test acc is 0.6250, test loss = 0.695620\n"
           "round 1 evaluation: test acc is 0.6250, test loss = 0.695620\n"
           "round 1 evaluation: test acc is 0.7083, test loss = 0.686543\n")
    table = side.read_log(log)
    assert table["accuracy"].tolist() == [0.625, 0.7083]  # the line after the server's training


def test_the_fedvck_summary_by_round_keeps_every_round():
    side = _module("fedvck_side_by_side")
    trajectories = pd.DataFrame({
        "source": ["raysim"] * 4 + ["authors"] * 4, "variant": ["fedvck"] * 8,
        "seed": [0, 0, 1, 1] * 2, "round": [0, 1] * 4,
        "accuracy": [0.6, 0.8, 0.7, 0.9, 0.7, 0.85, 0.7, 0.85], "loss": [0.5] * 8})
    table = side.summarise_rounds(trajectories).set_index(["experiment", "round"])
    assert table.loc[("raysim_fedvck", 1), "accuracy_mean"] == pytest.approx(0.85)
    assert table.loc[("authors_fedvck", 0), "seeds"] == 2
