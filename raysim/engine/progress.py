"""Progress of an invocation's runs, as tools show it: a bar per run on a terminal, otherwise
a quiet line every few rounds (tens of lines per run in a log, not hundreds) and one when a run
ends; the ETA from the time the run's rounds have taken so far (not from its start-up)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

LOG_LINES_PER_RUN = 10
"""About this many progress lines per run when the output is not a terminal."""


@dataclass
class _Pace:
    """When a run was first seen past a round boundary, and its latest round."""

    first: tuple[float, int] | None = None
    latest: tuple[float, int] | None = None
    logged: int = 0

    def seconds_per_round(self) -> float | None:
        if self.first is None or self.latest is None or self.latest[1] <= self.first[1]:
            return None
        return (self.latest[0] - self.first[0]) / (self.latest[1] - self.first[1])


@dataclass
class RunProgress:
    """Shows the runs ``keys`` (labels by key, total rounds by key) on ``stream``."""

    labels: dict[Hashable, str]
    rounds: dict[Hashable, int]
    show: bool = True
    stream: IO[str] = field(default_factory=lambda: sys.stderr)
    clock: Any = time.monotonic
    bars: dict[Hashable, Any] = field(default_factory=dict)
    paces: dict[Hashable, _Pace] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.terminal = self.show and bool(getattr(self.stream, "isatty", lambda: False)())
        if self.terminal:
            from tqdm import tqdm

            self.bars = {key: tqdm(total=self.rounds[key], desc=label, position=i,
                                   unit="round", file=self.stream, dynamic_ncols=True,
                                   leave=True, mininterval=0.5,
                                   bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} "
                                              "[{elapsed}{postfix}]")
                         for i, (key, label) in enumerate(self.labels.items())}
        self.paces = {key: _Pace() for key in self.labels}

    def every(self, key: Hashable) -> int:
        """Rounds between two log lines of a run."""
        return max(1, math.ceil(self.rounds[key] / LOG_LINES_PER_RUN))

    def eta(self, key: Hashable, round_: int) -> float | None:
        """Seconds left, from the measured time per round (None before two rounds are seen)."""
        per_round = self.paces[key].seconds_per_round()
        return None if per_round is None else per_round * (self.rounds[key] - round_)

    def update(self, key: Hashable, state: dict[str, Any]) -> None:
        """A run's latest progress (round, status, accuracy)."""
        round_, now = int(state["round"]), self.clock()
        pace = self.paces[key]
        if round_ > 0 and pace.first is None:
            pace.first = (now, round_)
        if round_ > 0:
            pace.latest = (now, round_)
        accuracy = state.get("accuracy", math.nan)
        eta = self.eta(key, round_)
        details = [state.get("status", "")]
        if not math.isnan(accuracy):
            details.append(f"acc {accuracy:.3f}")
        if eta is not None and round_ < self.rounds[key]:
            details.append(f"ETA {duration_text(eta)}")
        if self.terminal:
            bar = self.bars[key]
            bar.update(round_ - bar.n)
            bar.set_postfix_str(", ".join(d for d in details if d), refresh=False)
        elif self.show and round_ >= pace.logged + self.every(key) and round_ < self.rounds[key]:
            pace.logged = round_ - round_ % self.every(key)
            self._line(f"{self.labels[key]}: round {round_}/{self.rounds[key]}"
                       + "".join(f", {d}" for d in details[1:]))

    def finished(self, key: Hashable, error: str | None, seconds: float | None = None,
                 interrupted: int | None = None, stopped: str | None = None) -> None:
        """A run ended (``error``: why it failed; ``interrupted``: it stopped on request before
        this round, with a checkpoint; ``stopped``: why it ended before its configured rounds,
        e.g. its privacy budget)."""
        if self.terminal or not self.show:
            return
        took = "" if seconds is None else f" in {duration_text(seconds)}"
        if error:
            text = f"failed{took}: {error}"
        elif interrupted is not None:
            text = f"stopped before round {interrupted}{took} (rows and checkpoint written)"
        elif stopped is not None:
            text = f"stopped{took}: {stopped}"
        else:
            text = f"completed {self.rounds[key]} rounds{took}"
        self._line(f"{self.labels[key]}: {text}")

    def close(self) -> None:
        for bar in self.bars.values():
            bar.refresh()
            bar.close()

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


def duration_text(seconds: float) -> str:
    """A duration as people read it: seconds up to 90 s, minutes up to 90 min, then hours."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def labels_of(keys: Sequence[tuple[str, int]]) -> dict[Hashable, str]:
    """``[<variant> ]seed <s>`` for each run key (variant, seed)."""
    return {key: f"{key[0] + ' ' if key[0] else ''}seed {key[1]}" for key in keys}
