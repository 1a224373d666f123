"""A warm local Ray cluster that outlives one ``raysim`` invocation (``raysim cluster start``).

Every ``raysim run`` that starts its own Ray pays for Ray's processes (GCS, raylet, agents) and
for new worker processes that import torch: seconds each on a small machine, before the first
round. ``raysim cluster start`` starts a local Ray once (``ray start --head --block`` in its
own session, with the raysim engine preloaded in its worker processes); later invocations on
this machine join it instead of starting their own Ray, and borrow the worker and driver
actors that earlier invocations left idle there (:mod:`raysim.engine.pool.keeper`), so their first
round starts after their own imports and data. ``raysim cluster stop`` ends it.

The cluster is described by ``cluster.json`` in :func:`state_directory`, beside ``ray start``'s
output; a record whose process is gone is stale and ignored. The cluster holds the machine's
CPU slots it was given (:mod:`raysim.engine.launch.cpu_slots`) for as long as it runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from raysim.engine.launch.bytecode import bytecode_settings
from raysim.engine.launch.cpu_slots import CpuSlots
from raysim.engine.launch.private_state import (
    private_directory,
    read_private_text,
    write_private_text,
)
from raysim.engine.launch.watchdog import start_time, start_watchdog
from raysim.errors import RaysimError

NAMESPACE = "raysim"
"""The Ray namespace of the cluster's long-lived actors (the pool keeper)."""

WORKER_MODULES = ("raysim.engine.run.worker", "raysim.engine.run.driver")
"""What the worker processes of a raysim Ray (a local one or the warm cluster) import before
they accept work (Ray's ``preload_python_modules``): the engine, and torch. Not torch._dynamo
(about 1.1 s of CPU): client workers import it when they are created
(:class:`raysim.engine.run.worker.ClientWorker`), driver hosts only if a run's server trains."""

PRELOAD_VARIABLE = "RAY_preload_python_modules"
"""The environment variable the raylet reads the preload list from when it starts."""

PRESTART_VARIABLE = "RAY_enable_worker_prestart"
"""The raylet's setting that starts its worker processes as soon as it is up, rather than
when the first driver connects (as many as its prestart count: one per CPU, or for a local
Ray what ``ray_internals.prestarting`` sets). Without it they are spawned only once
Ray's two agents have started (1-2 s after the raylet). The worker processes' import chain
(torch, the engine, then ``torch._dynamo`` in the client workers) is the critical path of a
cold command, so it starts that much earlier."""


STORE_CONNECT_SETTINGS = {"RAY_raylet_client_connect_timeout_milliseconds": "50",
                          "RAY_raylet_client_num_connect_attempts": "200"}
"""How long a raylet waits between attempts to connect to its own object store (and a worker
process to its raylet): 50 ms, with 200 attempts, so the total patience stays Ray's default
10 s (10 attempts, 1 s apart). The raylet starts the store in a thread and connects to it at
once; when the store is not listening yet, Ray's default waits a whole second. On a
2-CPU machine that happened in 7 of 15 starts of a local Ray (``ray.init`` 2.72-2.84 s
against 1.71-1.87 s), and in none of 15 with these settings, where 6 starts retried after
about 50 ms. A value the user set is kept."""


NICENESS_VARIABLE = "RAY_worker_niceness"
"""The raylet's niceness for the worker processes it starts. Ray's default is 15, below every
other program a user runs, so on a machine that is not idle a run's training yields its CPU
to anything else (BENCHMARKS.md, "Worker priority"). A raysim Ray starts its workers at 0,
the priority of the command that launched them; a value the user set is kept (15 to let a run
yield), and a cluster the user started keeps its own (raysim only joins it)."""

WORKER_NICENESS = "0"


