"""Whether a Ray cluster answers at an address, asked of its GCS with a bounded wait.

A TCP connect is not enough: Ray's ports are ephemeral, so another program may listen where a
dead cluster's record points, and ``ray.init`` against something that is not a GCS retries
for minutes. The probe asks the GCS, through Ray's own client, for the cluster's ID and one
key, in a child process that is killed when the time is up (Ray's client retries internally
and offers no overall timeout), so nothing here waits longer than ``timeout`` seconds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from raysim.engine.launch.ray_internals import GCS_PROBE

PROBE_SECONDS = float(os.environ.get("RAYSIM_PROBE_SECONDS", "10"))
"""How long a cluster's GCS may take to answer before it counts as not answering
(``RAYSIM_PROBE_SECONDS``, default 10)."""


def accepts_connections(address: str, timeout: float = 2.0) -> bool:
    """Whether anything accepts TCP connections at host:port (necessary, not sufficient, for
    a Ray GCS)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def gcs_answers(address: str, timeout: float | None = None) -> bool:
    """Whether a Ray GCS answers at host:port within ``timeout`` seconds (default
    :data:`PROBE_SECONDS`; the whole probe, connection and two requests included)."""
    timeout = PROBE_SECONDS if timeout is None else timeout
    if not accepts_connections(address, timeout=min(2.0, timeout)):
        return False
    try:
        subprocess.run([sys.executable, "-c", GCS_PROBE, address, str(timeout)], check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=timeout)
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError, OSError):
        return False
    return True


__all__ = ["PROBE_SECONDS", "accepts_connections", "gcs_answers"]
