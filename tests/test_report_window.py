"""A metric that alternates between rounds, reported over both parities: the last rounds
evaluated (``evaluation.final_rounds``) and their mean (``raysim report --window``)."""

from __future__ import annotations

import pandas as pd
import pytest

from raysim.errors import RaysimError
from raysim.results.report import final_metrics, summary_table
from raysim.rounds.round_callbacks import EvaluationSchedule


def test_the_schedule_evaluates_each_of_the_last_rounds():
    schedule = EvaluationSchedule(every=10, rounds=30, evaluate=lambda state, r: None, final=2)
    assert [r for r in range(30) if schedule.due(r)] == [9, 19, 28, 29]
    once = EvaluationSchedule(every=10, rounds=30, evaluate=lambda state, r: None)
    assert [r for r in range(30) if once.due(r)] == [9, 19, 29]


def _rounds() -> pd.DataFrame:
    rows = []
    for seed in (0, 1):  # accuracy alternates: 0.86 after an even round count, 0.80 after odd
        for round_ in (9, 18, 19):
            rows.append({"experiment": "fedavg_b1", "algorithm": "fedavg", "seed": seed,
                         "run": f"fedavg_b1/seed_{seed}", "round": round_,
                         "accuracy": 0.86 if round_ % 2 else 0.80, "loss": float(round_),
                         "status": "completed", "rounds": 20})
    return pd.DataFrame(rows)


def test_window_averages_each_runs_last_evaluations():
    last = final_metrics(_rounds())
    assert last["accuracy"].tolist() == [0.86, 0.86]
    both = final_metrics(_rounds(), window=2)
    assert both["accuracy"].tolist() == pytest.approx([0.83, 0.83])
    assert both["round"].tolist() == [19, 19] and both["loss"].tolist() == [18.5, 18.5]
    summary = summary_table(_rounds(), ["accuracy"], window=2)
    assert summary["accuracy_mean"].iloc[0] == pytest.approx(0.83)


def test_a_window_longer_than_the_evaluations_is_refused():
    with pytest.raises(RaysimError, match=r"evaluation\.final_rounds >= 4"):
        final_metrics(_rounds(), window=4)
    with pytest.raises(RaysimError, match="--checkpoint last"):
        final_metrics(_rounds(), checkpoint="best", window=2)
