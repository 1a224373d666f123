"""Sites that differ in speed, bandwidth and availability: the simulated clock, its
policies (sync, deadline, over-selection, FedBuff), the results it writes and the refusals."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from conftest import run_tables, small_federation
from test_bad_input import run_cli

from raysim.system.clock import LATE, OFFLINE, SURPLUS, TRAINED, Workload, synchronous_plan
from raysim.system.fedbuff_clock import fedbuff_plan, staleness_weight
from raysim.system.profiles import HOUR, Availability, OnlineMask, SiteProfile, read_trace

MB = 1e6


def _profiles(*speeds_down_up, availability=None) -> list[SiteProfile]:
    return [SiteProfile(speed, down, up, (availability or {}).get(c, Availability()))
            for c, (speed, down, up) in enumerate(speeds_down_up)]


def test_a_hand_computed_clock_for_three_sites():
    # 2 MB of model each way; training 30, 60 and 90 GFLOPs at 10, 20 and 30 GFLOP/s
    profiles = _profiles((10.0, 16.0, 8.0), (20.0, 8.0, 16.0), (30.0, 32.0, 32.0))
    workload = Workload(np.array([30.0, 60.0, 90.0]), 2 * MB, 2 * MB)
    # site 0: 1 s down + 3 s compute + 2 s up = 6 s; site 1: 2 + 3 + 1 = 6 s; site 2: 0.5 + 3
    # + 0.5 = 4 s; a synchronous round waits for the slowest
    plans = synchronous_plan(profiles, workload, 2, 3, "sync", seed=0)
    first = plans[0]
    assert first.clients.tolist() == [0, 1, 2]
    assert (first.download_s.tolist(), first.compute_s.tolist(), first.upload_s.tolist()) == (
        [1.0, 2.0, 0.5], [3.0, 3.0, 3.0], [2.0, 1.0, 0.5])
    assert first.finish == pytest.approx([6.0, 6.0, 4.0])
    assert (plans[0].start, plans[0].end, plans[1].start, plans[1].end) == (0.0, 6.0, 6.0, 12.0)


def test_a_site_outside_its_window_never_trains_in_it():
    night = Availability(((0.0, 2 * HOUR),), 24 * HOUR)  # 2 hours of every 24
    profiles = _profiles((1.0, 100.0, 100.0), (1.0, 100.0, 100.0),
                         availability={1: night})
    workload = Workload(np.array([3600.0, 3600.0]), 1e3, 1e3)  # one hour of compute each
    plans = synchronous_plan(profiles, workload, 30, 2, "sync", seed=0)
    statuses = set()
    for plan in plans:
        for start, finish, outcome in zip(plan.starts[plan.clients == 1],
                                          plan.finish[plan.clients == 1],
                                          plan.outcomes[plan.clients == 1], strict=True):
            window = night.window_at(start)
            assert window is not None
            if outcome == TRAINED:  # and finished inside the same window
                assert finish <= window[1]
            statuses.add(str(outcome))
    assert TRAINED in statuses and OFFLINE in statuses  # it starts late in a window sometimes
    assert any(1 not in plan.clients for plan in plans)


def test_fedbuff_drops_a_site_whose_window_closes_before_it_finishes():
    night = Availability(((0.0, 2 * HOUR),), 24 * HOUR)  # 2 hours of every 24
    profiles = _profiles((1.0, 100.0, 100.0), (1.0, 100.0, 100.0), (1.0, 100.0, 100.0),
                         availability={1: night})
    workload = Workload(np.full(3, 3600.0), 1e3, 1e3)  # one hour of compute each
    plans = fedbuff_plan(profiles, workload, 30, buffer_size=2, concurrency=3, exponent=0.5,
                         seed=0)
    outcomes = set()
    for plan in plans:
        site = plan.clients == 1
        for start, finish, outcome in zip(plan.starts[site], plan.finish[site],
                                          plan.outcomes[site], strict=True):
            window = night.window_at(start)
            assert window is not None  # it only starts inside its window
            assert (outcome == TRAINED) == (finish <= window[1])  # dropped iff it overruns
            outcomes.add(str(outcome))
    assert outcomes == {TRAINED, OFFLINE}


def test_a_round_whose_every_client_drops_ends_when_the_last_one_dropped():
    first_hour = Availability(((0.0, HOUR),), 24 * HOUR)
    profiles = _profiles((1.0, 100.0, 100.0), (1.0, 100.0, 100.0),
                         availability={0: first_hour, 1: first_hour})
    workload = Workload(np.full(2, 2 * 3600.0), 1e3, 1e3)  # two hours each: both drop at 1 h
    plan = synchronous_plan(profiles, workload, 1, 2, "sync", seed=0)[0]
    assert (plan.outcomes == OFFLINE).all()
    assert plan.end == pytest.approx(HOUR)  # not their would-be finish after two hours


def test_fedbuff_frees_a_dropped_clients_slot_when_it_drops():
    profiles = _profiles((1.0, 100.0, 100.0), (1.0, 100.0, 100.0), availability={
        0: Availability(((0.0, HOUR),), 24 * HOUR),  # drops at 1 h (two hours of work)
        1: Availability(((0.5 * HOUR, 20 * HOUR),), 24 * HOUR)})  # online from 0.5 h
    workload = Workload(np.array([2 * 3600.0, 3600.0]), 1e3, 1e3)
    plan = fedbuff_plan(profiles, workload, 1, buffer_size=1, concurrency=1, exponent=0.5,
                        seed=0)[0]
    assert plan.outcomes.tolist() == [TRAINED, OFFLINE] and plan.clients.tolist() == [1, 0]
    assert plan.starts[0] == pytest.approx(HOUR)  # site 1 takes the slot when site 0 dropped
    assert plan.end == pytest.approx(2 * HOUR, abs=1.0)


def test_fedbuff_fills_free_slots_with_a_uniform_draw_of_the_idle_sites():
    # ten equal, always-available sites: every start is a seeded draw among the idle ones, so
    # each site starts about equally often (a draw that favours the lowest ids, or keeps the
    # idle sites' order, starts site 0 every time), and the site that just arrived starts
    # again next with chance 1/10 (a fixed rotation through the candidates never repeats)
    profiles = _profiles(*[(1.0, 100.0, 100.0)] * 10)
    workload = Workload(np.full(10, 1.0), 1e3, 1e3)
    one_slot = fedbuff_plan(profiles, workload, 400, buffer_size=1, concurrency=1,
                            exponent=0.5, seed=0)  # every arrival frees the one slot
    sequence = np.array([int(plan.clients[0]) for plan in one_slot])
    counts = np.bincount(sequence, minlength=10)
    assert counts.min() >= 20 and counts.max() <= 60  # 40 expected each (sd 6)
    repeats = int((sequence[1:] == sequence[:-1]).sum())
    assert 20 <= repeats <= 60  # 39.9 expected (sd 6)
    other_seed = fedbuff_plan(profiles, workload, 400, buffer_size=1, concurrency=1,
                              exponent=0.5, seed=1)
    assert [int(plan.clients[0]) for plan in other_seed] != sequence.tolist()
    first_buffers = [fedbuff_plan(profiles, workload, 1, buffer_size=3, concurrency=3,
                                  exponent=0.5, seed=seed)[0].clients for seed in range(200)]
    counts = np.bincount(np.concatenate(first_buffers), minlength=10)  # 3 of 10 at start
    assert all(len(set(clients.tolist())) == 3 for clients in first_buffers)
    assert counts.min() >= 30 and counts.max() <= 90  # 60 expected each (sd 6.5)


def test_the_records_computed_for_the_whole_plan_are_each_rounds_rows():
    from raysim.system.records import ClockRecords

    night = Availability(((0.0, 2 * HOUR),), 24 * HOUR)
    profiles = _profiles(*[(1.0 + c, 100.0, 50.0) for c in range(8)],
                         availability={1: night, 4: night})
    workload = Workload(np.full(8, 3600.0), 1e3, 1e3)
    tiers = np.array([f"tier{c % 3}" for c in range(8)], dtype=object)
    fedbuff = fedbuff_plan(profiles, workload, 25, buffer_size=3, concurrency=5, exponent=0.5,
                           seed=0)
    deadline = synchronous_plan(profiles, workload, 25, 4, "deadline", seed=0, deadline_s=5000.0)
    for plans in (fedbuff, deadline):
        records = ClockRecords(plans, tiers)
        assert any((plan.outcomes != TRAINED).any() for plan in plans)  # drops are recorded
        for index, plan in enumerate(plans):  # each round's rows, computed from it alone
            order = np.lexsort((plan.starts, plan.clients))
            table = records.table(index)
            assert table["client"].tolist() == plan.clients[order].tolist()
            assert table["tier"].tolist() == tiers[plan.clients[order]].tolist()
            assert table["outcome"].tolist() == plan.outcomes[order].tolist()
            assert table["finish_s"].tolist() == plan.finish[order].tolist()
            assert table["staleness"].tolist() == [
                0 if v < 0 else plan.round - v for v in plan.start_versions[order]]
            assert (table["round"] == plan.round).all()
            used = plan.outcomes == TRAINED
            trained = np.sort(plan.clients[used])
            clients, versions, weights = records.buffered(index)
            assert clients.tolist() == records.trained(index).tolist() == trained.tolist()
            by_client = dict(zip(plan.clients[used].tolist(), zip(
                plan.start_versions[used].tolist(), plan.staleness_weights[used].tolist(),
                plan.finish[used].tolist(), strict=True), strict=True))
            assert list(zip(versions.tolist(), weights.tolist(), strict=True)) == [
                by_client[c][:2] for c in trained.tolist()]
            rows = np.array([*trained.tolist(), 99])  # a row that did not train: NaN
            finish = records.clock_columns(index, rows)["sim_finish_s"]
            assert finish[:-1].tolist() == [by_client[c][2] for c in trained.tolist()]
            assert math.isnan(finish[-1])
            assert records.clock_columns(index, trained)["sim_finish_s"].tolist() == \
                finish[:-1].tolist()
            assert records.columns(index) == {
                "sim_start_s": plan.start, "sim_end_s": plan.end, "sim_hours": plan.end / HOUR,
                "clients_selected": len(plan.clients),
                "clients_dropped": int((~used).sum())}


def test_the_online_mask_agrees_with_each_sites_windows_over_time():
    # periodic windows (one crossing the period's end) and always-available sites: the mask is
    # reused between window changes, and must still say what each site's windows say
    rng = np.random.default_rng(0)
    profiles = [SiteProfile(1.0, 1.0, 1.0, Availability()) for _ in range(3)]
    for _ in range(12):
        start = float(rng.uniform(0, 24 * HOUR))
        length = float(rng.uniform(0.5, 8)) * HOUR
        profiles.append(SiteProfile(1.0, 1.0, 1.0, Availability(((start, start + length),),
                                                               24 * HOUR)))
    mask = OnlineMask(profiles)
    clients = np.arange(len(profiles))
    for time in np.cumsum(rng.exponential(0.3 * HOUR, 2000)):
        windows = [p.availability.window_at(float(time)) for p in profiles]
        assert mask.at(float(time)).tolist() == [w is not None for w in windows]
        ends = [-math.inf if w is None else w[1] for w in windows]
        assert mask.window_end(clients, float(time)).tolist() == ends


def test_the_deadline_drops_exactly_the_late_sites():
    profiles = _profiles(*[(speed, 100.0, 100.0) for speed in (1.0, 2.0, 4.0, 8.0)])
    workload = Workload(np.full(4, 16.0), 1e3, 1e3)  # 16, 8, 4 and 2 s of compute
    plan = synchronous_plan(profiles, workload, 1, 4, "deadline", seed=0, deadline_s=5.0)[0]
    status = dict(zip(plan.clients.tolist(), plan.outcomes.tolist(), strict=True))
    assert status == {0: LATE, 1: LATE, 2: TRAINED, 3: TRAINED}
    assert plan.trained.tolist() == [2, 3] and plan.end == 5.0


def test_over_selection_keeps_the_first_to_finish():
    speeds = (3.0, 1.0, 5.0, 2.0, 8.0, 4.0)
    profiles = _profiles(*[(speed, 100.0, 100.0) for speed in speeds])
    workload = Workload(np.full(6, 24.0), 1e3, 1e3)
    plan = synchronous_plan(profiles, workload, 1, 4, "overselect", seed=0,
                            over_selection=0.5)[0]  # 4 x 1.5 = 6 selected, 4 kept
    status = dict(zip(plan.clients.tolist(), plan.outcomes.tolist(), strict=True))
    assert sorted(c for c, s in status.items() if s == TRAINED) == [0, 2, 4, 5]
    assert sorted(c for c, s in status.items() if s == SURPLUS) == [1, 3]
    assert plan.end == pytest.approx(plan.finish[plan.clients == 0].max())


def test_fedbuff_weighs_each_arrival_by_its_staleness():
    profiles = _profiles(*[(speed, 100.0, 100.0) for speed in (1.0, 1.0, 4.0, 4.0)])
    workload = Workload(np.full(4, 8.0), 1e3, 1e3)
    plans = fedbuff_plan(profiles, workload, 6, buffer_size=2, concurrency=4, exponent=0.5,
                         seed=0)
    stale = [(plan.round - version, weight) for plan in plans
             for version, weight in zip(plan.start_versions[plan.outcomes == TRAINED],
                                        plan.staleness_weights[plan.outcomes == TRAINED],
                                        strict=True)]
    assert any(s > 0 for s, _ in stale)  # slow sites arrive after faster ones updated
    for staleness, weight in stale:
        assert weight == pytest.approx((1 + staleness) ** -0.5)
    assert staleness_weight(3, 0.5) == 0.5 and staleness_weight(0, 2.0) == 1.0


def test_the_buffered_update_applies_stale_updates_to_the_current_model():
    from raysim.layers.fedbuff import (
        BufferedPartial,
        BufferTotals,
        buffered_update,
        server_correction,
    )
    from raysim.vectors.weighted_sum import WeightedSum
    from raysim.vectors.weights import FlatWeights

    def flat(values):
        return FlatWeights(__import__("torch").tensor(values, dtype=__import__("torch").float32),
                           (("w", (len(values),)),))

    current, base = flat([1.0, 1.0]), flat([0.25, -1.0])  # versions 4 and 3
    fresh, stale = flat([2.0, 3.0]), flat([0.5, 0.0])  # fresh from current, stale from base
    weight = staleness_weight(1, 0.5)

    def partial():  # A = 2 clients of weight 1; W_4 = 1, W_3 = the stale one's weight
        totals = BufferTotals(2.0, {4: 1.0, 3: weight})
        return BufferedPartial(WeightedSum.of([fresh, stale], [1.0, weight]), totals,
                               server_correction(current, totals, {3: base}, 4))

    new = buffered_update(partial())["w"]
    # g + (1 x (fresh - g) + w x (stale - base)) / 2
    expected = np.array([1 + (1 + weight * 0.25) / 2, 1 + (2 + weight * 1.0) / 2])
    np.testing.assert_allclose(new, expected, rtol=1e-6)
    from raysim.configuration.schema import ServerOptimizerConfig
    from raysim.layers.server_optimizer import ServerMoments, server_step

    halfway, _ = server_step(ServerOptimizerConfig(lr=0.5), current, buffered_update(partial()),
                             ServerMoments())  # system.server_lr 0.5: an SGD step
    np.testing.assert_allclose(halfway["w"], 1 + 0.5 * (expected - 1), rtol=1e-6)


def test_the_fedbuff_partials_carry_a_and_each_versions_weight_up_the_reduction_tree():
    """The FedBuff layer's group partials hold A (the sum of the client weights a_c) and W_v
    (the sum of a_c s_c by start version); merged along the reduction tree, as two workers
    holding groups [0, 3) and [3, 8) and the driver would merge them, they give the round's
    totals."""
    from raysim.algorithms.base import ClientResult
    from raysim.layers.fedbuff import MESSAGE, FedBuff
    from raysim.vectors.reduction_tree import combine, subtree_roots
    from raysim.vectors.weighted_sum import merge_partials

    rng = np.random.default_rng(7)
    group_of_client = np.repeat(np.arange(8), 5)
    sizes = (10.0 ** rng.uniform(-3, 3, size=40)).tolist()
    trained = np.sort(rng.choice(40, size=23, replace=False))
    versions = rng.integers(3, 7, size=23)
    staleness = 10.0 ** rng.uniform(-2, 0, size=23)

    class Weighted:
        mean_uploads = ("model",)

        def local_updates(self, runtime, clients, round_, message, states):
            return [ClientResult({"model": {"w": np.ones(2, np.float32)}}, weight=sizes[c])
                    for c in clients]

    layer = FedBuff(Weighted())
    message = {"model": {"w": np.zeros(2, np.float32)},
               MESSAGE: {"starts": (trained, versions, staleness),
                         "bases": {int(v): {"w": np.zeros(2, np.float32)}
                                   for v in np.unique(versions) if v != 6}}}
    results = dict(zip(trained.tolist(), layer.local_updates(
        None, trained.tolist(), 6, message, [None] * len(trained)), strict=True))
    leaves = {g: layer.reduce([(c, results[c]) for c in trained.tolist()
                               if group_of_client[c] == g])
              for g in sorted(set(group_of_client[trained].tolist()))}
    roots = [root for lo, hi in ((0, 3), (3, 8)) for root in subtree_roots(
        {g: t for g, t in leaves.items() if lo <= g < hi}, lo, hi, merge_partials)]
    root = combine(roots, merge_partials)
    assert root["client_weight"] == pytest.approx(sum(sizes[c] for c in trained))
    expected = {int(v): sum(sizes[c] * s for c, s, w in zip(trained, staleness, versions,
                                                             strict=True) if w == v)
                for v in np.unique(versions)}
    assert root["version_weights"] == pytest.approx(expected)
    assert root["model"].total_weight == pytest.approx(sum(expected.values()))


def _flat(values):
    import torch

    from raysim.vectors.weights import FlatWeights

    return FlatWeights(torch.tensor(values, dtype=torch.float32), (("w", (2,)),))


_ONE_STEP = SimpleNamespace(num_samples=1, steps=1, mean_loss=0.0, optimizer_state=None)
"""A training outcome of one sample and one step."""


def test_stale_clients_train_from_their_start_version_and_their_updates_apply_to_the_current():
    from types import SimpleNamespace as Plan

    from raysim.algorithms.fedavg import FedAvg
    from raysim.algorithms.params import FedAvgParams
    from raysim.layers.fedbuff import MESSAGE, BufferedState, FedBuff

    class OneStepRuntime:
        """Training adds 1 to every weight of the model a client starts from."""

        def train_many(self, clients, round_, starts, states, prox=None):
            return [(_flat((start.vector + 1).tolist()), _ONE_STEP) for start in starts]

    current, base = _flat([5.0, 5.0]), _flat([2.0, 3.0])
    message = {"model": current, MESSAGE: {"starts": (np.array([0, 1]), np.array([4, 3]),
                                                      np.array([1.0, 0.7])),
                                           "bases": {3: base}}}
    inner = FedAvg(FedAvgParams(), None)
    client = FedBuff(inner)
    results = client.local_updates(OneStepRuntime(), [0, 1], 4, message, [None, None])
    # the fresh client trained from the current model, the stale one from its base
    assert [r.upload["model"].vector.tolist() for r in results] == [[6.0, 6.0], [3.0, 4.0]]
    partial = client.reduce(list(zip([0, 1], results, strict=True)))
    assert partial["version_weights"] == {4: 1.0, 3: 0.7}  # a_c s_c with a_c = 1 sample
    server = FedBuff(inner, lambda: Plan(last_use={3: 4, 4: 4}))
    new = server.aggregate(BufferedState(current, {3: base}), [partial], 4)
    # each update (+1) applies to the current model, weighted 1 and 0.7, over A = 2
    np.testing.assert_allclose(new.model["w"], [5.85, 5.85], rtol=1e-6)
    assert new.versions == {}  # no later round starts a client from version 3, 4 or 5


def test_fedprox_under_fedbuff_trains_each_start_version_anchored_there():
    from raysim.algorithms.fedprox import FedProx
    from raysim.algorithms.params import FedProxParams
    from raysim.layers.fedbuff import MESSAGE, FedBuff

    calls = []

    class LoggingRuntime:
        def train_many(self, clients, round_, starts, states, prox=None):
            calls.append((list(clients), starts, prox))
            return [(start, _ONE_STEP) for start in starts]

    v2, v3, v4 = _flat([1.0, 1.0]), _flat([2.0, 3.0]), _flat([5.0, 5.0])
    message = {"model": v4, MESSAGE: {"starts": (np.arange(4), np.array([4, 3, 2, 3]),
                                                 np.ones(4)), "bases": {2: v2, 3: v3}}}
    layer = FedBuff(FedProx(FedProxParams(mu=0.1), None))
    results = layer.local_updates(LoggingRuntime(), [0, 1, 2, 3], 4, message, [None] * 4)
    assert [clients for clients, _, _ in calls] == [[2], [1, 3], [0]]  # by start version
    for _, starts, (anchor, mu) in calls:
        assert mu == 0.1 and all(start is anchor for start in starts)
    assert [r.upload["model"].vector.tolist() for r in results] == [
        [5.0, 5.0], [2.0, 3.0], [1.0, 1.0], [2.0, 3.0]]


def test_the_fedbuff_layer_applies_every_stale_update_to_the_current_model():
    """The FedBuff layer's server (its broadcast of the start versions, the versions its state
    keeps, its aggregation) and its clients (the wrapped algorithm once per start version):
    each client's update of +1 from its own start version moves the current model by
    s_c / A, whichever version it started from."""
    import torch

    from raysim.algorithms.base import ClientResult
    from raysim.layers.fedbuff import FedBuff
    from raysim.system.plan import SystemPlan
    from raysim.system.records import ClockRecords
    from raysim.vectors.weights import FlatWeights, as_tensor

    profiles = _profiles(*[(1.0 + c % 5, 100.0, 100.0) for c in range(24)])
    plans = fedbuff_plan(profiles, Workload(np.full(24, 40.0), 1e3, 1e3), 20, buffer_size=8,
                         concurrency=16, exponent=0.5, seed=0)
    tiers = np.full(24, "", dtype=object)
    records = ClockRecords(plans, tiers, buffered=True)
    plan = SystemPlan("fedbuff", tuple(plans), tiers, records)

    class PlusOne:
        """Each client's trained model is the model it started from + 1, weight a_c = 1."""

        mean_uploads = ("model",)

        def init_server_state(self, weights):
            return weights

        def broadcast(self, state, round_):
            return {"model": state}

        def global_weights(self, state):
            return state

        def server_step(self, state, mean):  # plain averaging
            return mean

        def local_updates(self, runtime, clients, round_, message, states):
            start = message["model"]
            return [ClientResult({"model": FlatWeights(as_tensor(start.vector) + 1,
                                                       start.layout)}) for _ in clients]

    server = FedBuff(PlusOne(), lambda: plan)
    client = FedBuff(PlusOne())  # a worker's: the start versions come in the broadcast
    state = server.init_server_state(FlatWeights(torch.tensor([0.5, -2.0]), (("w", (2,)),)))
    stale = 0
    for round_ in range(20):
        message = server.broadcast(state, round_)
        clients, versions, weights = records.buffered(round_)
        results = client.local_updates(None, clients.tolist(), round_, message,
                                       [None] * len(clients))
        partials = [client.reduce([(int(c), r)]) for c, r in zip(clients, results, strict=True)]
        root = None  # one client per group, merged in order as the reduction tree does
        for partial in partials:
            root = partial if root is None else server.merge(root, partial)
        new = server.aggregate(state, [] if root is None else [root], round_)
        stale += int((versions < round_).sum())
        step = weights.sum() / len(weights)  # sum of s_c x (+1) over A = the buffer's size
        np.testing.assert_allclose(new.model.vector, np.asarray(state.model.vector) + step,
                                   rtol=1e-6)
        assert set(new.versions) <= {v for v, last in plan.last_use.items() if last > round_}
        state = new
    assert stale > 20  # most rounds have clients that started from an earlier version


