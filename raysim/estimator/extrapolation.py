"""A third slice for ``raysim estimate`` (``--extrapolate KEY=LOW,HIGH``): a config whose round
is too long to probe because of one numeric setting (FedVCK's 5,000 condensation iterations, a
3D ResNet's epoch over every training volume) is probed twice, at two small values of that
setting, and its seconds per round and per evaluation are extended along the line through the
two probes to the config's own value.

The assumption, said with every such estimate: a round's cost grows linearly in the setting
(a fixed part plus a part per iteration, per training sample, ...). The slope comes from the
difference of two measured rounds, so LOW and HIGH must be far enough apart that the setting's
share of that difference dwarfs a round's noise (with a round of 100 s of fixed work, 10 and 20
iterations differ by a few seconds and the slope is noise; 10 and 210 do not). A line through
two noisy points can slope the wrong way; the extension is then held at the larger of the two
measurements, never below what was measured.

``dataset.train_subset`` is the data slice: where the config leaves it unset (the whole
training split), its own value is the split's size (:func:`raysim.estimator.estimate.own_value`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from raysim.errors import RaysimError

if TYPE_CHECKING:
    from raysim.configuration.experiment import ExperimentConfig

DATA_SLICE = "dataset.train_subset"


@dataclass(frozen=True)
class Extrapolation:
    """Probe at ``key`` = ``low`` and ``high``; extend to the config's own value."""

    key: str
    low: float
    high: float

    @classmethod
    def parse(cls, text: str) -> Extrapolation:
        """``KEY=LOW,HIGH`` (e.g. ``algorithm.iterations=10,210``), refused in one paragraph."""
        key, separator, values = text.partition("=")
        parts = [part.strip() for part in values.split(",")]
        try:
            low, high = (float(part) for part in parts)
        except ValueError:
            low = high = math.nan
        if not separator or "." not in key.strip() or not (0 < low < high):
            raise RaysimError(
                f"Invalid --extrapolate {text!r}: expected KEY=LOW,HIGH with a dotted config "
                "key and two positive numbers, LOW below HIGH, at which each variant is probed "
                "(e.g. --extrapolate algorithm.iterations=10,210 or --extrapolate "
                "dataset.train_subset=40,80). Pick values whose rounds take seconds here; the "
                "estimate extends the line through the two probes to the config's own value.")
        return cls(key.strip(), low, high)

    def value_in(self, config: ExperimentConfig) -> float | None:
        """The config's value of the key (None where the config has no such numeric key, or
        leaves it unset)."""
        value = _get(config, self.key.split("."))
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)

    def at(self, config: ExperimentConfig, value: float) -> ExperimentConfig:
        """``config`` with the key set to ``value``, as ``--set KEY=VALUE`` would set it (and
        validated as that would be)."""
        from raysim.configuration.experiment import with_overrides

        text = str(int(value)) if float(value).is_integer() else repr(float(value))
        return with_overrides(config, [f"{self.key}={text}"])

    def extend(self, at_low: float, at_high: float, own: float) -> float:
        """Seconds at the config's ``own`` value from those measured at LOW and HIGH: the line
        through the two, never below either measurement."""
        slope = (at_high - at_low) / (self.high - self.low)
        return max(at_high + slope * (own - self.high), at_low, at_high)

    def describe(self, extended: int, variants: int) -> str:
        """The line an estimate prints about the extension."""
        return (f"extrapolated: {extended} of {variants} variants were probed at {self.key} = "
                f"{self.low:g} and {self.high:g}, and their seconds per round and per "
                "evaluation extended along the line through the two probes to the config's own "
                "value, assuming a round's cost grows linearly in it (never below what was "
                "measured).")


def _get(node: Any, parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(node, BaseModel) or part not in type(node).model_fields:
            return None
        node = getattr(node, part)
    return node


__all__ = ["DATA_SLICE", "Extrapolation"]
