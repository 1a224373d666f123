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

PROBE_SECONDS = 10.0
"""How long a cluster's GCS may take to answer on an idle machine before it counts as not
answering (see :func:`probe_seconds`)."""
MOST_PROBE_SECONDS = 60.0
"""The longest the load may stretch the probe to."""


def probe_seconds() -> float:
    """The probe's bound: ``RAYSIM_PROBE_SECONDS`` when set, else :data:`PROBE_SECONDS`
    stretched by the machine's load per CPU (a GCS on a machine with three runnable processes
    a CPU answers about three times slower), at most :data:`MOST_PROBE_SECONDS`."""
    given = os.environ.get("RAYSIM_PROBE_SECONDS")
    if given:
        try:
            return max(float(given), 0.5)
        except ValueError:
            pass
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        load = 1.0
    return min(PROBE_SECONDS * max(1.0, load), MOST_PROBE_SECONDS)


def probe_hint() -> str:
    """How the user gives a slow cluster longer (the end of a paragraph about the probe)."""
    return (f"the probe waited {probe_seconds():.0f} s (it grows with the machine's load; "
            "set RAYSIM_PROBE_SECONDS to wait longer)")


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
    :func:`probe_seconds`; the whole probe, connection and two requests included)."""
    timeout = probe_seconds() if timeout is None else timeout
    if not accepts_connections(address, timeout=min(2.0, timeout)):
        return False
    try:
        subprocess.run([sys.executable, "-c", GCS_PROBE, address, str(timeout)], check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=timeout)
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError, OSError):
        return False
    return True


__all__ = ["MOST_PROBE_SECONDS", "PROBE_SECONDS", "accepts_connections", "gcs_answers",
           "probe_hint", "probe_seconds"]
