"""One pool of worker and driver actors for every run of a process's Ray session.

Starting an actor costs a process and its imports (torch, raysim: seconds on a small machine),
so seeds, variants and sweep points of one invocation — and the runs of a test module — share
their actors: a run borrows workers of its resource shape (CPUs, GPUs, placement), configures
them for itself (:meth:`ClientWorker.configure`, which drops everything of the run before),
and gives them back when it ends. Results do not depend on which process served a run: every
random draw comes from a named stream (:mod:`raysim.seeding`), never from a process's history.

Seeds of one config that share workers (a seed group, :mod:`.seed_groups`) borrow worker *hosts*
(the ``hosted`` shape, :class:`~raysim.engine.pool.worker_host.WorkerHost`, one ``ClientWorker`` per
run inside) and one driver host for all of them.

Idle actors keep their resources reserved, so borrowing workers of another shape first frees
the idle ones. A run that failed gives back nothing: its actors are killed.

On a warm cluster (``raysim cluster start``) the actors are created detached: the pool takes
over the idle actors earlier invocations left with the cluster's keeper when its session
starts, and hands its own back at the end (:meth:`SharedActors.release`; :mod:`.keeper`).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import ray

from raysim.engine.pool import keeper as pool_keeper
from raysim.engine.pool.worker_host import MAX_RUNS_PER_HOST, WorkerHost
from raysim.engine.run.driver import DriverHost
from raysim.engine.run.worker import ClientWorker


@dataclass(frozen=True)
class WorkerShape:
    """The resources and scheduling of one run's workers."""

    cpus: float
    gpus: float
    spread: bool
    max_restarts: int
    hosted: bool = False
    """Worker processes shared by a seed group of runs (:class:`WorkerHost`), not one run's."""