def test_a_trace_file_gives_profiles_and_windows(tmp_path):
    path = tmp_path / "sites.csv"
    pd.DataFrame({"client": [0, 1, 1], "speed_gflops": [5.0, 1.0, 1.0],
                  "down_mbps": [10.0, 2.0, 2.0], "up_mbps": [5.0, 1.0, 1.0],
                  "available_from_h": [None, 0.0, 10.0],
                  "available_to_h": [None, 2.0, 12.0]}).to_csv(path, index=False)
    profiles = read_trace(path, 2)
    assert profiles[0].availability.always and profiles[0].speed_gflops == 5.0
    assert profiles[1].availability.window_at(11 * HOUR) == (10 * HOUR, 12 * HOUR)
    assert profiles[1].availability.window_at(5 * HOUR) is None
    assert profiles[1].availability.next_start(5 * HOUR) == 10 * HOUR


def test_fedscale_device_traces_convert_to_a_site_trace(tmp_path):
    import pickle

    from raysim.system.fedscale import main

    capacity = {7: {"computation": 50.0, "communication": 2000.0},
                3: {"computation": 200.0, "communication": 500.0}}
    behaviour = {3: {"active": [0.0, 7200.0], "inactive": [3600.0, 10800.0],
                     "finish_time": 14400.0, "duration": 14400.0}}
    (tmp_path / "capacity").write_bytes(pickle.dumps(capacity))
    (tmp_path / "behave").write_bytes(pickle.dumps(behaviour))
    main([str(tmp_path / "capacity"), str(tmp_path / "behave"), "--clients", "2",
          "--reference-gflop", "0.5", "--out", str(tmp_path / "sites.csv")])
    first, second = read_trace(tmp_path / "sites.csv", 2)  # ids in order: 3, then 7
    assert second.speed_gflops == pytest.approx(0.5 / 0.05) and second.up_mbps == 2.0
    assert second.availability.always
    assert first.speed_gflops == pytest.approx(0.5 / 0.2) and first.down_mbps == 0.5
    windows = first.availability  # 0-1 h and 2-3 h of every 4 hours
    assert windows.window_at(4.5 * HOUR) == (4 * HOUR, 5 * HOUR)
    assert windows.window_at(5.5 * HOUR) is None
    assert windows.next_start(5.5 * HOUR) == 6 * HOUR