def raylet_environment() -> dict[str, str]:
    """The settings a raysim Ray's raylet reads from its environment when it starts (a local
    Ray and the warm cluster alike): the preload list and the early prestart of its worker
    processes, the short wait between its attempts to connect to its object store
    (:data:`STORE_CONNECT_SETTINGS`; a Ray without a setting ignores it), the worker processes'
    niceness (:data:`NICENESS_VARIABLE`: the user's own priority unless they set one), and, for an
    environment that keeps no compiled bytecode, raysim's bytecode cache, which its worker
    processes inherit (:mod:`raysim.engine.launch.bytecode`)."""
    return {PRELOAD_VARIABLE: ",".join(WORKER_MODULES), PRESTART_VARIABLE: "1",
            NICENESS_VARIABLE: os.environ.get(NICENESS_VARIABLE, WORKER_NICENESS),
            **{name: os.environ.get(name, value) for name, value in STORE_CONNECT_SETTINGS.items()},
            **bytecode_settings()}


def state_directory() -> Path:
    """Where the cluster's record and ``ray start``'s output live (per user;
    ``RAYSIM_CLUSTER_DIR`` overrides it, e.g. to keep tests apart from a user's cluster)."""
    override = os.environ.get(STATE_VARIABLE)
    if override:
        return Path(override)
    return Path(tempfile.gettempdir()) / f"raysim-cluster-{os.getuid()}"


STATE_VARIABLE = "RAYSIM_CLUSTER_DIR"
"""The environment variable that moves :func:`state_directory`."""


@dataclass(frozen=True)
class ClusterInfo:
    """A running warm cluster: its address, the ``ray start`` process and its resources."""

    address: str
    pid: int
    pid_started: int
    cpus: int
    gpus: float | None
    """None: as Ray detected them."""
    started_at: float
    log: str
    ray_directory: str
    """Ray's temp dir (session files, sockets, logs), removed when the cluster stops."""


def _record() -> Path:
    return state_directory() / "cluster.json"


def is_running(pid: int, started: int | None) -> bool:
    """Whether process ``pid`` with start time ``started`` still runs (a zombie, which the
    container's init may reap late, does not)."""
    if started is None or start_time(pid) != started:
        return False
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def running_cluster() -> ClusterInfo | None:
    """The warm cluster of this machine and user, or None (no record, or its process is gone:
    the stale record is removed)."""
    directory = state_directory()
    if not directory.exists() and not directory.is_symlink():
        return None
    private_directory(directory, STATE_VARIABLE)  # (refuses a record another user planted)
    try:
        text = read_private_text(_record(), STATE_VARIABLE)
        if text is None:
            return None
        info = ClusterInfo(**json.loads(text))
    except (OSError, ValueError, TypeError):
        return None
    if not is_running(info.pid, info.pid_started):
        with contextlib.suppress(OSError):
            _record().unlink()
        return None
    return info


RAY_TOKEN = Path.home() / ".ray" / "auth_token"
"""Ray's authentication token, written by `ray start` and a local `ray.init`."""


def join_environment() -> None:
    """Set what a driver needs to connect to the warm cluster: Ray's token authentication,
    which ``ray start`` enables (the token is in ``~/.ray/auth_token``). Ray reads it when it
    is imported: :mod:`raysim.engine` calls this before importing Ray."""
    os.environ.setdefault("RAY_AUTH_MODE", "token")


