"""Grids of configurations: ``raysim sweep CONFIG --grid key=v1,v2 --seeds 0,1,2``."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from raysim.configuration.experiment import ExperimentConfig, load_experiments
from raysim.errors import ConfigError


def parse_grid(entries: list[str]) -> list[tuple[str, list[Any]]]:
    """``["key=v1,v2", ...]`` -> [(key, [v1, v2]), ...]; values are parsed as YAML scalars."""
    grid: list[tuple[str, list[Any]]] = []
    for entry in entries:
        key, separator, text = entry.partition("=")
        key = key.strip()
        texts = [t.strip() for t in text.split(",")]
        if not separator or not key or not all(texts):
            raise ConfigError(
                f"Invalid --grid {entry!r}: expected `--grid key=v1,v2,...` with a dotted config "
                "key and comma-separated values, e.g. `--grid training.optimizer.lr=0.01,0.1`."
            )
        if key in (k for k, _ in grid):
            raise ConfigError(f"Invalid --grid {entry!r}: the key {key!r} is given twice; list "
                              "all its values in one --grid.")
        if key in ("seeds", "name") or key.startswith(("variants", "output")):
            raise ConfigError(f"Invalid --grid {entry!r}: {key!r} cannot be swept (use --seeds "
                              "for seeds; output and name belong to the whole sweep).")
        grid.append((key, [yaml.safe_load(t) for t in texts]))
    return grid


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> [0, 1, 2]."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"Invalid --seeds {text!r}: expected comma-separated integers, "
                          "e.g. `--seeds 0,1,2`.") from None
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"Invalid --seeds {text!r}: a seed repeats; list each seed once.")
    return seeds


def grid_label(point: dict[str, Any]) -> str:
    """A directory-safe label of a grid point, named by the keys' last components when those
    are unique (``lr=0.1,mu=0.01``), else by the full dotted keys."""
    short = [key.rsplit(".", 1)[-1] for key in point]
    names = short if len(set(short)) == len(short) else list(point)
    text = ",".join(f"{name}={_format(value)}" for name, value in zip(names, point.values(),
                                                                          strict=True))
    return re.sub(r"[^A-Za-z0-9_.,=+-]", "_", text)


def _format(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def sweep_experiments(path: str | Path, grid: list[tuple[str, list[Any]]], seeds: list[int] | None,
                      overrides: list[str] | None = None, plugins: Sequence[str] = ()
                      ) -> tuple[dict[str, ExperimentConfig], dict[str, dict[str, Any]]]:
    """Every combination of the grid (times the config's variants, if any), each validated.

    Returns the experiments by label and, per label, the manifest fields ``grid`` (key ->
    value) and ``variant``.
    """
    if not grid:
        raise ConfigError("`raysim sweep` needs at least one `--grid key=v1,v2`; to run one "
                          "configuration use `raysim run`.")
    experiments: dict[str, ExperimentConfig] = {}
    labels: dict[str, dict[str, Any]] = {}
    base = list(overrides or []) + ([f"seeds=[{', '.join(map(str, seeds))}]"] if seeds else [])
    for values in itertools.product(*(v for _, v in grid)):
        point = dict(zip((k for k, _ in grid), values, strict=True))
        entries = [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip()}"
                   for k, v in point.items()]
        label = grid_label(point)
        try:
            variants = load_experiments(path, [*base, *entries], plugins)
        except ConfigError as error:
            raise ConfigError(f"In the grid point {label}: {error}") from None
        for variant, config in variants.items():
            full = f"{label}+{variant}" if variant else label
            experiments[full] = config
            labels[full] = {"grid": point, "variant": variant or None}
    return experiments, labels