# ----- runs on the engine -----
def _raw(**system) -> dict:
    return small_federation(name="sites", **({"system": system} if system else {}))


def _run(raw: dict, tmp_path: Path, label: str):
    return run_tables(raw, tmp_path / label, "rounds", "clients", "system")


def test_fedbuff_with_every_client_in_the_buffer_and_no_staleness_is_fedavg_exactly(
        ray_session, tmp_path):
    raw = _raw(tiers={"cpu_server": 1.0}, policy="sync")
    raw["training"]["clients_per_round"] = 12
    synchronous, _, _ = _run(raw, tmp_path, "sync")
    buffered, _, system = _run(_raw(tiers={"cpu_server": 1.0}, policy="fedbuff",
                                    buffer_size=12, concurrency=12), tmp_path, "fedbuff")
    assert (system["staleness"] == 0).all() and (system["outcome"] == TRAINED).all()
    for column in ("accuracy", "loss", "train_loss"):
        assert np.array_equal(synchronous[column].to_numpy(), buffered[column].to_numpy())


def test_stale_updates_change_the_model_and_the_clock_is_worker_independent(ray_session,
                                                                           tmp_path):
    settings = {"tiers": {"workstation_gpu": 0.5, "constrained_site": 0.5},
                "policy": "fedbuff", "buffer_size": 3, "concurrency": 6}
    runs = []
    for workers in (1, 2):
        raw = _raw(**settings)
        raw["engine"]["num_workers"] = workers
        runs.append(_run(raw, tmp_path, f"w{workers}"))
    (rounds, clients, system), (rounds2, _, system2) = runs
    clock = ["round", "client", "outcome", "start_s", "finish_s", "start_version", "staleness"]
    pd.testing.assert_frame_equal(system[clock], system2[clock])
    for column in ("sim_end_s", "accuracy"):
        assert np.array_equal(rounds[column].to_numpy(), rounds2[column].to_numpy())
    assert (system["staleness"] > 0).any()
    trained = system[system["outcome"] == TRAINED]
    np.testing.assert_allclose(trained["staleness_weight"],
                               (1 + trained["staleness"]) ** -0.5)
    assert {"sim_compute_s", "sim_finish_s"} <= set(clients.columns)
    # each trained client's start version and weight in `clients` are the plan's
    planned = trained.set_index(["round", "client"]).sort_index()
    recorded = clients.set_index(["round", "client"]).sort_index()
    assert np.array_equal(recorded["fedbuff_start_version"].to_numpy(),
                          planned["start_version"].to_numpy().astype(float))
    assert np.array_equal(recorded["fedbuff_weight"].to_numpy(),
                          planned["staleness_weight"].to_numpy())