def start_cluster(cpus: int | None = None, gpus: float | None = None,
                  timeout: float = 120.0) -> ClusterInfo:
    """Start the warm cluster with ``cpus`` CPUs (default: every CPU slot that no other raysim
    invocation holds) and ``gpus`` GPUs (default: Ray's detection); returns its record."""
    running = running_cluster()
    if running is not None:
        raise RaysimError(
            f"A raysim cluster is already running at {running.address} (pid {running.pid}, "
            f"{running.cpus} CPUs). `raysim run` joins it as it is; stop it first with "
            "`raysim cluster stop` to start one with other resources.")
    total = os.cpu_count() or 1
    wanted = total if cpus is None else cpus
    if wanted < 1 or wanted > total:
        raise RaysimError(
            f"Invalid --cpus {wanted}: this machine has {total} CPUs; give 1 to {total}.")
    slots = CpuSlots(total)
    try:
        held = slots.acquire(wanted, wanted, timeout=0, notify=lambda line: None)
    except TimeoutError:
        raise RaysimError(
            f"Cannot start a raysim cluster with {wanted} CPUs: other raysim invocations on this "
            "machine hold some of its CPUs. Wait for them to finish, or pass a smaller "
            "`--cpus`.") from None
    directory = private_directory(state_directory(), STATE_VARIABLE)
    # Ray's sockets live under its temp dir, and a socket path may hold at most 107 bytes
    session = Path(tempfile.mkdtemp(prefix="raysim-ray-"))
    log = directory / "ray-start.log"
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]  # (this Python's Ray, wherever
    # its console scripts were installed)
    command = [*ray_cli, "start", "--head", "--block",
               f"--temp-dir={session}", f"--num-cpus={held}", "--port=0",
               "--include-dashboard=false", "--disable-usage-stats",
               # (no autoscaler monitor or log monitor: see ray_internals.UNUSED_RAY_SERVICES)
               "--no-monitor", "--include-log-monitor=false"]
    if gpus is not None:
        command.append(f"--num-gpus={gpus:g}")
    environment = {**os.environ, **raylet_environment(), "RAY_AUTH_MODE": "token",
                   # listen on loopback only: the warm cluster serves this machine
                   "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    # `ray start` needs the token to exist (a local `ray.init` creates one, `ray start` does
    # not); this keeps an existing one
    subprocess.run([*ray_cli, "get-auth-token", "--generate"], capture_output=True,
                   env=environment, check=False)
    try:
        with open(log, "wb") as output:
            process = subprocess.Popen(  # the slots' lock files are inherited: held while it runs
                command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                start_new_session=True, env=environment,
                cwd=Path(__file__).resolve().parents[2], pass_fds=slots.file_descriptors())
    except BaseException:  # `ray start` did not start: nothing will use its directory
        shutil.rmtree(session, ignore_errors=True)
        raise
    finally:
        slots.release()  # (the child holds the locks now, or none was started)
    address_file = session / "ray_current_cluster"
    deadline = time.monotonic() + timeout
    while not address_file.is_file() or not address_file.read_text().strip():
        if process.poll() is not None or time.monotonic() > deadline:
            _terminate(process.pid)
            shutil.rmtree(session, ignore_errors=True)
            how = "exited" if process.poll() is not None else f"did not finish in {timeout:g} s"
            raise RaysimError(
                f"The raysim cluster did not start (`ray start` {how}); its output is in {log}. "
                "Fix what it reports, or run without a cluster (`raysim run` starts its own "
                "Ray).")
        time.sleep(0.2)
    start_watchdog(process.pid)  # removes what Ray leaves if `ray start` is SIGKILLed
    info = ClusterInfo(address=address_file.read_text().strip(), pid=process.pid,
                       pid_started=start_time(process.pid) or 0, cpus=held,
                       gpus=gpus, started_at=time.time(), log=str(log),
                       ray_directory=str(session))
    write_private_text(_record(), json.dumps(asdict(info)), STATE_VARIABLE)
    return info


def stop_cluster(timeout: float = 30.0) -> ClusterInfo | None:
    """Stop the warm cluster (its Ray processes and the actors in it); None if none ran."""
    info = running_cluster()
    if info is None:
        return None
    _terminate(info.pid, timeout)
    with contextlib.suppress(OSError):
        _record().unlink()
    shutil.rmtree(info.ray_directory, ignore_errors=True)
    return info


def _terminate(pid: int, timeout: float = 30.0) -> None:
    """SIGINT ``ray start --block``'s process group (its Ray processes share its fate), then
    SIGKILL what is left after ``timeout`` seconds and wait (up to 10 s) until it is gone.

    SIGINT, as Ctrl-C on the blocking command: ``ray start --block`` then stops its processes
    within about two seconds, where a SIGTERM to the group takes it about half a minute."""
    started = start_time(pid)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGINT)
    _wait_gone(pid, started, timeout)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    _wait_gone(pid, started, 10.0)


def _wait_gone(pid: int, started: int | None, timeout: float) -> None:
    """Poll until process ``pid`` (start time ``started``) no longer runs, at most ``timeout``
    seconds (reaping it when it is this process's child)."""
    deadline = time.monotonic() + timeout
    while is_running(pid, started) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
