"""FedDC: federated daisy-chaining (Kamp, Fischer, Vreeken, ICLR 2023).

Every round each client takes ``training.local_steps`` minibatch steps (the paper: one) on its
own model. Every ``daisy_period`` rounds the server permutes the models among the clients
(client i's model goes to client pi(i)); every ``aggregation_period`` rounds it aggregates all
models and every client continues from the aggregate. When both fall in the same round the
aggregate is what every client receives (the authors' code daisy-chains first, then aggregates,
which overrides the permutation). ``daisy_period: null`` gives FedAvg with period b,
``aggregation_period: null`` daisy-chaining alone.

Models stay resident on their workers; a permutation moves only the models that change
worker, through the object store. Bytes count what a real deployment sends: every model up and
back down on daisy-chaining and aggregation rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from raysim.algorithms.base import Algorithm, ClientResult, RunContext, register_algorithm
from raysim.algorithms.params import FedDCParams
from raysim.algorithms.robust_means import coordinate_median, iterated_radon_point, radon_number
from raysim.algorithms.supports import Supports
from raysim.errors import ConfigError
from raysim.privacy.mechanism import privatize
from raysim.seeding import numpy_rng
from raysim.vectors.weighted_sum import mean_partial, weighted_mean
from raysim.vectors.weights import Weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


@register_algorithm
class FedDC(Algorithm[FedDCParams, dict[str, Any]]):
    """Daisy-chaining (model permutation on the driver) plus periodic aggregation."""

    params_class = FedDCParams

    @classmethod
    def describe(cls, params: Any) -> str:
        """feddc, or what its loop amounts to with a period off: local training (neither),
        daisy-chaining alone, FedAvg (FedProx with mu > 0; a robust mean's name for Radon or
        median aggregation) every b rounds."""
        if params.daisy_period is None and params.aggregation_period is None:
            return "local"
        if params.aggregation_period is None:
            return "daisy-chaining"
        if params.daisy_period is None:
            if params.aggregator != "mean":
                return f"{params.aggregator}-averaging"
            return "fedprox" if params.mu > 0 else "fedavg"
        return str(params.name)
    supports: ClassVar[Supports] = Supports(
        private_releases=("every model a client hands over (daisy-chaining) or uploads (aggregation) is "
            "released to the server and another client, never summed first"),
        asynchronous_refusal=("its permutation hands every client's model to another client between "
            "synchronous rounds, and its aggregation averages all clients' models of one round"))
    personalized = True
    relayed_uploads = ("daisy_chain",)

    def __init__(self, params: FedDCParams, context: RunContext):
        super().__init__(params, context)
        clients = context.num_clients
        if context.clients_per_round != clients:
            raise ConfigError(
                f"Invalid config field `training.clients_per_round` = "
                f"{context.clients_per_round}: FedDC permutes and aggregates the models of all "
                f"{clients} clients every period, so every client takes part in every round. "
                "Remove training.clients_per_round."
            )
        if params.permutation == "derangement" and params.daisy_period and clients < 2:
            raise ConfigError(
                "Invalid config field `algorithm.permutation` = 'derangement': a derangement "
                "moves every model to another client, which needs at least 2 clients. Use "
                "permutation: shuffle or more clients."
            )
        if params.aggregator == "radon" and params.aggregation_period:
            from raysim.models import build_model

            model = build_model(context.model, context.info)
            needed = radon_number(sum(p.numel() for p in model.parameters()) +
                                  sum(b.numel() for b in model.buffers() if b.is_floating_point()))
            if clients < needed:
                raise ConfigError(
                    f"Invalid config field `algorithm.aggregator` = 'radon': the model has "
                    f"{needed - 2} parameters, so a Radon point needs at least {needed} models, "
                    f"but there are {clients} clients. Use more clients, a smaller model "
                    "(e.g. model.hidden: []) or aggregator: mean."
                )

    # ----- schedule -----
    def dp_releases(self, rounds_done: int) -> int:
        """The rounds among the first ``rounds_done`` in which every client released its model
        (a hand-over or an aggregation)."""
        return sum(self.aggregates_in(t) or self.daisy_chains_in(t) for t in range(rounds_done))

    def _in_phase(self, round_: int, period: int | None) -> bool:
        """Whether ``round_`` is a period's round of action: its last (``schedule: end``) or
        its first (``start``, the authors' code)."""
        if period is None:
            return False
        return round_ % period == (0 if self.params.schedule == "start" else period - 1)

    def aggregates_in(self, round_: int) -> bool:
        return self._in_phase(round_, self.params.aggregation_period)

    def daisy_chains_in(self, round_: int) -> bool:
        return self._in_phase(round_, self.params.daisy_period) and not self.aggregates_in(round_)

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> dict[str, Any]:
        return {"aggregate": initial_weights, "fresh": False}

    def broadcast(self, state: dict[str, Any], round_: int) -> dict[str, Any]:
        return {"model": state["aggregate"]} if state["fresh"] else {}

    def migration(self, round_: int) -> np.ndarray | None:
        if not self.daisy_chains_in(round_):
            return None
        rng = numpy_rng(self.context.seed, "permutation", round_)
        permutation = rng.permutation(self.context.num_clients)
        if self.params.permutation == "derangement":
            while (permutation == np.arange(len(permutation))).any():
                permutation = rng.permutation(self.context.num_clients)
        return permutation

    def aggregate(self, state: dict[str, Any], partials: Sequence[Any], round_: int
                  ) -> dict[str, Any]:
        if not self.aggregates_in(round_):
            return {"aggregate": state["aggregate"], "fresh": False}
        merged: Weights
        if self.params.aggregator == "mean":
            merged = weighted_mean(partials)
        else:
            models = [weights for partial in partials for weights in partial]
            if self.params.radon_sample == "random":  # every client's model can be drawn
                order = numpy_rng(self.context.seed, "radon-sample", round_).permutation(len(models))
                models = [models[i] for i in order]
            merged = (iterated_radon_point(models) if self.params.aggregator == "radon"
                      else coordinate_median(models))
        return {"aggregate": merged, "fresh": True}

    def global_weights(self, state: dict[str, Any]) -> Weights | None:
        return state["aggregate"] if self.params.aggregation_period else None

    # ----- client -----
    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        starts, references, optimizer_states, anchors = [], [], [], []
        for state in states:
            # client state: (model, optimizer state, DP reference, proximal anchor = the last
            # aggregate as this client knows it; kept in the state so it survives restarts)
            weights, optimizer_state, reference, anchor = (
                state if state is not None else (runtime.initial_weights, None,
                                                 runtime.initial_weights, None))
            if "model" in message:
                weights = reference = message["model"]
                anchor = message["model"] if self.params.mu > 0 else None
            starts.append(weights)
            references.append(reference)
            optimizer_states.append(optimizer_state)
            anchors.append(anchor)
        if self.params.mu > 0:  # every client's anchor is the same aggregate (or the start)
            anchor = next((a for a in anchors if a is not None), runtime.initial_weights)
            trained = runtime.train_many(clients, round_, starts, optimizer_states,
                                         prox=(anchor, self.params.mu))
        else:
            trained = runtime.train_many(clients, round_, starts, optimizer_states)
        kind = ("model" if self.aggregates_in(round_)
                else "daisy_chain" if self.daisy_chains_in(round_) else None)
        results = []
        for client, (weights, outcome), reference, anchor in zip(clients, trained, references,
                                                                 anchors, strict=True):
            if kind is not None:
                mechanism = self._release_mechanism()
                if mechanism is not None:  # the Gaussian mechanism on every hand-over
                    weights, _ = privatize(weights, reference, *mechanism, self.context.seed,
                                           round_, client, runtime.device)
                reference = weights
            upload = {kind: weights} if kind else {}
            state = (weights, outcome.optimizer_state, reference, anchor)
            results.append(ClientResult.trained(upload, state, outcome))
        return results

    def _release_mechanism(self) -> tuple[float, float] | None:
        """(clip, noise std) of every released model: ``privacy:`` (local mode, accounted) or
        the authors' ``algorithm.dp`` (the same mechanism, without an accountant)."""
        if self.context.privacy is not None:
            return self.context.privacy.clip, self.context.privacy.noise_std
        if self.params.dp is not None:
            return self.params.dp.clip, self.params.dp.sigma * self.params.dp.clip
        return None

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> Any:
        uploads = [(client, r) for client, r in results if "model" in r.upload]
        if not uploads:
            return None
        if self.params.aggregator != "mean":
            return [r.upload["model"] for _, r in uploads]
        return mean_partial([r.upload["model"] for _, r in uploads],
                            [r.num_samples for _, r in uploads], self.weights_by_samples)

    def personal_weights(self, state: Any) -> Weights | None:
        return None if state is None else state[0]