def test_a_run_clocks_each_client_by_the_flops_torch_counts_for_its_model(ray_session,
                                                                         tmp_path):
    """A client's recorded compute time is 3 x its model's forward FLOPs (torch's counter,
    counted here) x the samples it trained on / its site's speed: the FLOPs a worker counts
    for the driver's plan are the model's."""
    from raysim.configuration.experiment import parse_config
    from raysim.models import build_model
    from raysim.models.costs import forward_flops
    from raysim.preparation import prepare
    from raysim.system.profiles import TIERS

    raw = _raw(tiers={"cpu_server": 1.0}, policy="sync")
    _, clients, _ = _run(raw, tmp_path, "flops")
    config = parse_config(raw)
    info = prepare(config, None)[0][0].info
    flops = forward_flops(build_model(config.model, info), info.input_shape)
    expected = 3 * flops * clients["num_samples"] / 1e9 / TIERS["cpu_server"].speed_gflops
    np.testing.assert_allclose(clients["sim_compute_s"], expected, rtol=1e-12)


def test_deadline_runs_record_dropped_sites_and_end_rounds_at_the_deadline(ray_session,
                                                                           tmp_path):
    rounds, clients, system = _run(_raw(tiers={"cpu_server": 0.5, "constrained_site": 0.5},
                                        policy="deadline", deadline_s=0.0005), tmp_path, "dl")
    late = system[system["outcome"] == LATE]
    assert len(late) and (late["finish_s"] > late["start_s"] + 0.0005).all()
    for round_, frame in clients.groupby("round"):  # only the punctual sites trained
        kept = system[(system["round"] == round_) & (system["outcome"] == TRAINED)]
        assert sorted(frame["client"]) == sorted(kept["client"])
    ends = rounds["sim_end_s"] - rounds["sim_start_s"]
    assert np.allclose(ends[rounds["clients_dropped"] > 0], 0.0005)


