"""A run's actors go back to the pool with a bounded wait: one that is gone (its process or its
node died) or does not answer is dropped, never a traceback after the results are written."""

from __future__ import annotations

import time


def test_a_dead_or_silent_actor_is_dropped_within_the_bound(ray_session):
    ray = ray_session
    from raysim.engine.pool.shared_actors import answering

    @ray.remote(num_cpus=0)
    class Resettable:
        def reset(self, pause: float = 0.0) -> None:
            time.sleep(pause)

        def slow_reset(self) -> None:
            time.sleep(30)

    alive, dead = Resettable.remote(), Resettable.remote()
    ray.get([alive.reset.remote(), dead.reset.remote()])
    ray.kill(dead)
    deadline = time.monotonic() + 30  # (ray.kill is asynchronous: wait until it has happened)
    while time.monotonic() < deadline:
        try:
            ray.get(dead.reset.remote(), timeout=5)
        except Exception:
            break
        time.sleep(0.2)
    assert answering([alive, dead], "reset") == [alive]
    began = time.monotonic()
    assert answering([alive], "slow_reset", timeout=1.0) == []  # silent: killed, left out
    assert time.monotonic() - began < 20
    assert answering([], "reset") == []
