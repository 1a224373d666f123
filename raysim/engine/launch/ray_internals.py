"""Every use raysim makes of Ray's private modules, in one place, each guarded, and the four
patches of Ray's start (:func:`without_unused_ray_services`, :func:`prestarting`,
:func:`own_session`, :func:`loopback_only`) that use them.

Ray's public API has no way to do these, so raysim reaches into the modules below; they are
checked with Ray 2.60 (the version the test suite runs) and each degrades to what Ray does by
default when a Ray release moves or renames them, so an upgrade can cost speed, never a run:

- ``ray._private.node.Node``: the head processes a local Ray starts (raysim skips three it
  never uses);
- ``ray._private.services.start_ray_process``: the raylet's command line (how many worker
  processes it starts ahead of time);
- ``ray._private.services.ConsolePopen``: how Ray's head processes are started (in a session
  of their own, so a signal to raysim's process group reaches raysim alone);
- ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``: whether a local Ray takes the machine's
  network address or the loopback one (raysim's local Ray listens on loopback only);
- ``ray._private.accelerators``: the GPUs a local Ray would detect, without initialising CUDA;
- ``ray._private.state.available_resources_per_node``: the CPUs of a node no actor reserved;
- ``ray._common.utils.get_ray_address_file``: where `ray start` records its cluster;
- ``ray._raylet.GcsClient``: asking a GCS whether it is one (in a child process).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHECKED_WITH = "2.60"
"""The Ray version these uses were checked against: ``tests/test_ray_internals.py`` fails
on an older Ray, and on any Ray where one of them degraded (so an upgrade that moves one is
seen in the suite, not only as a slower start)."""

GCS_PROBE = """
import sys
from ray._raylet import GcsClient
client = GcsClient(address=sys.argv[1])
client.internal_kv_get(b"raysim-probe", None, timeout=float(sys.argv[2]))
"""
"""A script that exits 0 when a Ray GCS at ``argv[1]`` returns the cluster's ID and a key
within ``argv[2]`` seconds (Ray's client retries internally; the caller bounds the wait)."""


def node_class() -> Any | None:
    """Ray's ``Node`` class (None: a Ray without this layout)."""
    try:
        from ray._private.node import Node
    except ImportError:
        return None
    return Node


def services_module() -> Any | None:
    """Ray's ``services`` module, whose ``start_ray_process`` starts the raylet (None: a Ray
    without it)."""
    try:
        from ray._private import services
    except ImportError:
        return None
    return services if hasattr(services, "start_ray_process") else None


def ray_constants_module() -> Any | None:
    """Ray's ``ray_constants`` module when it has ``ENABLE_RAY_CLUSTER`` (None: a Ray without
    it)."""
    try:
        from ray._private import ray_constants
    except ImportError:
        return None
    return ray_constants if hasattr(ray_constants, "ENABLE_RAY_CLUSTER") else None


def gpus_ray_will_detect() -> float:
    """The GPUs a local Ray started now would find on this machine (Ray's own detection,
    ``CUDA_VISIBLE_DEVICES`` respected), without initialising CUDA in this process; 0 when
    this Ray cannot say."""
    try:
        from ray._private.accelerators import get_accelerator_manager_for_resource

        manager = get_accelerator_manager_for_resource("GPU")
        if manager is None:
            return 0.0
        count = manager.get_current_node_num_accelerators() or 0
        visible = manager.get_current_process_visible_accelerator_ids()
        return float(count if visible is None else min(count, len(visible)))
    except Exception:  # (a Ray without this layout, or a driver library that fails)
        return 0.0


def unreserved_cpus(node_id: str) -> float | None:
    """The CPUs of Ray node ``node_id`` that no actor reserved (None: this Ray cannot say)."""
    try:
        from ray._private.state import available_resources_per_node

        return float(available_resources_per_node().get(node_id, {}).get("CPU", 0.0))
    except Exception:
        return None


def ray_address_file() -> Path:
    """Where ``ray start`` records the address of the cluster it started on this machine
    (Ray's rule: ``$RAY_TMPDIR``, else ``$TMPDIR`` on Linux, else ``/tmp``, then
    ``ray/ray_current_cluster``)."""
    try:
        from ray._common.utils import get_ray_address_file

        return Path(get_ray_address_file(None))
    except ImportError:  # a Ray without this helper: its documented default
        base = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
        return Path(base) / "ray" / "ray_current_cluster"


# ----- the patches: each applies for the duration of a local Ray's start -----

UNUSED_RAY_SERVICES = ("start_api_server", "start_monitor", "start_log_monitor")
"""The head processes a local Ray starts that raysim never uses: the API server (with
``include_dashboard=False`` it only reports usage statistics, and ``ray.init`` waits for it to
come up before it starts the raylet), the autoscaler monitor (a local Ray has nothing to scale)
and the log monitor (it forwards worker output to the driver, which raysim turns off with
``log_to_driver=False``)."""


@contextmanager
def without_unused_ray_services() -> Iterator[None]:
    """Start the local Ray in the block without :data:`UNUSED_RAY_SERVICES`: three Python
    processes that import Ray (about 2 s of CPU on a 2-CPU machine, beside the worker processes
    importing torch) and a wait of about 1 s in ``ray.init``. ``ray.init`` has no option for
    them, so the block replaces the methods of Ray's ``Node`` that start them; a Ray whose
    ``Node`` lacks one starts that process as usual."""
    Node = node_class()
    if Node is None:  # a Ray without this layout: start everything
        yield
        return
    saved = {name: Node.__dict__[name] for name in UNUSED_RAY_SERVICES if name in Node.__dict__}

    def skip(self: Any, *args: Any, **kwargs: Any) -> None:
        self._webui_url = None  # what a head without an API server reports

    try:
        for name in saved:
            setattr(Node, name, skip)
        yield
    finally:
        for name, method in saved.items():
            setattr(Node, name, method)


PRESTART_FLAG = "--num_prestart_python_workers="
"""The raylet's command-line flag for how many worker processes it starts ahead of time
(with ``enable_worker_prestart``: as soon as it is up)."""


@contextmanager
def prestarting(count: int) -> Iterator[None]:
    """Have the raylet started in the block start ``count`` worker processes ahead of time.
    Ray starts one per CPU it is given, and a raysim Ray's preload makes each import torch and
    the engine (seconds of CPU, and 184 MiB of private memory each on the development
    machine): on a node with many CPUs, dozens of processes for a run that uses a few.
    ``ray.init`` has no option for it, so the block rewrites the flag in the raylet's command
    line as Ray's ``services.start_ray_process`` receives it; a Ray without that function or
    flag starts as many as it would."""
    services = services_module()
    if services is None:
        yield
        return
    original = services.start_ray_process

    def start(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == "raylet":
            command = [f"{PRESTART_FLAG}{count}" if part.startswith(PRESTART_FLAG) else part
                       for part in command]
        return original(command, process_type, *args, **kwargs)

    services.start_ray_process = start
    try:
        yield
    finally:
        services.start_ray_process = original


@contextmanager
def own_session() -> Iterator[None]:
    """Start the Ray processes of the block (the GCS and the raylet, which starts the workers)
    in a session of their own. A batch scheduler, ``timeout`` or ``docker stop`` signals a
    job's whole process group: Ray's processes in raysim's group would die at once (Ray blocks
    SIGINT in them, not SIGTERM), and raysim would wait on a GCS that is gone instead of
    stopping at the round boundary. Outside the group they die with raysim as before (Ray's
    fate sharing, and the watchdog on SIGKILL). ``ray.init`` has no option for it, so the
    block gives Ray's process class ``start_new_session``; a Ray without that class starts
    them as it would."""
    services = services_module()
    popen = getattr(services, "ConsolePopen", None)
    if services is None or not isinstance(popen, type):
        yield
        return

    class OwnSessionPopen(popen):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSessionPopen
    try:
        yield
    finally:
        services.ConsolePopen = popen


@contextmanager
def loopback_only() -> Iterator[None]:
    """Have the local Ray started in the block listen on the loopback interface only (its GCS,
    raylet, object manager and worker ports): a Ray of one process's own serves no other
    machine, and its ports on the machine's network address are open to anyone who can reach
    it. Ray takes the loopback address where its clusters are off (its default on macOS and
    Windows); the block turns them off while the local Ray starts. A Ray without that switch
    listens where it would."""
    constants = ray_constants_module()
    if constants is None:
        yield
        return
    before = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = before


__all__ = ["CHECKED_WITH", "GCS_PROBE", "PRESTART_FLAG", "UNUSED_RAY_SERVICES",
           "gpus_ray_will_detect", "loopback_only", "node_class", "own_session", "prestarting",
           "ray_address_file", "ray_constants_module", "services_module", "unreserved_cpus",
           "without_unused_ray_services"]
