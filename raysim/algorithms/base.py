"""The small interface every federated algorithm implements.

A round, as the engine runs it:

1. server (driver): ``broadcast(state, round)`` -> message, put into the object store once;
2. client (worker), for the sampled clients of a worker at once:
   ``local_updates(runtime, clients, round, message, client_states)`` -> one
   :class:`ClientResult` per client (upload, new persistent state, metrics); the runtime's
   ``train_many`` trains them one by one or vectorised, whichever pays;
3. worker: ``reduce(results)`` over the clients of each fixed client group, in client order
   (e.g. a weighted sum), then ``merge`` of the groups along a fixed binary tree
   (:mod:`raysim.vectors.reduction_tree`): the worker merges the subtrees it holds, the driver
   the rest, so one partial per worker travels back and the numbers do not depend on the
   number of workers;
4. server: ``aggregate(state, partials, round)`` with the tree's root as the one partial
   (none when no client reduced anything) -> new state.

Optionally the server relays client state: ``migration(round)`` returns, before the round, the
destination client of every client's persistent state (FedDC's permutation); the engine moves
the states between workers through the object store after the round's local work.

Evaluation uses ``global_weights(state)`` on the global test set and, for algorithms with
personal models, ``personal_weights(client_state)`` on each client's own test share.

The rule every algorithm follows: **no hook keeps state on the algorithm object from one round
to the next**. The driver's and every worker's algorithm objects are rebuilt after a
checkpoint restore or a worker restart, so what must survive a round goes into the server
state, the broadcast message or the client's state (caches derived from the run's constant
inputs, e.g. a resident module or the public set, are fine). States must pickle. Enforced for
every registered algorithm by ``tests/test_contract.py``: fresh objects every round and
pickled states give bit-identical results, and other client groupings the same results up to
float summation order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

import numpy as np
from torch import nn

from raysim.algorithms.params import ALGORITHM_PARAMS, PLUGIN_ALGORITHM_PARAMS
from raysim.algorithms.supports import Supports
from raysim.configuration.schema import StrictModel
from raysim.errors import ConfigError
from raysim.training.context import RunContext
from raysim.training.evaluation import predict_proba
from raysim.training.membership import loss_attack_scores
from raysim.vectors.weighted_sum import sample_weight
from raysim.vectors.weights import Weights, set_weights

if TYPE_CHECKING:
    import pandas as pd

    from raysim.training.client_fit import FitOutcome
    from raysim.training.runtime import ClientRuntime, TrainOutcome

ALGORITHMS: dict[str, type[Algorithm[Any, Any]]] = {}

ParamsT = TypeVar("ParamsT", bound=StrictModel)
"""An algorithm's config parameters (its ``params_class``)."""
StateT = TypeVar("StateT")
"""An algorithm's server state (what ``aggregate`` returns and ``broadcast`` reads)."""
AlgorithmT = TypeVar("AlgorithmT", bound="type[Algorithm[Any, Any]]")


@dataclass
class ClientResult:
    """What one client's local work produced. The engine reads the named fields (the
    ``clients`` table's ``num_samples`` and ``train_loss`` columns, the round's sample-weighted
    ``train_loss``, the divergence check); ``metrics`` holds the algorithm's own numbers."""

    upload: dict[str, Any]
    """Message type -> payload sent to the server (counted in ``bytes_up``)."""
    state: Any = None
    """Persistent client state, kept resident on the client's worker."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Algorithm-specific per-client numbers for the ``clients`` table (steps, ...)."""
    num_samples: int = 0
    """Training samples the client holds (the weight of its upload in sample-weighted means)."""
    train_loss: float | None = None
    """The round's mean training loss (None: the algorithm reports none). A NaN or infinite
    loss stops the run as diverged."""
    weight: float = 1.0
    """The client's weight in the server's mean of its :attr:`Algorithm.mean_uploads` (its
    sample count, or 1 for a plain mean)."""

    @classmethod
    def trained(cls, upload: dict[str, Any], state: Any, outcome: TrainOutcome | FitOutcome,
                weight: float = 1.0, **metrics: float) -> ClientResult:
        """The result of a client whose round was local training (``runtime.train``, or
        :func:`~raysim.training.client_fit.fit_client` under the method's own objective)."""
        return cls(upload, state, {"steps": float(outcome.steps), **metrics},
                   outcome.num_samples, outcome.mean_loss, weight)


