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
