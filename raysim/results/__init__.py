"""Streaming Parquet results, run manifests, loading into pandas, and reports."""

from __future__ import annotations

from raysim.results.load import load, run_dirs

__all__ = ["load", "run_dirs"]
