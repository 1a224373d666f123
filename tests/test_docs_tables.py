"""Every results table and comparison statistic in docs/ is the rendering of a committed CSV
(experiments/render_docs.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "experiments"))

import render_docs  # noqa: E402


@pytest.mark.parametrize("doc", sorted(p.name for p in (REPOSITORY / "docs").glob("*.md")))
def test_every_table_and_statistic_in_the_doc_is_its_csv_rendering(doc):
    text = (REPOSITORY / "docs" / doc).read_text()
    assert render_docs.render(text) == text, (
        f"docs/{doc} differs from its rendering: run python experiments/render_docs.py")


def _summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render_docs, "RESULTS", tmp_path)
    pd.DataFrame({"experiment": ["a", "b", "c"], "completed": [3, 3, 1],
                  "accuracy_mean": [0.82746, 0.80049, 0.5], "accuracy_std": [0.01, 0.02, np.nan],
                  }).to_csv(tmp_path / "summary.csv", index=False)


def test_cells_come_from_full_precision_with_three_decimals(tmp_path, monkeypatch):
    _summary(tmp_path, monkeypatch)
    doc = ("<!-- table\ncsv: summary.csv\ncolumns: {accuracy: accuracy}\n"
           "rows: {first: a, single seed: c}\n-->\nstale\n<!-- /table -->")
    rendered = render_docs.render(doc)
    assert "| first | 0.827 ± 0.010 |" in rendered  # 0.82746, never 0.8275 -> 0.828
    assert "| single seed | 0.500 (n=1) |" in rendered and "stale" not in rendered
    with pytest.raises(ValueError, match="rows with experiment = 'missing'"):
        render_docs.render(doc.replace("c}", "missing}"))


def test_a_statistic_states_the_difference_welch_t_its_p_and_a_verdict_by_p(
        tmp_path, monkeypatch):
    _summary(tmp_path, monkeypatch)
    rendered = render_docs.render(
        "<!-- stat csv: summary.csv, a: a, b: b, metric: accuracy -->old<!-- /stat -->")
    t = stats.ttest_ind_from_stats(0.82746, 0.01, 3, 0.80049, 0.02, 3, equal_var=False)
    assert f"Welch's t = {t.statistic:.2f}" in rendered and "+0.027 accuracy" in rendered
    assert f"p = {t.pvalue:.3f}" in rendered  # scipy's two-sided p at Welch's df
    assert ("within noise (p = " in rendered) == (t.pvalue >= 0.05)


def test_the_verdict_rule_is_p_below_0_05_from_the_t_distribution():
    def at(t: float, df: float) -> str:
        return render_docs.verdict(render_docs.Test(t, df, render_docs._two_sided(t, df)))

    assert at(3.18, 2.0).startswith("within noise (p = 0.08")  # |t| >= 2, yet p ~ 0.086
    assert at(3.18, 8.0) == "above" and at(-3.18, 8.0) == "below"
    near_line = render_docs.Test(2.57, 5.1, 0.0497)  # 3 decimals would print p = 0.050
    assert render_docs._t_text(near_line).endswith("p = 0.0497")
    assert render_docs._p_text(0.0503) == "p = 0.0503" and render_docs._p_text(0.051) == "p = 0.051"
    welch = render_docs.welch_test(0.6, 0.01, 3, 0.5, 0.02, 3)
    reference = stats.ttest_ind_from_stats(0.6, 0.01, 3, 0.5, 0.02, 3, equal_var=False)
    assert welch.t == pytest.approx(reference.statistic)
    assert welch.p == pytest.approx(reference.pvalue)  # Welch-Satterthwaite df
    paired = render_docs.paired_test(np.array([0.9, 0.8, 0.85]), np.array([0.7, 0.75, 0.8]))
    assert paired.df == 2.0
    assert paired.p == pytest.approx(stats.ttest_rel([0.9, 0.8, 0.85], [0.7, 0.75, 0.8]).pvalue)


def test_a_paired_statistic_lists_the_per_seed_differences(tmp_path, monkeypatch):
    monkeypatch.setattr(render_docs, "RESULTS", tmp_path)
    pd.DataFrame({"experiment": ["a"] * 3 + ["b"] * 3, "seed": [0, 1, 2] * 2,
                  "accuracy": [0.9, 0.8, 0.85, 0.7, 0.75, 0.8]}).to_csv(
        tmp_path / "seeds.csv", index=False)
    rendered = render_docs.render("<!-- stat per_seed: seeds.csv, a: a, b: b, "
                                  "metric: accuracy -->x<!-- /stat -->")
    t = stats.ttest_rel([0.9, 0.8, 0.85], [0.7, 0.75, 0.8]).statistic
    assert "per seed +0.200, +0.050, +0.050" in rendered
    assert f"paired t = {t:.2f}" in rendered
    frame = pd.read_csv(tmp_path / "seeds.csv")  # b's seeds from another invocation's CSV
    frame[frame.experiment == "a"].to_csv(tmp_path / "a.csv", index=False)
    frame[frame.experiment == "b"].to_csv(tmp_path / "b.csv", index=False)
    split = render_docs.render("<!-- stat per_seed: a.csv, per_seed_b: b.csv, a: a, b: b, "
                               "metric: accuracy -->x<!-- /stat -->")
    assert split.split("-->", 1)[1] == rendered.split("-->", 1)[1]


def test_a_choice_is_made_on_the_validation_column_never_on_the_test_one(tmp_path, monkeypatch):
    monkeypatch.setattr(render_docs, "RESULTS", tmp_path)

    def chosen(validation: list[float]) -> str:
        pd.DataFrame({"experiment": ["lr=0.1", "lr=0.01"], "completed": [1, 1],
                      "val_accuracy_mean": validation, "val_accuracy_std": [np.nan, np.nan],
                      "accuracy_mean": [0.90, 0.60], "accuracy_std": [np.nan, np.nan]}).to_csv(
            tmp_path / "study.csv", index=False)
        render_docs._load.cache_clear()
        return render_docs.render(
            "<!-- choose csv: study.csv, name: lr, rows: {'0.1': 'lr=0.1', '0.01': 'lr=0.01'}, "
            "select: val_accuracy, report: accuracy -->x<!-- /choose -->")

    assert "lr 0.01 (the highest validation value, 0.800); test 0.600 (n=1)" in chosen(
        [0.70, 0.80])
    tied = chosen([0.75, 0.75])
    assert "lr 0.1 (tied at the highest validation value, 0.750, with 0.01; a tie keeps the " \
           "first listed); test 0.900 (n=1)" in tied


def test_a_row_can_be_chosen_by_several_columns_and_tiny_values_keep_their_digits(
        tmp_path, monkeypatch):
    monkeypatch.setattr(render_docs, "RESULTS", tmp_path)
    pd.DataFrame({"arch": ["a", "a", "b"], "tokens": ["x", "y", "x"],
                  "change": [5.52e-05, 6.4, 0.5]}).to_csv(tmp_path / "probe.csv", index=False)
    rendered = render_docs.render(
        "<!-- table\ncsv: probe.csv\ncolumns: {change: change}\nrows:\n"
        "  a x: {where: {arch: a, tokens: x}}\n  a y: {where: {arch: a, tokens: y}}\n"
        "-->\n<!-- /table -->")
    assert "| a x | 5.52e-05 |" in rendered and "| a y | 6.400 |" in rendered


def test_a_family_of_comparisons_gets_benjamini_hochberg_q_values(tmp_path, monkeypatch):
    monkeypatch.setattr(render_docs, "RESULTS", tmp_path)
    pd.DataFrame({"experiment": ["m", "x", "y", "z"],
                  "accuracy_mean": [0.80, 0.70, 0.78, 0.60],
                  "accuracy_std": [0.02, 0.03, 0.02, 0.05], "seeds": [3, 3, 3, 3]}).to_csv(
        tmp_path / "f.csv", index=False)
    comparisons = ["x", "y", "z"]
    doc = " ".join(f"<!-- stat csv: f.csv, a: m, b: {b}, metric: accuracy, family: Table 1 -->"
                   f"old<!-- /stat -->" for b in comparisons)
    rendered = render_docs.render(doc)
    p_values = [render_docs.welch_test(0.80, 0.02, 3, *row, 3).p
                for row in [(0.70, 0.03), (0.78, 0.02), (0.60, 0.05)]]
    # Benjamini-Hochberg by hand: q_(i) = min over j >= i of p_(j) m / j
    order = np.argsort(p_values)
    ranked = np.array(p_values)[order] * len(p_values) / np.arange(1, len(p_values) + 1)
    q_sorted = np.minimum.accumulate(ranked[::-1])[::-1]
    q = np.empty(len(p_values))
    q[order] = np.minimum(q_sorted, 1)
    for value in q:
        assert f"BH q = {value:.3f} over the 3 comparisons of Table 1" in rendered
    assert rendered.count("after the correction)") == sum(p < 0.05 for p in p_values)
    assert "old" not in rendered


def test_the_equivalence_test_is_two_one_sided_welch_tests(tmp_path, monkeypatch):
    """TOST: the larger one-sided p of "difference > -m" and "difference < +m", each
    scipy's one-sided Welch test on the shifted groups; equivalent at p < 0.05."""
    a = np.array([0.84, 0.85, 0.83, 0.86, 0.84, 0.85])
    b = np.array([0.85, 0.84, 0.86, 0.83, 0.85, 0.84])
    margin = 0.03
    lower = stats.ttest_ind(a + margin, b, equal_var=False, alternative="greater").pvalue
    upper = stats.ttest_ind(a - margin, b, equal_var=False, alternative="less").pvalue
    p = render_docs.equivalence_test(a.mean(), a.std(ddof=1), 6, b.mean(), b.std(ddof=1), 6,
                                     margin)
    assert p == pytest.approx(max(lower, upper)) and p < 0.05
    far = render_docs.equivalence_test(0.90, 0.01, 6, 0.84, 0.01, 6, margin)
    assert far > 0.5  # a difference beyond the margin is never shown equivalent
    monkeypatch.setattr(render_docs, "RESULTS", tmp_path)
    pd.DataFrame({"experiment": ["x", "y"], "accuracy_mean": [a.mean(), b.mean()],
                  "accuracy_std": [a.std(ddof=1), b.std(ddof=1)], "completed": [6, 6]}
                 ).to_csv(tmp_path / "summary.csv", index=False)
    rendered = render_docs.render("<!-- stat csv: summary.csv, a: x, b: y, metric: accuracy, "
                                  "margin: 0.03 -->old<!-- /stat -->")
    assert f"within noise (p = 1.000); TOST at ±0.03: {render_docs._p_text(p)}, equivalent)" \
        in rendered