class Algorithm(ABC, Generic[ParamsT, StateT]):
    """Base class of federated algorithms, generic over their config parameters and their
    server state (``class FedAvg(Algorithm[FedAvgParams, Weights])``); subclasses override the
    hooks they need."""

    params_class: ClassVar[type[StrictModel]]
    pooled: ClassVar[bool] = False
    """True when the algorithm trains on the union of all clients' data (centralized)."""
    supports: ClassVar[Supports] = Supports()
    """What the method supports and why it refuses the rest (:class:`~raysim.algorithms.
    supports.Supports`, one declaration per method)."""
    per_client_loop: ClassVar[str | None] = None
    """Why this method always trains clients one after another (the per-client path), when
    it does: the run then reports that reason, not the vectorised path's choice."""
    personalized: ClassVar[bool] = False
    """True when clients keep personal models (evaluated on their own test shares)."""
    @classmethod
    def describe(cls, params: Any) -> str:
        """The method a configuration of this algorithm amounts to, as the results name it
        (their ``algorithm`` column, the reports' and plots' labels); default: its name.
        FedDC with daisy-chaining off is FedAvg, and says so."""
        return str(params.name)

    headline_metric: ClassVar[str] = "accuracy"
    """The metric the method's paper reports first: what ``raysim run`` plots at the end
    (``personal_accuracy`` for methods judged on each client's own test share)."""
    relayed_uploads: ClassVar[tuple[str, ...]] = ()
    """Upload types the server forwards to another client (counted again as bytes down)."""
    evaluation_uploads: ClassVar[tuple[str, ...]] = ()
    """Upload types that only feed the server's evaluation, not communication (not counted)."""
    mean_uploads: ClassVar[tuple[str, ...]] = ()
    """Upload types whose server step is their mean: each client uploads a model trained
    from the broadcast entry of the same name with its :attr:`ClientResult.weight`, and the
    next server state is their weighted mean (FedAvg, FedProx: ``("model",)``). Declaring
    them opts the algorithm into the layers that change how such a mean is taken:
    client-level DP (``privacy:``, :mod:`raysim.layers.dp_mean`) and asynchronous
    buffered rounds (``system.policy: fedbuff``, :mod:`raysim.layers.fedbuff`). A subclass
    that overrides a round hook must declare it again (nothing is inherited by accident)."""
    bookkeeping_broadcasts: ClassVar[tuple[str, ...]] = ()
    """Broadcast entries that carry the simulation's bookkeeping, not communication (not
    counted in ``bytes_down``)."""
    server_holds_inputs: ClassVar[bool] = False
    """True when the server works on (unlabelled) training inputs, e.g. FedDF's public set:
    the driver then calls :meth:`attach_server_inputs` once before round 0."""

    @classmethod
    def config_warnings(cls, params: Any, training: Any) -> list[str]:
        """Lines a run of this method prints before it starts, for settings it accepts but
        where it is known to do worse than published (``training``: the config's
        ``training`` section). None by default."""
        return []

    @classmethod
    def tail_phase(cls, params: Any) -> tuple[str, int] | None:
        """Where a run's last rounds are of another kind than the rest (FedSM-extra's selector
        rounds): the config key that sets how many, and their number; None (the default):
        every round is of one kind. ``raysim estimate`` probes the two kinds apart."""
        return None

    def __init__(self, params: ParamsT, context: RunContext):
        self.params: ParamsT = params
        self.context = context
        if self.supports.cross_entropy_only and context.training.loss != "cross_entropy":
            raise ConfigError(
                f"{self.supports.cross_entropy_only}; training.loss is {context.training.loss!r}. "
                f"Set training.loss: cross_entropy for {type(self).__name__}.")

    # ----- the one weighting rule -----
    @property
    def weights_by_samples(self) -> bool:
        """Whether the server's means weight each client by its sample count
        (``params.weighted``, where the method has it; True otherwise) rather than one vote
        each. A method may add a condition (FedDF and FedSM: not under client-level DP)."""
        return bool(getattr(self.params, "weighted", True))

    def client_weight(self, num_samples: int) -> float:
        """A client's weight in the server's means (its :attr:`ClientResult.weight`): its
        sample count under :attr:`weights_by_samples`, else 1."""
        return sample_weight(num_samples, self.weights_by_samples)

    # ----- server side (runs on the driver) -----
    def init_server_state(self, initial_weights: Weights) -> StateT:
        """The server state before round 0 (default: the initial global model)."""
        return cast(StateT, initial_weights)

    def attach_server_inputs(self, train_x: np.ndarray,
                             client_indices: Sequence[np.ndarray]) -> None:
        """Give the server the training inputs (no labels) and the partition; called on the
        driver before round 0 when ``server_holds_inputs`` (default: nothing)."""
        return None

    def broadcast(self, state: StateT, round_: int) -> dict[str, Any]:
        """Message type -> payload sent to every sampled client (default: nothing)."""
        return {}

    def aggregate(self, state: StateT, partials: Sequence[Any], round_: int) -> StateT:
        """The next server state from the per-group partials (default: unchanged)."""
        return state

    def server_step(self, state: StateT, mean: Weights) -> StateT:
        """The server state after a round whose (buffered) mean model is ``mean``, for the
        layers that compute the mean themselves (FedBuff; DP's private mean of an algorithm
        with several ``mean_uploads``, which passes ``{upload: its mean}``): plain averaging
        takes the mean as the next model; a server optimizer layer steps towards it."""
        return cast(StateT, mean)

    def global_weights(self, state: StateT) -> Weights | None:
        """The model evaluated on the global test set, or None if there is no global model."""
        return None

    def evaluation_models(self, state: StateT) -> dict[str, Any]:
        """Server-side models to evaluate on the test set, by column prefix: "" gives the
        ``accuracy``, ``loss``, ... columns, e.g. "gm_" gives ``gm_accuracy``. Each value is
        what :meth:`predict` takes (default: the global weights, if any)."""
        weights = self.global_weights(state)
        return {} if weights is None else {"": weights}

    def predict(self, runtime: ClientRuntime, model: Any, x: np.ndarray, sources: np.ndarray,
                batch_size: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Class probabilities of an evaluation model on stored test inputs ``x`` and, for
        models that route each sample to one of several models, the route taken per sample
        (-1: the global model, k: client k's model), else None. ``sources``: the client whose
        test share holds each sample (-1: the unseen client, -2: none)."""
        module = runtime.model
        set_weights(module, model)
        return predict_proba(module, x, runtime.info, batch_size, runtime.device), None

    def predict_many(self, runtime: ClientRuntime, models: dict[str, Any], x: np.ndarray,
                     sources: np.ndarray, batch_size: int
                     ) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """Every evaluation model on one chunk of test inputs (override to share work between
        models, e.g. one selector pass for several gammas)."""
        return {name: self.predict(runtime, model, x, sources, batch_size)
                for name, model in models.items()}

    def shared_models(self) -> dict[str, nn.Module]:
        """Models besides the clients' own that every client trains and sends (e.g. MH-pFLID's
        messenger), by name, for the cost table (parameters, FLOPs)."""
        return {}

    def cost_table(self) -> pd.DataFrame:
        """Parameters and forward FLOPs of every client's model at its input size and of the
        shared models (:func:`raysim.models.costs.cost_table`)."""
        from raysim.models.costs import cost_table

        context = self.context
        return cost_table(context.info, [context.architecture(c) for c in range(
            context.num_clients)], [context.downsample[c] if context.downsample else 1
                                    for c in range(context.num_clients)], self.shared_models())

    def migration(self, round_: int) -> np.ndarray | None:
        """``destination[c]``: the client that receives client c's persistent state after this
        round's local work, or None to keep states where they are."""
        return None

    # ----- client side (runs on the workers) -----
    @abstractmethod
    def local_updates(
        self,
        runtime: ClientRuntime,
        clients: Sequence[int],
        round_: int,
        message: dict[str, Any],
        states: Sequence[Any],
    ) -> list[ClientResult]:
        """The local work of several clients of one group (in client order) in a round."""

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> Any:
        """Pre-aggregate the results of one client group, given in client order."""
        return None

    @classmethod
    def dp_releases_per_round(cls, params: Any) -> int:
        """The most DP releases a client makes in one round (separately clipped and noised
        uploads; default one), which calibration and the budget cap count for every round."""
        return 1

    def dp_releases(self, rounds_done: int) -> int:
        """How many differentially private releases a client has made after ``rounds_done``
        rounds (the accountant composes that many sampled Gaussian mechanisms; default: one
        per round)."""
        return rounds_done

    def merge(self, left: Any, right: Any) -> Any:
        """Merge the partials of two adjacent ranges of client groups (``left`` first), along
        the fixed reduction tree (default: :func:`~raysim.vectors.weighted_sum.merge_partials`:
        weighted sums add in place, lists concatenate, dicts merge by key). ``aggregate`` then
        receives the one merged partial."""
        from raysim.vectors.weighted_sum import merge_partials

        return merge_partials(left, right)

    def membership_scores(self, runtime: ClientRuntime, client: int, upload: dict[str, Any],
                          x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
        """The membership-inference attack on one client's upload (the audit of
        ``evaluation.membership_audit``): scores of stored samples (x, y), higher = more likely
        a member, or None when nothing in the upload is attackable. Default: the loss attack
        on an uploaded ``model`` (Yeom et al. 2018)."""
        if "model" not in upload:
            return None
        return loss_attack_scores(runtime, client, upload["model"], x, y)

    def personal_weights(self, state: Any) -> Weights | None:
        """A client's own model, evaluated on its test share and the global test set."""
        return None

    def personal_base(self, state: StateT) -> Weights | None:
        """The part of the server state that every client's personal model is built on (the
        layers FedBN, FedRep and LG-FedAvg share, APFL's global model), sent to the workers
        that evaluate personal models; None (the default): a personal model is its client's
        state alone (:meth:`personal_weights`)."""
        return None

    def compose_personal(self, state: Any, base: Weights | None) -> Weights | None:
        """A client's personal model from its state and the round's :meth:`personal_base`
        (default: :meth:`personal_weights` of the state alone)."""
        return self.personal_weights(state)


ROUND_HOOKS = ("broadcast", "local_updates", "reduce", "aggregate")
"""The hooks whose override may change what an upload is or how it is combined."""


def register_algorithm(cls: AlgorithmT) -> AlgorithmT:
    """Class decorator: register an algorithm under its params' ``name`` literal. A class
    that inherits :attr:`Algorithm.mean_uploads` and overrides a round hook must declare them
    in its own body: the DP and FedBuff layers would otherwise take its uploads for plain
    means (e.g. a SCAFFOLD written as a FedAvg subclass, whose control variates are not)."""
    overridden = [hook for hook in ROUND_HOOKS if hook in vars(cls)]
    if cls.mean_uploads and overridden and "mean_uploads" not in vars(cls):
        raise TypeError(
            f"{cls.__name__} overrides {', '.join(overridden)} and inherits mean_uploads = "
            f"{cls.mean_uploads!r}: declare mean_uploads in {cls.__name__}'s own body (() if "
            "its server step is not the weighted mean of those uploads)")
    params = cls.params_class
    name = params.model_fields["name"].default
    taken = ALGORITHMS.get(name)
    if taken is not None and _qualified(taken) != _qualified(cls):
        raise ValueError(
            f"the algorithm name {name!r} of {_qualified(cls)} is taken by {_qualified(taken)}; "
            "give the params class another `name` literal")
    ALGORITHMS[name] = cls
    if params not in ALGORITHM_PARAMS:  # a plug-in's: the config schema takes it from here
        PLUGIN_ALGORITHM_PARAMS[:] = [p for p in PLUGIN_ALGORITHM_PARAMS
                                      if p.model_fields["name"].default != name] + [params]
    return cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"

