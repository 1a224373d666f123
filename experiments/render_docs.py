"""Render every results table and every comparison statistic in docs/*.md from the committed
CSVs under docs/results/: a reader can re-derive each number from the repository.

A table is an HTML comment holding a YAML spec, then the rendered Markdown, then a closing
comment::

    <!-- table
    csv: feddc/pneumonia/summary.csv        # under docs/results/
    label: variant                          # the first column's header
    columns: {accuracy: accuracy, macro-F1: macro_f1}   # header -> metric
    rows:                                   # label -> the CSV's key column value
      FedDC (d=1, b=10): feddc
      FedAvg b=1: fedavg_b1
    -->
    | variant | accuracy | macro-F1 |
    ...
    <!-- /table -->

A metric with ``<metric>_mean`` and ``<metric>_std`` columns renders as ``mean ± std`` (``mean
(n=1)`` without a std), any other column as its value; numbers with 3 decimals from the CSV's
full precision (never a re-rounded figure). ``key`` names the key column (default
``experiment``); ``where`` ({column: value}) keeps matching rows only; a row given as ``{csv:
..., key: ...}`` comes from another CSV (its other columns from the files of the same names
in that CSV's directory), and so does a column given as ``{csv: ..., metric: ...}`` (the row's
key looked up there; with ``same_file: true`` that very file for every row, e.g. a paper's
reported numbers; with ``missing: <text>`` a row the file lacks shows that text); a row may
name ``column_key``, its key in those columns when it differs from its own (a row recorded
under another method's name, e.g. ``{key: feddf, column_key: pfeddf}``); a row given
as ``{where: {column: value, ...}}`` is the one row
matching all of them; a column ``{per_seed: <csv>, metric: ...}`` lists the
row's per-seed values (a CSV with a ``seed`` column) as ``s0 / s1 / s2``.

A statistic is an inline comment, its rendering, and a closing comment::

    <!-- stat csv: feddc/pneumonia/summary.csv, a: feddc, b: fedavg_b10, metric: accuracy -->
    ...<!-- /stat -->

It renders the difference of the means of a and b (``csv_b``: b's row from another CSV), and
Welch's t from the means, standard deviations (ddof 1) and seed counts, with the
Welch-Satterthwaite degrees of freedom; with ``per_seed`` (a CSV with a ``seed`` column and the
metric as a column) the per-seed differences and the paired t with n - 1 degrees of freedom
instead (``per_seed_b``: b's seeds from another CSV, for runs of the same seeds and code made
by two invocations). Beside t it prints the two-sided p from the t distribution. The wording is fixed by
p: "above" or "below" at p < 0.05, otherwise "within noise (p = ...)". Statistics that name a
``family`` (e.g. ``family: Table 1``) get Benjamini-Hochberg q-values over that family's
comparisons on the page, printed beside p with whether the verdict survives the correction.
A Welch statistic with ``margin: m`` adds the equivalence test (TOST, two one-sided Welch
tests) of the difference lying inside (-m, +m), with its p and "equivalent" at p < 0.05.

A choice on validation data (``<!-- choose ... -->...<!-- /choose -->``, see
:func:`render_choice`) names the setting with the best mean validation metric and reports its
test metric, never choosing on the test columns.

    python experiments/render_docs.py           # rewrite docs/*.md in place
    python experiments/render_docs.py --check   # exit 1 and name the files that differ
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from scipy import stats

REPOSITORY = Path(__file__).resolve().parents[1]
DOCS = REPOSITORY / "docs"
RESULTS = DOCS / "results"
SIGNIFICANCE = 0.05
"""A difference whose two-sided p is at or above this is reported as within noise."""

_TABLE = re.compile(r"(<!-- table\n(?P<spec>.*?)-->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
_STAT = re.compile(r"(<!-- stat (?P<spec>[^>]*?) -->)(?P<body>.*?)(<!-- /stat -->)", re.S)
_CHOOSE = re.compile(r"(<!-- choose (?P<spec>[^>]*?) -->)(?P<body>.*?)(<!-- /choose -->)", re.S)


def _number(value: Any) -> str:
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "-"
        # 3 decimals; values below 0.001 with 3 significant digits (else they would read 0.000)
        return f"{value:.3g}" if 0 < abs(value) < 0.001 else f"{value:.3f}"
    return str(value)


@functools.lru_cache(maxsize=256)
def _load(path: Path) -> pd.DataFrame:
    """A CSV, read once per rendering process (never modified); an empty file (a report table
    with no rows, e.g. an audit of uploads it cannot score) is an empty frame."""
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def _read(csv: str, where: Mapping[str, Any] | None = None) -> pd.DataFrame:
    return _read_frame(_load(RESULTS / csv), where or {})


def _row(frame: pd.DataFrame, key: str, value: Any, csv: str) -> pd.Series:
    conditions = value["where"] if isinstance(value, Mapping) else {key: value}
    matches = _read_frame(frame, conditions)
    if len(matches) != 1:
        what = (", ".join(f"{c} = {v!r}" for c, v in conditions.items()))
        raise ValueError(f"{csv}: {len(matches)} rows with {what} (need exactly 1)")
    return matches.iloc[0]


def _read_frame(frame: pd.DataFrame, where: Mapping[str, Any]) -> pd.DataFrame:
    for column, value in where.items():
        frame = frame[frame[column].astype(str) == str(value)]
    return frame


def _cell(row: pd.Series, metric: str, csv: str) -> str:
    if f"{metric}_mean" in row.index:
        mean, std = row[f"{metric}_mean"], row.get(f"{metric}_std", float("nan"))
        if pd.isna(mean):
            return "-"
        # mean ± std: always 3 decimals (the convention for summary cells)
        return f"{mean:.3f} (n=1)" if pd.isna(std) else f"{mean:.3f} ± {std:.3f}"
    if metric not in row.index:
        raise ValueError(f"{csv} has no column {metric!r} (nor {metric}_mean)")
    return _number(row[metric])


def _per_seed_cell(csv: str, key: str, value: Any, metric: str) -> str:
    frame = _read(csv)
    rows = frame[frame[key].astype(str) == str(value)].sort_values("seed")
    if rows.empty:
        raise ValueError(f"{csv}: no rows with {key} = {value!r}")
    return " / ".join(_number(v) for v in rows[metric])


def _seeds(row: pd.Series, metric: str) -> int:
    """The number of seeds behind a summary row: ``reached`` for a ``*_to_target`` metric of
    ``raysim report --time`` (its mean is over the seeds that reached the target), else
    ``<metric>_count``, ``completed`` or ``seeds``."""
    columns = ("reached",) if metric.endswith("_to_target") else ()
    for column in (*columns, f"{metric}_count", "completed", "seeds"):
        if column in row.index:
            return int(row[column])
    raise ValueError(f"no seed count for {metric!r} ({metric}_count, completed or seeds)")


def render_table(spec: Mapping[str, Any]) -> str:
    """The Markdown table a spec describes (see the module docstring)."""
    csv, key = spec["csv"], spec.get("key", "experiment")
    columns: Mapping[str, Any] = spec["columns"]
    lines = ["| " + " | ".join([spec.get("label", "variant"), *columns]) + " |",
             "| " + " | ".join(["---"] * (len(columns) + 1)) + " |"]
    for label, value in spec["rows"].items():
        row_csv, column_value = csv, value
        if isinstance(value, Mapping) and "key" in value:  # {key, csv?, column_key?}
            row_csv = value.get("csv", csv)
            value, column_value = value["key"], value.get("column_key", value["key"])
        cells = [str(label)]
        for column in columns.values():
            if isinstance(column, Mapping) and "per_seed" in column:  # the seeds' values
                cells.append(_per_seed_cell(column["per_seed"], key, value, column["metric"]))
            elif isinstance(column, Mapping):  # a column from another CSV: {csv, metric}
                # a row from another directory takes that directory's file of the same name
                column_csv = column["csv"] if row_csv == csv or column.get("same_file") else str(
                    Path(row_csv).parent / Path(column["csv"]).name)
                frame = _read(column_csv, spec.get("where"))
                if "missing" in column and (key not in frame or not (
                        frame[key].astype(str) == str(column_value)).any()):
                    cells.append(str(column["missing"]))  # e.g. no attackable upload
                    continue
                other = _row(frame, key, column_value, column_csv)
                cells.append(_cell(other, column["metric"], column_csv))
            else:
                cells.append(_cell(_row(_read(row_csv, spec.get("where")), key, value, row_csv),
                                    column, row_csv))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Test:
    """A t statistic, its degrees of freedom and its two-sided p."""

    t: float
    df: float
    p: float


def _two_sided(t: float, df: float) -> float:
    if math.isinf(t):
        return 0.0
    return float(2 * stats.t.sf(abs(t), df))


def welch_test(mean_a: float, std_a: float, n_a: int, mean_b: float, std_b: float, n_b: int
               ) -> Test:
    """Welch's t of two groups from their means, standard deviations (ddof 1) and sizes, with
    the Welch-Satterthwaite degrees of freedom and the two-sided p (+-inf and p 0 when neither
    group varies but the means differ)."""
    va, vb = std_a ** 2 / n_a, std_b ** 2 / n_b
    df = (va + vb) ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1)) if va + vb > 0 \
        else float(n_a + n_b - 2)
    if va + vb == 0:
        difference = mean_a - mean_b
        t = 0.0 if difference == 0 else math.copysign(math.inf, difference)
        return Test(t, df, 1.0 if t == 0 else 0.0)
    t = (mean_a - mean_b) / math.sqrt(va + vb)
    return Test(t, df, _two_sided(t, df))


def equivalence_test(mean_a: float, std_a: float, n_a: int, mean_b: float, std_b: float,
                     n_b: int, margin: float) -> float:
    """The p of Schuirmann's two one-sided Welch tests (TOST) that the difference of the
    means lies inside (-margin, +margin): the larger of the two one-sided p-values, with the
    Welch-Satterthwaite degrees of freedom. p < 0.05 shows equivalence within the margin."""
    difference = mean_a - mean_b
    spread = math.sqrt(std_a ** 2 / n_a + std_b ** 2 / n_b)
    if spread == 0:
        return 0.0 if abs(difference) < margin else 1.0
    df = welch_test(mean_a, std_a, n_a, mean_b, std_b, n_b).df
    above_lower = float(stats.t.sf((difference + margin) / spread, df))
    below_upper = float(stats.t.cdf((difference - margin) / spread, df))
    return max(above_lower, below_upper)


def equivalence_text(p: float, margin: float) -> str:
    """The TOST's verdict: "equivalent within ±margin" at p < 0.05, else "not shown"."""
    said = ("equivalent" if p < SIGNIFICANCE else "equivalence not shown")
    return f"TOST at ±{margin:g}: {_p_text(p)}, {said}"


