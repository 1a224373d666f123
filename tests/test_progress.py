"""Progress as tools show it: bars only on a terminal, otherwise tens of
quiet lines per run, and an ETA from the measured time per round."""

from __future__ import annotations

import io

from raysim.engine.progress import RunProgress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_tens_of_lines_and_an_eta_from_the_time_per_round():
    stream, clock = io.StringIO(), Clock()
    progress = RunProgress({"a": "seed 0"}, {"a": 200}, show=True, stream=stream, clock=clock)
    clock.now = 100.0  # start-up: 100 s before the first round ends
    for round_ in range(1, 201):
        progress.update("a", {"round": round_, "status": "running", "accuracy": 0.5})
        if round_ == 3:
            assert progress.eta("a", 3) == 40.0 * 197  # 40 s per round, not start-up / rounds
        clock.now += 40.0
    progress.finished("a", None, 8100.0)
    lines = stream.getvalue().splitlines()
    assert 8 <= len(lines) <= 12, lines
    assert lines[-1] == "seed 0: completed 200 rounds in 2.2 h"
    assert "round 20/200, acc 0.500, ETA 2.0 h" in lines[0]


def test_bars_only_on_a_terminal():
    terminal = Terminal()
    progress = RunProgress({"a": "seed 0"}, {"a": 10}, show=True, stream=terminal)
    assert progress.terminal and progress.bars
    for round_ in range(1, 11):
        progress.update("a", {"round": round_, "status": "running"})
    progress.finished("a", None)
    progress.close()
    assert "seed 0" in terminal.getvalue() and "completed" not in terminal.getvalue()
    quiet = io.StringIO()
    silent = RunProgress({"a": "seed 0"}, {"a": 10}, show=False, stream=quiet)
    for round_ in range(1, 11):
        silent.update("a", {"round": round_, "status": "running"})
    silent.finished("a", "boom")
    assert not silent.bars and quiet.getvalue() == ""