class SharedActors:
    """Idle worker actors by shape and idle driver hosts, for the current Ray session."""

    def __init__(self) -> None:
        self._session: tuple[str, str] | None = None
        self._idle_workers: dict[WorkerShape, list[Any]] = defaultdict(list)
        self._idle_drivers: list[Any] = []
        self._keeper: Any = None

    def _check_session(self) -> None:
        """Forget actors of an earlier Ray session (after ``ray.shutdown``/``init``); on a warm
        cluster, take over the idle actors earlier invocations left there."""
        context = ray.get_runtime_context()
        session = (context.get_job_id(), context.get_node_id())
        if session != self._session:
            self._session = session
            self._idle_workers.clear()
            self._idle_drivers.clear()
            self._keeper = None
            from raysim.engine.launch.local_ray import joined_cluster

            if joined_cluster() is not None:
                self._take_over()

    def _take_over(self) -> None:
        from raysim.engine.launch.warm_cluster import NAMESPACE

        self._keeper = pool_keeper.keeper(NAMESPACE)
        taken = ray.get(self._keeper.hand_over.remote(pool_keeper.this_holder(),
                                                      pool_keeper.code_fingerprint()))
        pings = {handle.__ray_ready__.remote(): (shape, handle) for shape, handle in taken}
        answered, _ = ray.wait(list(pings), num_returns=len(pings), timeout=10)
        for ping, (shape, handle) in pings.items():
            try:  # an actor that died idle, or does not answer, is left out (and killed)
                ray.get(ping, timeout=0 if ping in answered else 0.01)
            except (ray.exceptions.RayError, TimeoutError):
                ray.kill(handle)
                continue
            if shape is None:
                self._idle_drivers.append(handle)
            else:
                self._idle_workers[shape].append(handle)

    def _created(self, actors: list[Any]) -> list[Any]:
        """New actors: on a warm cluster the keeper learns of them (it kills them if this
        process dies before handing them back)."""
        if self._keeper is not None:
            self._keeper.register.remote(pool_keeper.this_holder(), actors)
        return actors

    def _lifetime(self) -> dict[str, Any]:
        return {"lifetime": "detached"} if self._keeper is not None else {}

    def workers(self, shape: WorkerShape, count: int) -> list[Any]:
        """``count`` workers of ``shape``: idle ones first, then new actors (after freeing
        idle workers of other shapes, whose reserved resources the new ones may need)."""
        self._check_session()
        idle = self._idle_workers[shape]
        taken, self._idle_workers[shape] = idle[:count], idle[count:]
        missing = count - len(taken)
        if missing:
            self._free_other_shapes(shape)
            taken += self._new_workers(shape, missing)
        return taken

    def _free_other_shapes(self, shape: WorkerShape) -> None:
        for other in [s for s in self._idle_workers if s != shape]:
            for actor in self._idle_workers.pop(other):
                ray.kill(actor)

    def _new_workers(self, shape: WorkerShape, count: int) -> list[Any]:
        hosted = {"max_concurrency": MAX_RUNS_PER_HOST + 1} if shape.hosted else {}
        actor_class = ray.remote(WorkerHost if shape.hosted else ClientWorker).options(
            num_cpus=shape.cpus, num_gpus=shape.gpus, max_restarts=shape.max_restarts,
            scheduling_strategy="SPREAD" if shape.spread else "DEFAULT", **hosted,
            **self._lifetime())
        return self._created([actor_class.remote() for _ in range(count)])

    def _new_driver(self, node_strategy: Any) -> Any:
        return self._created([ray.remote(DriverHost).options(  # runs + progress queries
            num_cpus=0, max_concurrency=MAX_RUNS_PER_HOST + 1, scheduling_strategy=node_strategy,
            **self._lifetime()).remote()])[0]

    def prestart(self, shape: WorkerShape, workers: int, drivers: int, node_strategy: Any) -> None:
        """Have ``workers`` idle workers of ``shape`` and ``drivers`` idle driver hosts, starting
        the missing ones now (after freeing idle workers of other shapes, whose reserved
        resources they may need); runs borrow them later, their processes start meanwhile."""
        self._check_session()
        missing = workers - len(self._idle_workers[shape])
        if missing > 0:
            self._free_other_shapes(shape)
            self._idle_workers[shape].extend(self._new_workers(shape, missing))
        for _ in range(drivers - len(self._idle_drivers)):
            self._idle_drivers.append(self._new_driver(node_strategy))

    def give_back_workers(self, shape: WorkerShape, workers: list[Any]) -> None:
        """Workers of a finished run: reset (their run's data released) and kept idle; one
        that does not answer its reset (its process or node died) is dropped."""
        self._idle_workers[shape].extend(answering(workers, "reset"))

    def driver(self, node_strategy: Any) -> Any:
        """An idle driver host, or a new one pinned by ``node_strategy`` (the node where the
        results are written)."""
        self._check_session()
        if self._idle_drivers:
            return self._idle_drivers.pop()
        return self._new_driver(node_strategy)

    def give_back_driver(self, driver: Any) -> None:
        """A driver host whose run ended: reset and kept idle (dropped if it does not
        answer)."""
        self._idle_drivers.extend(answering([driver], "reset"))

    def release(self) -> None:
        """The invocation ends: on a warm cluster its idle actors go to the keeper for the
        next invocation (kept warm), otherwise they are killed (:meth:`clear`)."""
        if self._keeper is None or self._session is None:
            self.clear()
            return
        idle = [(shape, actor) for shape, actors in self._idle_workers.items()
                for actor in actors] + [(None, actor) for actor in self._idle_drivers]
        ray.get(self._keeper.take_back.remote(pool_keeper.this_holder(),
                                              pool_keeper.code_fingerprint(), idle))
        self._idle_workers.clear()
        self._idle_drivers.clear()
        self._session = self._keeper = None

    def clear(self) -> None:
        """Kill every idle actor (their resources return to the cluster)."""
        self.discard([actor for idle in self._idle_workers.values() for actor in idle]
                     + self._idle_drivers)
        self._idle_workers.clear()
        self._idle_drivers.clear()

    @staticmethod
    def discard(actors: list[Any]) -> None:
        """Kill actors of a failed run (they may hold a broken state); one that is gone
        already (its node died) needs nothing."""
        for actor in actors:
            with contextlib.suppress(Exception):  # (Ray raises several kinds for a gone actor)
                ray.kill(actor)


RESET_SECONDS = 60.0
"""How long an actor may take to answer its reset when a run gives it back."""


def answering(actors: list[Any], method: str, timeout: float = RESET_SECONDS) -> list[Any]:
    """The actors whose ``method`` call returns within ``timeout`` seconds; the others (dead,
    on a dead node, or hung) are killed and left out, so a lost node never stops an
    invocation that has already written its results."""
    if not actors:
        return []
    calls = [getattr(actor, method).remote() for actor in actors]
    ready, _ = ray.wait(calls, num_returns=len(calls), timeout=timeout)
    answered = set(ready)
    kept = []
    for actor, call in zip(actors, calls, strict=True):
        try:
            if call not in answered:
                raise TimeoutError(f"no answer to {method} within {timeout:g} s")
            ray.get(call)
        except Exception:  # (ActorDiedError, ActorUnavailableError, a node's death, ...)
            SharedActors.discard([actor])
        else:
            kept.append(actor)
    return kept


POOL = SharedActors()
"""This process's pool (one Ray session at a time)."""
