"""How long each start-up phase of a run took, from the times its manifest records."""

from __future__ import annotations

from typing import Any


def startup_phases(manifest: dict[str, Any]) -> dict[str, float] | None:
    """Seconds spent in each start-up phase of a run, from its manifest: ``imports`` (from the
    command's start to the runner: Python, raysim, the config; torch too unless Ray started
    alongside), ``data`` (load, checksum, partition, model check; with Ray alongside, also the
    engine's imports), ``ray`` (start or join Ray), ``workers`` (from Ray and the data being
    ready to the run's workers being configured: process start, imports, model warm-up; near
    zero for pooled ones) and ``first_round`` (from the command to the first round's
    dispatch); ``cpu_wait`` is the time spent waiting for CPUs that another raysim invocation
    held (not counted in ``ray``); ``alongside`` is 1 when Ray started beside the imports and
    the data (:func:`raysim.engine.launch.local_ray.start_alongside`), else 0; ``joined`` is 1 when the
    invocation joined a warm cluster (``raysim cluster start``), else 0; ``compile_step`` is the
    longest time a worker spent compiling its training step before the first round
    (``engine.compile_step``; part of ``first_round``), else 0. A resumed run's record is its
    resuming command's. None for runs without the record."""
    startup = manifest.get("startup")
    ready, dispatched = manifest.get("workers_ready_at"), manifest.get("first_dispatch_at")
    if not startup or ready is None or dispatched is None:
        return None
    alongside = "ray_started_at" in startup
    entered = startup.get("ray_started_at", startup.get("entered_at", startup["command_at"]))
    ray_from = startup["ray_started_at"] if alongside else startup["prepared_at"]
    cpu_wait = float(startup.get("cpu_wait_s", 0.0))
    return {"imports": entered - startup["command_at"],
            "data": startup["prepared_at"] - entered,
            "ray": startup["ray_ready_at"] - ray_from - cpu_wait, "cpu_wait": cpu_wait,
            "workers": ready - max(startup["ray_ready_at"], startup["prepared_at"]),
            "alongside": float(alongside), "joined": float(startup.get("joined", 0.0)),
            "compile_step": max((float(w.get("step_compile_s", 0.0))
                                 for w in manifest.get("worker_data") or []), default=0.0),
            "first_round": dispatched - startup["command_at"]}
