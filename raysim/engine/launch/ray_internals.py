"""Every use raysim makes of Ray's private modules, in one place, each guarded.

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
from pathlib import Path
from typing import Any

CHECKED_WITH = "2.60"
"""The Ray version these uses were checked against."""

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


__all__ = ["CHECKED_WITH", "GCS_PROBE", "gpus_ray_will_detect", "node_class",
           "ray_address_file", "ray_constants_module", "services_module",
           "unreserved_cpus"]
