"""A worker's setup for a run cannot race: on a host shared by seeds (several threads), the
calls the driver sends may run in any order, so FedBuff's schedule travels in the same call as
the worker's client groups."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from raysim.engine.run import driver as driver_module
from raysim.engine.run.driver import Driver
from raysim.engine.run.worker import ClientWorker


class _RecordingHandle:
    """A worker actor handle whose ``method.remote(...)`` calls are recorded, not run."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, method: str) -> Any:
        calls = self.calls
        return SimpleNamespace(remote=lambda *args: calls.append((method, args)) or {})


def _in_process_worker() -> Any:
    """What ``ClientWorker``'s setup calls touch of a configured worker."""
    runtime = SimpleNamespace(buffer_schedule=None, hold=lambda clients, cap: {})
    return SimpleNamespace(runtime=runtime, gpu_share=None, device=torch.device("cpu"))


def test_fedbuff_schedule_survives_the_setup_calls_arriving_in_any_order(monkeypatch, tmp_path):
    driver = object.__new__(Driver)
    driver.run_dir = tmp_path
    driver.spec = SimpleNamespace(clock=SimpleNamespace(system=SimpleNamespace(policy="fedbuff")))
    plan = SimpleNamespace(asynchronous=True,
                           buffer_schedule=lambda mask: f"schedule of {np.flatnonzero(mask)}")
    driver._planning = SimpleNamespace(result=lambda: plan)
    monkeypatch.setattr(driver_module.turns, "get", lambda calls: list(calls))
    monkeypatch.setattr(driver_module, "update_manifest", lambda *args, **kwargs: None)
    handles = [_RecordingHandle(), _RecordingHandle()]
    worker_of_client = np.array([0, 0, 1, 1])
    driver._send_groups(handles, np.array([0, 0, 1, 1]), worker_of_client)
    for w, handle in enumerate(handles):
        for order in (handle.calls, handle.calls[::-1]):  # as sent, and the other way round
            worker = _in_process_worker()
            for method, args in order:
                getattr(ClientWorker, method)(worker, *args)
            assert worker.runtime.buffer_schedule == \
                f"schedule of {np.flatnonzero(worker_of_client == w)}"