def paired_test(a: np.ndarray, b: np.ndarray) -> Test:
    """The paired t of per-seed values with n - 1 degrees of freedom and the two-sided p
    (+-inf and p 0 when the differences do not vary but are not zero)."""
    differences = a - b
    df = float(len(differences) - 1)
    if len(differences) < 2 or np.all(differences == differences[0]):
        mean = float(np.mean(differences))
        t = 0.0 if mean == 0 else math.copysign(math.inf, mean)
        return Test(t, df, 1.0 if t == 0 else 0.0)
    t = float(stats.ttest_rel(a, b).statistic)
    return Test(t, df, _two_sided(t, df))


def welch_t(mean_a: float, std_a: float, n_a: int, mean_b: float, std_b: float, n_b: int
            ) -> float:
    """Welch's t alone (:func:`welch_test`)."""
    return welch_test(mean_a, std_a, n_a, mean_b, std_b, n_b).t


def _p_text(p: float) -> str:
    """The p-value with 3 decimals; with 4 where 3 would round it to the 0.05 line, so that
    the printed p and the verdict agree."""
    if p < 0.001:
        return "p < 0.001"
    return f"p = {p:.4f}" if f"{p:.3f}" == f"{SIGNIFICANCE:.3f}" else f"p = {p:.3f}"