def test_report_time_gives_hours_to_a_target(ray_session, tmp_path):
    from raysim.results.report import report

    rounds, _, _ = _run(_raw(tiers={"cpu_server": 1.0}), tmp_path, "time")
    text, _ = report(str(tmp_path / "time"), time=True, time_target=0.5,
                     csv_dir=tmp_path / "csv")
    table = pd.read_csv(tmp_path / "csv" / "time.csv")
    evaluated = rounds.dropna(subset=["accuracy"])
    first = evaluated[evaluated["accuracy"] >= 0.5].iloc[0]
    assert table["seconds_to_target_mean"].iloc[0] == pytest.approx(first["sim_end_s"])
    assert table["rounds_to_target_mean"].iloc[0] == first["round"] + 1
    assert table["seconds_mean"].iloc[0] == pytest.approx(rounds["sim_end_s"].iloc[-1])
    assert "simulated clock" in text
    participation = pd.read_csv(tmp_path / "csv" / "participation.csv")
    assert participation["cpu_server"].iloc[0] == 4 * 6  # every selected site trained
    assert (tmp_path / "time").glob("**/learning_curves_accuracy_hours.png")


# ----- refusals -----
@pytest.mark.parametrize("change, needle", [
    ({"algorithm": {"name": "feddc"}, "system": {"tiers": {"cpu_server": 1}, "policy": "fedbuff"}},
     "needs synchronous rounds"),
    ({"algorithm": {"name": "centralized"}, "system": {"tiers": {"cpu_server": 1}}},
     "no sites"),
    ({"system": {"tiers": {"cpu_server": 1}}, "privacy": {"clip": 1.0, "noise_multiplier": 1.0}},
     "Poisson sampling"),
    ({"system": {"tiers": {"mainframe": 1}}}, "workstation_gpu"),
    ({"system": {"policy": "deadline", "tiers": {"cpu_server": 1}}}, "deadline_s"),
    ({"system": {"tiers": {"cpu_server": 1}, "policy": "fedbuff", "buffer_size": 40}},
     "buffer_size"),
])
def test_system_settings_that_cannot_work_exit_2(capsys, tmp_path, change, needle):
    raw = _raw()
    raw.update(change)
    code, err = run_cli(capsys, tmp_path, raw)
    assert code == 2 and needle in err and "Traceback" not in err, err


