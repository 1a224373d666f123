"""The algorithm contract, over every registered algorithm (Ray-free, tests/inprocess.py):

- client-side and server-side hooks keep nothing on the algorithm object between rounds that
  the results depend on (what must survive goes into the server state, the messages or the
  client states): new objects every round give the same numbers;
- server and client states survive a pickle round-trip (a checkpoint, a restarted worker);
- results do not depend on how clients are grouped for the per-worker reduce (up to float
  summation order).
"""

from __future__ import annotations

import dataclasses

import pytest
from algorithm_configs import CONFIGS, contract_raw
from inprocess import check_contract, same, simulate

from raysim.algorithms import ALGORITHMS
from raysim.algorithms.supports import Supports
from raysim.configuration.experiment import parse_config
from raysim.errors import ConfigError
from raysim.layers.client_dp import check as check_privacy
from raysim.layers.simulated_clock import check as check_system

SEGMENTATION_ONLY = {"lcfed": "test_lcfed.py"}
"""Methods defined on masks only, whose contract check runs on the segmentation fixture in
their own test file."""


def test_every_registered_algorithm_is_covered():
    shipped = {name for name, cls in ALGORITHMS.items() if cls.__module__.startswith("raysim.")}
    # (plug-ins a test imported have their own tests)
    assert set(CONFIGS) | set(SEGMENTATION_ONLY) == shipped


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_results_survive_new_objects_states_through_a_checkpoint_file_and_other_groupings(data_root, name):
    check_contract(parse_config(contract_raw(data_root, name)))


LAYERED = {  # an algorithm inside the layers a run composes around it
    "fedavg under central DP": ("fedavg", {"privacy": {"clip": 0.5, "noise_multiplier": 0.8,
                                                       "delta": 1e-3}}),
    "fedprox under central DP with adaptive clipping": (
        "fedprox", {"privacy": {"clip": 0.5, "noise_multiplier": 0.8, "delta": 1e-3,
                                "adaptive_clip": {"count_noise_std": 1.0}}}),
    "fedavg under local DP": ("fedavg", {"privacy": {"clip": 0.5, "noise_multiplier": 0.8,
                                                     "delta": 1e-3, "mode": "local"}}),
    "fedprox under FedBuff": ("fedprox", {"system": {"tiers": {"cpu_server": 0.5,
                                                               "constrained_site": 0.5},
                                                     "policy": "fedbuff", "buffer_size": 2},
                                          "partition": {"scheme": "iid", "num_clients": 6}}),
    "fedavg with FedAdam's server step": ("fedavg", {"server_optimizer": {"name": "adam"}}),
    "fedprox with FedAvgM's server step under central DP": (
        "fedprox", {"server_optimizer": {"name": "sgd", "momentum": 0.9, "lr": 0.5},
                    "privacy": {"clip": 0.5, "noise_multiplier": 0.8, "delta": 1e-3}}),
    "fedavg under FedBuff with FedYogi's server step": (
        "fedavg", {"server_optimizer": {"name": "yogi"},
                   "system": {"tiers": {"cpu_server": 0.5, "constrained_site": 0.5},
                              "policy": "fedbuff", "buffer_size": 2},
                   "partition": {"scheme": "iid", "num_clients": 6}}),
}


@pytest.mark.parametrize("label", sorted(LAYERED))
def test_layered_algorithms_keep_the_contract(data_root, label):
    name, sections = LAYERED[label]
    raw = contract_raw(data_root, name)
    raw.update(sections)
    config = parse_config(raw)
    reference = simulate(config)
    assert type(reference.algorithm).__name__ != type(reference.algorithm.inner).__name__
    restarted = simulate(config, fresh_objects=True)
    assert same(reference.server_state, restarted.server_state, exact=True)
    assert reference.metrics == restarted.metrics
    regrouped = simulate(config, group_size=3)
    assert same(reference.server_state, regrouped.server_state, exact=False)


def test_every_method_declares_what_it_supports_in_one_place():
    """One :class:`Supports` per method, no capability or refusal left as a class variable of
    its own (nor inherited from one), and every refusal one clause a paragraph can quote."""
    names = {field.name for field in dataclasses.fields(Supports)}
    for name, algorithm_class in ALGORITHMS.items():
        assert isinstance(algorithm_class.supports, Supports), name
        for klass in algorithm_class.__mro__:
            assert not names & set(vars(klass)), (name, klass, names & set(vars(klass)))
        for field in names:
            value = getattr(algorithm_class.supports, field)
            assert isinstance(value, bool | str | None), (name, field)
            if isinstance(value, str):
                assert value.strip() == value and value and not value.endswith(".") \
                    and "\n" not in value, (name, field, value)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_method_declares_whether_it_takes_privacy_and_fedbuff(data_root, name):
    """DP and FedBuff are taken by declaring ``mean_uploads`` (or, for DP, a method's own
    ``private_releases``); every other method refuses each with its own stated reason."""
    algorithm_class = ALGORITHMS[name]
    private = contract_raw(data_root, name)
    private["privacy"] = {"clip": 1.0, "noise_multiplier": 1.0, "mode": "local"}
    if algorithm_class.mean_uploads or algorithm_class.supports.private_releases:
        check_privacy(parse_config(private))
    else:
        with pytest.raises(ConfigError, match="Invalid config section `privacy`") as error:
            check_privacy(parse_config(private))
        assert algorithm_class.supports.privacy_refusal in str(error.value)
    buffered = contract_raw(data_root, name)
    buffered["system"] = {"tiers": {"cpu_server": 1}, "policy": "fedbuff", "buffer_size": 2}
    if algorithm_class.mean_uploads:
        check_system(parse_config(buffered))
    elif not algorithm_class.pooled:
        with pytest.raises(ConfigError, match="needs synchronous rounds") as error:
            check_system(parse_config(buffered))
        assert str(algorithm_class.supports.asynchronous_refusal) in str(error.value)


@pytest.mark.parametrize("name", sorted(name for name, algorithm in ALGORITHMS.items()
                                         if algorithm.supports.cross_entropy_only))
def test_a_method_defined_with_cross_entropy_refuses_another_loss(data_root, name):
    raw = contract_raw(data_root, name)
    raw["training"] = {**raw["training"], "loss": "hinge"}
    with pytest.raises(ConfigError, match=r"training\.loss is 'hinge'\. Set training\.loss: "
                                          r"cross_entropy for "):
        simulate(parse_config(raw))