def verdict(test: Test) -> str:
    """"above" or "below" at p < :data:`SIGNIFICANCE`, else "within noise (p = ...)"."""
    if test.p < SIGNIFICANCE:
        return "above" if test.t > 0 else "below"
    return f"within noise ({_p_text(test.p)})"


def _t_text(test: Test) -> str:
    t = "t = ±inf (no spread)" if math.isinf(test.t) else f"t = {test.t:.2f}"
    return f"{t}, df {test.df:.1f}, {_p_text(test.p)}"


def render_stat(spec: Mapping[str, Any], q: tuple[float, int] | None = None) -> str:
    """The inline statistic a spec describes (see the module docstring); ``q``: its
    Benjamini-Hochberg q-value and the size of its family, printed beside p."""
    text, test = stat_test(spec)
    if q is None:
        return f"{text}: {verdict(test)}{equivalence_clause(spec)})"
    said = verdict(test)
    if test.p < SIGNIFICANCE:  # a verdict the correction keeps or takes back
        said += (", and after the correction" if q[0] < SIGNIFICANCE
                 else ", but within noise after the correction")
    return (f"{text}; BH q = {q[0]:.3f} over the {q[1]} comparisons of "
            f"{spec['family']!s}: {said}{equivalence_clause(spec)})")


def stat_test(spec: Mapping[str, Any]) -> tuple[str, Test]:
    """The statistic's text up to its verdict, and its test."""
    metric, a, b = spec["metric"], spec["a"], spec["b"]
    key = spec.get("key", "experiment")
    if "per_seed" in spec:
        frame = _read(spec["per_seed"], spec.get("where"))
        if "per_seed_b" in spec:  # b's seeds from another run of the same seeds
            frame = pd.concat([frame, _read(spec["per_seed_b"], spec.get("where"))])
        pivot = frame.pivot_table(index="seed", columns=key, values=metric)
        pairs = pivot[[a, b]].dropna()
        differences = (pairs[a] - pairs[b]).to_numpy()
        test = paired_test(pairs[a].to_numpy(), pairs[b].to_numpy())
        shown = ", ".join(f"{d:+.3f}" for d in differences)
        text = (f"{float(np.mean(differences)):+.3f} {metric} (per seed {shown}; paired "
                f"{_t_text(test)}, {len(differences)} seeds")
    else:
        csv_b = spec.get("csv_b", spec["csv"])  # b may come from another CSV
        row_a = _row(_read(spec["csv"], spec.get("where")), key, a, spec["csv"])
        row_b = _row(_read(csv_b, spec.get("where")), key, b, csv_b)
        groups = [(float(r[f"{metric}_mean"]), float(r[f"{metric}_std"]), _seeds(r, metric))
                  for r in (row_a, row_b)]
        test = welch_test(*groups[0], *groups[1])
        text = (f"{groups[0][0] - groups[1][0]:+.3f} {metric} ({groups[0][0]:.3f} vs "
                f"{groups[1][0]:.3f}; Welch's {_t_text(test)}, {groups[0][2]} vs "
                f"{groups[1][2]} seeds")
    return text, test


