"""FedAvg (McMahan et al. 2017): clients train the global model; the server averages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from raysim.algorithms import buffered
from raysim.algorithms.base import Algorithm, ClientResult, register_algorithm
from raysim.algorithms.params import FedAvgParams, FedProxParams
from raysim.algorithms.private_mean import AdaptivelyClipped, count_noise, private_mean
from raysim.schema import StrictModel
from raysim.vectors.weighted_sum import mean_partial, weighted_mean
from raysim.vectors.weights import Weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


State = Weights | AdaptivelyClipped
"""The global model, or under adaptive clipping the model and the next clip."""


@register_algorithm
class FedAvg(Algorithm[FedAvgParams | FedProxParams, State]):
    """Sample-weighted model averaging of the sampled clients' models every round."""

    params_class: ClassVar[type[StrictModel]] = FedAvgParams
    private_uploads: ClassVar[tuple[str, ...]] = ("model",)
    asynchronous_refusal: ClassVar[str | None] = None

    buffer: buffered.RoundBuffer | None = None
    """FedBuff, on a worker: the weight a_c s_c of each client of the round its last
    :meth:`local_updates` trained (what :meth:`reduce` weighs their uploads by)."""

    def init_server_state(self, initial_weights: Weights) -> State:
        privacy = self.context.privacy
        if privacy is not None and privacy.adaptive is not None:
            return AdaptivelyClipped(initial_weights, privacy.clip)
        return initial_weights

    def broadcast(self, state: State, round_: int) -> dict[str, Any]:
        if isinstance(state, AdaptivelyClipped):  # the clients clip at the round's clip
            return {"model": state.model, "dp_clip": np.float64(state.clip)}
        return {"model": state}

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        if "fedbuff" in message:  # asynchronous: each client from its own start version
            trained, self.buffer = buffered.train_buffered(runtime, clients, round_, message,
                                                           self.proximal,
                                                           self.buffer_client_weights)
            return [ClientResult.trained({"model": weights}, None, outcome)
                    for weights, outcome in trained]
        start = message["model"]
        trained = runtime.train_many(clients, round_, [start] * len(clients),
                                     [None] * len(clients), prox=self.proximal(start))
        return [ClientResult.trained({"model": weights}, None, outcome)
                for weights, outcome in trained]

    def proximal(self, global_weights: Weights) -> tuple[Weights, float] | None:
        """(anchor, mu) of a proximal term mu/2 ||w - anchor||^2 in the local objective
        (none for FedAvg)."""
        return None

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> Any:
        privacy = self.context.privacy
        weighted = self.params.weighted and privacy is None  # DP: one vote each
        if self.context.fedbuff_server_lr is not None:
            assert self.buffer is not None, "local_updates saw the round's buffer"
            return self.buffer.partial(  # a_c s_c as the driver's totals take them
                [c for c, _ in results], [r.upload["model"] for _, r in results])
        partial = mean_partial([r.upload["model"] for _, r in results],
                               [r.num_samples for _, r in results], weighted)
        if privacy is not None and privacy.adaptive is not None:  # and the within-clip bits
            return {"model": partial, "within_clip": sum(
                r.metrics["dp_model_within_clip"] for _, r in results)}
        return partial

    def buffer_client_weights(self, sizes: np.ndarray) -> np.ndarray:
        """FedBuff: each client's weight a_c, its sample count (unweighted: 1), as the
        workers' group partials weigh its upload (FedBuff runs without ``privacy:``)."""
        return sizes.astype(float) if self.params.weighted else np.ones(len(sizes))

    def aggregate(self, state: State, partials: Sequence[Any], round_: int) -> State:
        privacy = self.context.privacy
        if self.context.fedbuff_server_lr is not None:
            assert not isinstance(state, AdaptivelyClipped)  # (privacy and system exclude)
            return buffered.buffered_update(state, partials[0], self.context.fedbuff_server_lr)
        if privacy is None:
            return weighted_mean(partials)
        seed = self.context.seed
        if isinstance(state, AdaptivelyClipped):  # Andrew et al. 2021: the clip moves too
            assert privacy.adaptive is not None
            sums = [p["model"] for p in partials]
            within = sum(p["within_clip"] for p in partials)
            sampled = sum(s.total_weight for s in sums)  # (before private_mean merges them)
            model = private_mean(sums, state.model, privacy.expected_clients,
                                 privacy.noise_std_at(state.clip), seed, round_)
            clip = privacy.adaptive.next_clip(
                state.clip, within, sampled, privacy.expected_clients,
                count_noise(privacy.adaptive.count_noise_std, seed, round_))
            return AdaptivelyClipped(model, clip)
        # DP-FedAvg: fixed denominator, central noise on the sum
        noise = privacy.noise_std if privacy.mode == "central" else 0.0
        return private_mean(partials, state, privacy.expected_clients, noise, seed, round_)

    def global_weights(self, state: State) -> Weights:
        return state.model if isinstance(state, AdaptivelyClipped) else state
