"""The Ray this suite runs still has every private module raysim reaches into
(``raysim/engine/launch/ray_internals.py``): each use degrades silently to Ray's default at
run time, so an upgrade that moves one must fail here instead."""

from __future__ import annotations

import ray

from raysim.engine.launch import ray_internals


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2])


def test_the_installed_ray_is_at_least_the_checked_one():
    assert _version(ray.__version__) >= _version(ray_internals.CHECKED_WITH), (
        f"Ray {ray.__version__} is older than the {ray_internals.CHECKED_WITH} that "
        "ray_internals.py was checked with")


def test_every_private_use_is_there_in_this_ray():
    node = ray_internals.node_class()
    assert node is not None
    assert all(name in node.__dict__ for name in ray_internals.UNUSED_RAY_SERVICES)
    services = ray_internals.services_module()
    assert services is not None and isinstance(getattr(services, "ConsolePopen", None), type)
    assert ray_internals.ray_constants_module() is not None
    from ray._common.utils import get_ray_address_file  # noqa: F401
    from ray._private.accelerators import get_accelerator_manager_for_resource  # noqa: F401
    from ray._private.state import available_resources_per_node  # noqa: F401
    from ray._raylet import GcsClient  # noqa: F401
    assert ray_internals.ray_address_file().name == "ray_current_cluster"


def test_the_patches_restore_what_they_replace():
    node = ray_internals.node_class()
    services = ray_internals.services_module()
    constants = ray_internals.ray_constants_module()
    before = ({name: node.__dict__[name] for name in ray_internals.UNUSED_RAY_SERVICES},
              services.start_ray_process, services.ConsolePopen, constants.ENABLE_RAY_CLUSTER)
    with (ray_internals.without_unused_ray_services(), ray_internals.prestarting(1),
          ray_internals.own_session(), ray_internals.loopback_only()):
        assert services.ConsolePopen is not before[2]
        assert constants.ENABLE_RAY_CLUSTER is False
    after = ({name: node.__dict__[name] for name in ray_internals.UNUSED_RAY_SERVICES},
             services.start_ray_process, services.ConsolePopen, constants.ENABLE_RAY_CLUSTER)
    assert after == before
