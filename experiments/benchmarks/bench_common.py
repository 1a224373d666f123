"""Helpers shared by the benchmark scripts (run them from the repository root; the scripts'
folder is on sys.path then)."""

from __future__ import annotations

import time
from pathlib import Path

from raysim.config import parse_config
from raysim.engine.runner import run_experiment
from raysim.results import load


def measure_raysim(raw: dict, output: Path) -> dict:
    """Run one raysim experiment; rounds per second from the first to the last round's end
    (round 0 and start-up excluded; start-up reported separately)."""
    started = time.perf_counter()
    outcome = run_experiment(parse_config(raw), output=str(output), progress=False)[0]
    total = time.perf_counter() - started
    rounds = load(outcome.run_dir)
    span = rounds["wall_time"].iloc[-1] - rounds["wall_time"].iloc[0]
    return {"raysim_rounds_per_s": (len(rounds) - 1) / span, "raysim_startup_s": total - span}
