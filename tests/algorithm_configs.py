"""The per-algorithm configurations of the metrics fingerprint
(``experiments/benchmarks/algorithm_configs.py``), which the contract tests run too."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SOURCE = Path(__file__).resolve().parents[1] / "experiments" / "benchmarks" / "algorithm_configs.py"
_SPEC = importlib.util.spec_from_file_location("benchmark_algorithm_configs", _SOURCE)
assert _SPEC is not None and _SPEC.loader is not None
_MODULE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MODULE)

CONFIGS = _MODULE.CONFIGS
HETERO = _MODULE.HETERO
contract_raw = _MODULE.contract_raw

__all__ = ["CONFIGS", "HETERO", "contract_raw"]