def test_feddc_accepts_a_deadline(ray_session, tmp_path):
    raw = _raw(tiers={"cpu_server": 0.5, "constrained_site": 0.5}, policy="deadline",
               deadline_s=0.0005)
    raw["algorithm"] = {"name": "feddc", "daisy_period": 1, "aggregation_period": 2}
    raw["training"]["clients_per_round"] = 12
    rounds, _, system = _run(raw, tmp_path, "feddc")
    assert len(rounds) == 4 and (system["outcome"] == LATE).any()
    assert math.isfinite(rounds["accuracy"].iloc[-1])


@pytest.mark.parametrize("killed", ["driver", "worker"])
def test_a_fedbuff_run_survives_a_killed_driver_or_worker_with_the_same_numbers(
        ray_session, tmp_path, killed):
    """Rounds after a checkpoint (a killed driver resumes from it) or after the last round
    (a killed worker rolls back to it) start clients from earlier server versions: the durable
    state keeps those versions, and the run ends with the numbers of an undisturbed one."""
    from test_resilience import _run_and_kill, _same_metrics

    from raysim.configuration.experiment import parse_config
    from raysim.engine.runner import run_experiment
    from raysim.results import load

    raw = _raw(tiers={"workstation_gpu": 0.5, "constrained_site": 0.5}, policy="fedbuff",
               buffer_size=3, concurrency=6)
    raw["training"]["rounds"] = 20
    raw["engine"].update({"flush_seconds": 0, "checkpoint_every": 5, "checkpoint_seconds": 0,
                          "checkpoint_share": 0})
    config = parse_config(raw)
    pid = (lambda m: m["driver"]["pid"]) if killed == "driver" else (
        lambda m: m["workers"][1]["pid"])
    disturbed, pids = _run_and_kill(config, tmp_path / "killed", after_rounds=8, process=pid)
    undisturbed = run_experiment(config, output=str(tmp_path / "clean"), progress=False)[0]
    assert pids and disturbed.error is None, disturbed.error
    rounds = load(disturbed.run_dir)
    assert rounds["round"].tolist() == list(range(20))
    _same_metrics(rounds, load(undisturbed.run_dir), ["round", "accuracy", "loss", "sim_end_s"])
    system = load(disturbed.run_dir, "system")
    after_checkpoint = system[(system["round"] >= 5) & (system["outcome"] == TRAINED)]
    assert (after_checkpoint["start_version"] < after_checkpoint["round"]).any()


def test_a_clock_that_runs_out_of_available_sites_stops_the_run_with_exit_2(
        ray_session, capsys, tmp_path):
    """Trace windows without a period happen once: when every site's window has ended before
    the run's rounds are planned, the run stops with the paragraph that says so and how to fix
    it (exit 2, no traceback), whichever policy plans the clock."""
    trace = tmp_path / "sites.csv"
    pd.DataFrame({"client": range(4), "speed_gflops": 1e-6, "down_mbps": 1.0, "up_mbps": 1.0,
                  "available_from_h": 0.0, "available_to_h": 0.001}).to_csv(trace, index=False)
    for policy in ("sync", "fedbuff"):
        raw = small_federation(name=f"ends-{policy}", system={
            "trace": str(trace), "policy": policy,
            **({"buffer_size": 2, "concurrency": 2} if policy == "fedbuff" else {})})
        raw["partition"]["num_clients"] = 4
        raw["training"]["clients_per_round"] = 2
        code, err = run_cli(capsys, tmp_path, raw, "--output", str(tmp_path / "out"),
                            "--no-progress", command="run")
        assert code == 2 and "Traceback" not in err, err
        assert "no site is ever available again" in err and "period_h" in err, err