def equivalence_clause(spec: Mapping[str, Any]) -> str:
    """"; TOST at ±m: p = ..., equivalent" for a Welch statistic with a ``margin``, else ""."""
    if "margin" not in spec:
        return ""
    key, metric, margin = spec.get("key", "experiment"), spec["metric"], float(spec["margin"])
    csv_b = spec.get("csv_b", spec["csv"])
    rows = (_row(_read(spec["csv"], spec.get("where")), key, spec["a"], spec["csv"]),
            _row(_read(csv_b, spec.get("where")), key, spec["b"], csv_b))
    groups = [(float(r[f"{metric}_mean"]), float(r[f"{metric}_std"]), _seeds(r, metric))
              for r in rows]
    return "; " + equivalence_text(equivalence_test(*groups[0], *groups[1], margin), margin)


def family_q_values(text: str) -> dict[int, tuple[float, int]]:
    """Benjamini-Hochberg q-values (scipy's ``false_discovery_control``) of the statistics of
    ``text`` that name a ``family``, by the start of their comment: the comparisons of one
    family (e.g. one table's baselines) are corrected together."""
    families: dict[str, list[tuple[int, float]]] = {}
    for match in _STAT.finditer(text):
        spec = yaml.safe_load("{" + match.group("spec") + "}")
        if "family" in spec:
            families.setdefault(str(spec["family"]), []).append(
                (match.start(), stat_test(spec)[1].p))
    found = {}
    for members in families.values():
        q = stats.false_discovery_control([p for _, p in members], method="bh")
        found.update({start: (float(value), len(members))
                      for (start, _), value in zip(members, q, strict=True)})
    return found