def test_an_unclosed_table_is_refused_before_it_swallows_the_prose_after_it():
    spec = "<!-- table\ncsv: x.csv\nlabel: a\ncolumns: {}\nrows: {}\n-->\n"
    with pytest.raises(ValueError, match="line 1 has no"):
        render_docs.render(spec + "prose that must survive\n" + spec + "<!-- /table -->\n")
    with pytest.raises(ValueError, match="line 3 has no"):
        render_docs.render("text\n\n" + spec + "the end\n")


def test_an_empty_report_table_renders_its_missing_cells(tmp_path, monkeypatch):
    """A report's table with no rows (an audit of uploads it cannot score) is an empty file;
    a column that allows missing cells shows them."""
    monkeypatch.setattr(render_docs, "RESULTS", tmp_path)
    pd.DataFrame({"experiment": ["m"], "accuracy_mean": [0.8], "accuracy_std": [0.1]}).to_csv(
        tmp_path / "summary.csv", index=False)
    (tmp_path / "privacy.csv").write_text("\n")
    rendered = render_docs.render(
        "<!-- table\ncsv: summary.csv\ncolumns:\n  acc: accuracy\n"
        "  audit: {csv: privacy.csv, metric: max_auc, missing: \"-\"}\nrows: {M: m}\n-->\n"
        "<!-- /table -->")
    assert "| M | 0.800 ± 0.100 | - |" in rendered


def test_a_row_recorded_under_another_name_reads_its_own_key_in_a_papers_column(
        tmp_path, monkeypatch):
    """A row whose run is recorded as ``b`` but that is method ``c`` of a paper's table takes
    the paper's ``c`` row (``column_key``), not ``b``'s."""
    _summary(tmp_path, monkeypatch)
    pd.DataFrame({"experiment": ["b", "c"], "reported": [0.7, 0.9]}).to_csv(
        tmp_path / "paper.csv", index=False)
    rendered = render_docs.render(
        "<!-- table\ncsv: summary.csv\ncolumns:\n  accuracy: accuracy\n"
        "  paper: {csv: paper.csv, metric: reported, same_file: true}\n"
        "rows:\n  as b: b\n  b recorded, c in the paper: {key: b, column_key: c}\n"
        "-->\n<!-- /table -->")
    assert "| as b | 0.800 ± 0.020 | 0.700 |" in rendered
    assert "| b recorded, c in the paper | 0.800 ± 0.020 | 0.900 |" in rendered
