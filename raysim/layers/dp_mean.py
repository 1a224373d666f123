"""Client-level DP around an algorithm that declares ``mean_uploads`` (DP-FedAvg, McMahan et
al. 2018; adaptive clipping, Andrew et al. 2021).

Client side: after the wrapped algorithm's local work, each declared upload is replaced by its
update over the broadcast entry of the same name, clipped (and in local mode noised), with the
update's norm and whether it was within the clip in the ``clients`` table. Server side: the
uploads are summed with one vote each and the next model is their private mean with a fixed
denominator and, in central mode, Gaussian noise on the sum
(:func:`~raysim.privacy.private_mean.private_mean`); under adaptive clipping the server state
also carries the next round's clip. Poisson sampling, the accountant and the round cap are the
run's part of DP (:mod:`raysim.layers.client_dp`, the DP feature this layer belongs to).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.layers.wrapped import Wrapped, root_of
from raysim.privacy.private_mean import AdaptivelyClipped, count_noise, private_mean
from raysim.privacy.uploads import privatize_uploads
from raysim.vectors.weighted_sum import WeightedSum

if TYPE_CHECKING:
    from raysim.algorithms.base import ClientResult
    from raysim.privacy.settings import DpSettings
    from raysim.training.runtime import ClientRuntime
    from raysim.vectors.weights import Weights


class PrivateMean(Wrapped):
    """The wrapped algorithm's declared uploads, clipped and noised, averaged privately."""

    @property
    def settings(self) -> DpSettings:
        privacy = self.inner.context.privacy
        assert privacy is not None, "the DP layer wraps runs with privacy: only"
        return privacy

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> Any:
        state = self.inner.init_server_state(initial_weights)
        adaptive = self.settings.adaptive
        return state if adaptive is None else AdaptivelyClipped(state, self.settings.clip)

    def inner_state(self, state: Any) -> Any:
        return state.model if isinstance(state, AdaptivelyClipped) else state

    def broadcast(self, state: Any, round_: int) -> dict[str, Any]:
        message = self.inner.broadcast(self.inner_state(state), round_)
        if isinstance(state, AdaptivelyClipped):  # the clients clip at the round's clip
            message["dp_clip"] = np.float64(state.clip)
        return message

    def aggregate(self, state: Any, partials: Sequence[Any], round_: int) -> Any:
        settings, seed = self.settings, self.inner.context.seed
        root = root_of(partials)
        if len(self.inner.mean_uploads) > 1:
            return self._aggregate_each(state, root, round_)
        (kind,) = self.inner.mean_uploads
        if isinstance(state, AdaptivelyClipped):  # Andrew et al. 2021: the clip moves too
            assert settings.adaptive is not None
            sums = [] if root is None else [root[kind]]
            within = 0 if root is None else root["within_clip"]
            sampled = sum(s.total_weight for s in sums)  # (before private_mean merges them)
            model = private_mean(sums, state.model, settings.expected_clients,
                                 settings.noise_std_at(state.clip), seed, round_)
            clip = settings.adaptive.next_clip(
                state.clip, within, sampled, settings.expected_clients,
                count_noise(settings.adaptive.count_noise_std, seed, round_))
            return AdaptivelyClipped(model, clip)
        noise = settings.noise_std if settings.mode == "central" else 0.0
        return private_mean([] if root is None else [root[kind]], state,
                            settings.expected_clients, noise, seed, round_)

    def _aggregate_each(self, state: Any, root: Any, round_: int) -> Any:
        """Several declared uploads: the private mean of each over its broadcast entry, with
        noise of its own, handed to the wrapped algorithm's server step as {upload: mean}."""
        settings, seed = self.settings, self.inner.context.seed
        noise = settings.noise_std if settings.mode == "central" else 0.0
        message = self.inner.broadcast(state, round_)
        means = {kind: private_mean([] if root is None else [root[kind]], message[kind],
                                    settings.expected_clients, noise, seed, round_,
                                    stream="dp-central-noise" if index == 0
                                    else f"dp-central-noise-{kind}")
                 for index, kind in enumerate(self.inner.mean_uploads)}
        return self.inner.server_step(state, means)

    # ----- clients -----
    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        results = self.inner.local_updates(runtime, clients, round_, message, states)
        declared = set(self.inner.mean_uploads) | set(self.inner.evaluation_uploads)
        for result in results:
            undeclared = set(result.upload) - declared
            if undeclared:
                raise RuntimeError(
                    f"{type(self.inner).__name__} uploads {sorted(undeclared)}, which it does "
                    f"not declare in mean_uploads {self.inner.mean_uploads}: client-level DP "
                    "would release them unclipped")
        privatize_uploads(list(zip(clients, results, strict=True)), self.inner.mean_uploads,
                          lambda kind, client: message[kind], message, self.settings,
                          self.inner.context.seed, round_, runtime.device)
        return results

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> Any:
        partials: dict[str, Any] = {
            kind: WeightedSum.of([r.upload[kind] for _, r in results], [1.0] * len(results))
            for kind in self.inner.mean_uploads}
        if self.settings.adaptive is not None:  # and the within-clip bits (one upload)
            (kind,) = self.inner.mean_uploads
            partials["within_clip"] = sum(
                r.metrics[f"dp_{kind}_within_clip"] for _, r in results)
        return partials