def render_choice(spec: Mapping[str, Any]) -> str:
    """A setting chosen on validation data: among ``labels`` (e.g. gammas), the one whose
    ``select`` column (a validation metric) has the highest mean, and its ``report`` column
    (the test metric) as mean ± std; with ``compare`` ({csv, key, metric}, or a list of them)
    Welch's t of the chosen setting's test metric against each such row's. With ``rows`` ({label: key}) the
    settings are rows of the CSV and ``select``/``report`` one metric each."""
    csv, key = spec["csv"], spec.get("key", "experiment")
    if "rows" in spec:  # settings as rows: {label: key}, one validation and one test metric
        frame = _read(csv)
        candidates = {label: _row(frame, key, value, csv) for label, value in spec["rows"].items()}
        means = [float(r[f"{spec['select']}_mean"]) for r in candidates.values()]
        best = int(np.argmax(means))
        label = list(candidates)[best]
        tied = [other for other, mean in zip(candidates, means, strict=True)
                if other != label and mean == means[best]]
        how = (f"tied at the highest validation value, {means[best]:.3f}, with "
               f"{', '.join(tied)}; a tie keeps the first listed" if tied
               else f"the highest validation value, {means[best]:.3f}")
        return (f"{spec.get('name', 'setting')} {label} ({how}); test "
                f"{_cell(candidates[label], spec['report'], csv)} at it")
    row = _row(_read(csv), key, spec["row"], csv)
    means = [float(row[f"{column}_mean"]) for column in spec["select"]]
    best = int(np.argmax(means))
    label, report = spec["labels"][best], spec["report"][best]
    text = (f"{spec.get('name', 'setting')} {label} (the highest mean validation value, "
            f"{means[best]:.3f}); test {_cell(row, report, csv)} at it")
    compares = spec.get("compare", [])
    for other in compares if isinstance(compares, list) else [compares]:
        base = _row(_read(other["csv"]), key, other["key"], other["csv"])
        a = (float(row[f"{report}_mean"]), float(row[f"{report}_std"]), _seeds(row, report))
        b = (float(base[f"{other['metric']}_mean"]), float(base[f"{other['metric']}_std"]),
             _seeds(base, other["metric"]))
        test = welch_test(*a, *b)
        text += (f"; against {other['key']}: {a[0] - b[0]:+.3f} ({a[0]:.3f} vs {b[0]:.3f}; "
                 f"Welch's {_t_text(test)}, {a[2]} vs {b[2]} seeds: {verdict(test)})")
    return text


def _check_closed(text: str) -> None:
    """Refuse a table spec without its ``<!-- /table -->`` before the next one: rendering would
    replace everything up to the next table's end, prose included."""
    opened = None
    for match in re.finditer(r"<!-- table\n|<!-- /table -->", text):
        if match.group(0) != "<!-- /table -->":
            if opened is not None:
                line = text.count("\n", 0, opened) + 1
                raise ValueError(f"the table at line {line} has no `<!-- /table -->` before the "
                                 "next table: close it (an empty line then `<!-- /table -->`)")
            opened = match.start()
        else:
            opened = None
    if opened is not None:
        line = text.count("\n", 0, opened) + 1
        raise ValueError(f"the table at line {line} has no `<!-- /table -->`: close it")


def render(text: str) -> str:
    """``text`` with every table and statistic re-rendered from the CSVs."""
    def table(match: re.Match[str]) -> str:
        return match.group(1) + render_table(yaml.safe_load(match.group("spec"))) + \
            match.group(4)

    _check_closed(text)
    tabled = _TABLE.sub(table, text)
    q_values = family_q_values(tabled)

    def stat(match: re.Match[str]) -> str:
        spec = yaml.safe_load("{" + match.group("spec") + "}")
        return match.group(1) + render_stat(spec, q_values.get(match.start())) + \
            match.group(4)

    def choice(match: re.Match[str]) -> str:
        spec = yaml.safe_load("{" + match.group("spec") + "}")
        return match.group(1) + render_choice(spec) + match.group(4)

    return _CHOOSE.sub(choice, _STAT.sub(stat, tabled))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if a doc differs from its rendering")
    args = parser.parse_args()
    stale = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        rendered = render(text)
        if rendered != text:
            stale.append(path.name)
            if not args.check:
                path.write_text(rendered)
    if stale:
        print(("differ from their rendering: " if args.check else "re-rendered: ")
              + ", ".join(stale))
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
