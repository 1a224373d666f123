"""FedSM (Xu et al., CVPR 2022): a global model (FedAvg), SoftPull-personalized models and a
model selector, combined at inference into a "super model".

Every round each client trains, on the same batches, the global model from the server and its
own personalized model (resident on its worker, with its optimizer state), plus the selector:
a classifier of the run's architecture whose label is the client's index, trained full-batch
(gradients accumulated over the local data, one Adam step per local epoch). The server averages
the global model, the selector and the selector's Adam moments (each client only ever sees its
own label, so its moments alone would be meaningless), and applies SoftPull to the personalized
models: w_k <- lambda w_k + (1 - lambda) / (K - 1) * sum_{j != k} w_j (lambda = 1/K is plain
averaging). The server broadcasts the sum of the personalized models once; each client pulls
its own resident model with it, exactly as the server pulls its copies.

Inference: the selector's top probability above gamma picks that client's personalized model,
otherwise the global model (gamma = 1: global only). FedSM-extra (``variant: extra``) trains the
global and personalized models for ``rounds - extra_rounds`` rounds, then only the selector for
``extra_rounds`` rounds, with labels argmin_k CE(model_k) over {global, personalized 1..K} of
the frozen models, and routes every sample to the selector's arg max.

Under ``privacy`` (local mode only; every client takes part every round, so the sampling rate
is 1) each client clips and noises three uploads separately, each against a model the server
knows: the global model and the selector against the broadcast, the personalized model against
its SoftPull start; the client keeps its noised personalized model and starts the next round
from it (so every start is public), the selector's Adam moments are not uploaded, and the
server averages with one vote each. The accountant composes one Gaussian mechanism per upload
(:meth:`FedSM.dp_releases`).

Evaluation models: the super model (columns ``accuracy``, ``own_accuracy``, ...), the global
model (``gm_``), each client's personalized model on its own test share (``pm_``), and the super
model at every gamma of ``gamma_sweep`` (``g<gamma>_``); routes go to the ``selection`` table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from raysim.algorithms.base import Algorithm, ClientResult, RunContext, register_algorithm
from raysim.algorithms.params import FedSMParams
from raysim.algorithms.supports import Supports
from raysim.data.dataset import DataInfo
from raysim.errors import field_error
from raysim.models import MODELS, build_model
from raysim.privacy.uploads import privatize_upload, privatize_uploads
from raysim.seeding import torch_generator
from raysim.training.evaluation import predict_proba
from raysim.training.losses import sample_losses
from raysim.vectors.weighted_sum import WeightedSum, mean_partial, weighted_mean
from raysim.vectors.weights import Weights, get_weights, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime

GLOBAL = -1  # route of a sample answered by the global model
SEGMENTATION_SELECTOR = "vgg"
"""The selector of a segmentation run without ``algorithm.selector_model``: VGG-11, as in the
paper (its global and personalized models are the run's segmentation network)."""


def soft_pull(own: Weights, total: dict[str, np.ndarray], lam: float, clients: int) -> Weights:
    """SoftPull of one personalized model given the sum of all K of them (computed in
    float64, returned in the model's dtypes)."""
    pulled = {}
    for name, array in own.items():
        mixed = lam * array.astype(np.float64) + (1.0 - lam) / (clients - 1) * (
            total[name].astype(np.float64) - array.astype(np.float64))
        pulled[name] = (np.rint(mixed) if np.issubdtype(array.dtype, np.integer)
                        else mixed).astype(array.dtype)
    return pulled


def _sum_models(models: Sequence[Weights]) -> dict[str, np.ndarray]:
    return WeightedSum.of(models, [1.0] * len(models)).sums


@register_algorithm
class FedSM(Algorithm[FedSMParams, dict[str, Any]]):
    """Global + SoftPull-personalized + selector models; super-model inference."""

    params_class = FedSMParams
    supports: ClassVar[Supports] = Supports(
        asynchronous_refusal=("its SoftPull mixes the personalized models of one synchronous round, and "
            "its selector is trained on all of them"),
        private_releases=("its clients release their global-model and selector updates and keep their "
            "personalized models as released, each clipped and noised"),
        central_privacy_refusal=("its super model routes each sample to an individual client's "
            "personalized model, and central noise protects only sums of models"),
        segmentation_refusal=None)

    @property
    def weights_by_samples(self) -> bool:
        """Sample-weighted means (``weighted``), but one vote each under client-level DP:
        the released models' sensitivity is bounded per client."""
        return super().weights_by_samples and self.context.privacy is None

    def __init__(self, params: FedSMParams, context: RunContext):
        super().__init__(params, context)
        k = context.num_clients
        if k < 2:
            raise field_error("partition.num_clients", k, "FedSM needs at least 2 clients (the "
                              "selector tells clients apart and SoftPull mixes their models)")
        if not 1.0 / k - 1e-12 <= params.softpull_lambda <= 1.0:
            raise field_error("algorithm.softpull_lambda", params.softpull_lambda,
                              f"SoftPull's lambda lies in [1/K, 1] = [{1 / k:.4g}, 1] for "
                              f"K={k} clients")
        if context.clients_per_round != k:
            raise field_error("training.clients_per_round", context.clients_per_round,
                              "FedSM trains every client every round (SoftPull mixes all K "
                              "personalized models); remove it or set it to "
                              "partition.num_clients")
        if params.extra_rounds >= context.training.rounds:
            raise field_error("algorithm.extra_rounds", params.extra_rounds,
                              f"FedSM-extra needs main rounds before the {params.extra_rounds} "
                              f"selector rounds; use fewer than training.rounds="
                              f"{context.training.rounds}")
        self.outputs = k + 1 if params.variant == "extra" else k
        self.selector_params = context.model
        if params.selector_model is None and context.info.segmentation:
            # the paper's selector for its segmentation tasks: VGG-11 (the zoo's, BatchNorm)
            self.selector_params = MODELS[SEGMENTATION_SELECTOR].params.model_validate(
                {"name": SEGMENTATION_SELECTOR})
        elif params.selector_model is not None:
            name = params.selector_model.get("name")
            if name not in MODELS:
                raise field_error("algorithm.selector_model.name", name,
                                  f"a model name ({', '.join(sorted(MODELS))})")
            try:
                self.selector_params = MODELS[name].params(**params.selector_model)
            except ValueError as error:
                raise field_error("algorithm.selector_model", params.selector_model,
                                  f"a valid {name} section ({error})") from None
        self._selector: nn.Module | None = None

    # ----- privacy -----
    @classmethod
    def dp_releases_per_round(cls, params: Any) -> int:
        """FedSM: global and personalized models, and the selector in its rounds."""
        return 3 if params.variant == "fedsm" else 2

    @classmethod
    def tail_phase(cls, params: Any) -> tuple[str, int] | None:
        """FedSM-extra: its last ``extra_rounds`` rounds train only the selector."""
        return ("algorithm.extra_rounds", params.extra_rounds) if params.variant == "extra" \
            else None

    def dp_releases(self, rounds_done: int) -> int:
        """Every main round releases the global and the personalized model (and with variant
        fedsm the selector), every FedSM-extra round the selector: each one Gaussian
        mechanism (separately clipped and noised), composed at rate 1 (every client, every
        round)."""
        main = min(rounds_done, self._main_rounds())
        return main * self.dp_releases_per_round(self.params) + (rounds_done - main)

    # ----- server -----
    def _main_rounds(self) -> int:
        return self.context.training.rounds - self.params.extra_rounds

    def init_server_state(self, initial_weights: Weights) -> dict[str, Any]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch_generator(self.context.seed, "selector-init")
                                  .initial_seed()))
            selector = get_weights(self._build_selector())
        k = self.context.num_clients
        return {"global": initial_weights, "selector": selector, "selector_adam": None,
                "personal": [initial_weights] * k, "personal_sum": None}

    def broadcast(self, state: dict[str, Any], round_: int) -> dict[str, Any]:
        if round_ >= self._main_rounds():  # FedSM-extra: selector rounds on frozen models
            return {"selector": state["selector"], "selector_adam": state["selector_adam"],
                    "model": state["global"], "personal_models": state["personal"]}
        message = {"model": state["global"], "personal_sum": state["personal_sum"]}
        if self.params.variant == "fedsm":
            message |= {"selector": state["selector"], "selector_adam": state["selector_adam"]}
        return {k: v for k, v in message.items() if v is not None}

    def aggregate(self, state: dict[str, Any], partials: Sequence[dict[str, Any]],
                  round_: int) -> dict[str, Any]:
        state = dict(state)
        for key in ("global", "selector", "selector_adam"):
            parts = [p[key] for p in partials if p.get(key) is not None]
            if parts:
                state[key] = weighted_mean(parts)
        personal = {c: w for p in partials for c, w in p.get("personal", {}).items()}
        if personal:
            models = [personal[c] for c in sorted(personal)]
            # shipped in the models' own dtype, so the broadcast costs one model
            total = {name: array.astype(models[0][name].dtype)
                     for name, array in _sum_models(models).items()}
            state["personal_sum"] = total
            state["personal"] = [soft_pull(w, total, self.params.softpull_lambda, len(models))
                                 for w in models]
        return state

    def global_weights(self, state: dict[str, Any]) -> Weights:
        return state["global"]

    def evaluation_models(self, state: dict[str, Any]) -> dict[str, Any]:
        def super_model(gamma: float) -> dict[str, Any]:
            return {"kind": "super", "global": state["global"], "selector": state["selector"],
                    "personal": state["personal"], "gamma": gamma}

        models = {"": super_model(self.params.gamma), "gm_": state["global"],
                  "pm_": {"kind": "own", "global": state["global"],
                          "personal": state["personal"]}}
        for gamma in self.params.gamma_sweep:
            models[f"g{gamma:g}_"] = super_model(gamma)
        return models

    # ----- client -----
    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        if "personal_models" in message:  # FedSM-extra selector round
            results = [self._selector_round(runtime, c, round_, message) for c in clients]
        else:
            results = self._round(runtime, clients, round_, message, states)
        privacy = self.context.privacy
        if privacy is not None:  # its own DP: each released update clipped and noised
            privatize_uploads(list(zip(clients, results, strict=True)), ("model", "selector"),
                              lambda kind, client: message[kind], message, privacy,
                              self.context.seed, round_, runtime.device)
        return results

    def _round(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
               message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        """A round of the global, personalized and (when sent) selector models."""
        n = len(clients)
        trained_global = runtime.train_many(clients, round_, [message["model"]] * n, [None] * n)
        own = [runtime.initial_weights if s is None else s[0] for s in states]
        if "personal_sum" in message:
            own = [soft_pull(w, message["personal_sum"], self.params.softpull_lambda,
                             self.context.num_clients) for w in own]
        trained_personal = runtime.train_many(clients, round_, own,
                                              [None if s is None else s[1] for s in states])
        privacy = self.context.privacy
        results = []
        for client, (g, g_out), (p, p_out), start in zip(clients, trained_global,
                                                          trained_personal, own, strict=True):
            metrics = {"personal_train_loss": p_out.mean_loss}
            if privacy is not None:  # the client keeps (and next starts from) its release
                p, dp_metrics = privatize_upload(p, start, "personal", privacy.clip, privacy,
                                                 self.context.seed, round_, client,
                                                 runtime.device)
                metrics |= dp_metrics
            upload = {"model": g, "personal": p}
            if "selector" in message:
                x, _ = runtime.client_data(client)
                selector, moments, loss = self._train_selector(runtime, x, message,
                                                               np.full(len(x), client))
                upload |= {"selector": selector, **self._moments_upload(moments)}
                metrics["selector_loss"] = loss
            results.append(ClientResult.trained(upload, (p, p_out.optimizer_state), g_out,
                                                **metrics))
        return results

    def _selector_round(self, runtime: ClientRuntime, client: int, round_: int,
                        message: dict[str, Any]) -> ClientResult:
        """FedSM-extra: label each sample with the frozen model of least loss, train the
        selector on those labels."""
        x, y = runtime.client_data(client)
        candidates = [message["model"], *message["personal_models"]]
        losses = []
        module = runtime.model
        batch = runtime.training.batch_size
        for weights in candidates:
            set_weights(module, weights)
            with torch.no_grad():
                module.eval()
                losses.append(torch.cat([
                    sample_losses(module(x[start:start + batch]), y[start:start + batch],
                                  runtime.info.multi_label)
                    for start in range(0, len(y), batch)]))
        labels = torch.stack(losses).argmin(dim=0).cpu().numpy()
        selector, moments, loss = self._train_selector(runtime, x, message, labels)
        return ClientResult({"selector": selector, **self._moments_upload(moments)}, None,
                            {"selector_loss": loss}, len(y))

    def _moments_upload(self, moments: Weights) -> dict[str, Weights]:
        """The selector's Adam moments as an upload; under ``privacy`` none (they are not
        privatized: every round's selector steps start from fresh moments)."""
        return {} if self.context.privacy is not None else {"selector_adam": moments}

    def _train_selector(self, runtime: ClientRuntime, x: torch.Tensor, message: dict[str, Any],
                        labels: np.ndarray) -> tuple[Weights, Weights, float]:
        """Full-batch Adam steps (one per local epoch) on a client's inputs ``x`` from the
        broadcast selector and moments."""
        module = self._selector_module(runtime)
        set_weights(module, message["selector"])
        optimizer = torch.optim.Adam(module.parameters(), lr=self.params.selector_lr)
        if message.get("selector_adam") is not None:
            optimizer.load_state_dict(_adam_state(message["selector_adam"], optimizer))
        targets = torch.from_numpy(np.asarray(labels, dtype=np.int64)).to(runtime.device)
        batch = runtime.training.batch_size
        module.train()
        loss_value = 0.0
        for _ in range(self.params.selector_epochs or runtime.training.epochs or 1):
            optimizer.zero_grad(set_to_none=True)
            loss_value = 0.0
            for start in range(0, len(targets), batch):
                chunk = slice(start, start + batch)
                loss = nn.functional.cross_entropy(module(x[chunk]), targets[chunk],
                                                   reduction="sum") / len(targets)
                loss.backward()
                loss_value += float(loss.detach())
            optimizer.step()
        return get_weights(module), _adam_moments(optimizer), loss_value

    def _build_selector(self) -> nn.Module:
        return build_model(self.selector_params, self._selector_info())

    def _selector_info(self) -> DataInfo:
        """The selector's task: one class per candidate model (whatever the data's task)."""
        return replace(self.context.info, num_classes=self.outputs, task="multi-class",
                       label_names=())

    def _selector_module(self, runtime: ClientRuntime) -> nn.Module:
        if self._selector is None:
            self._selector = runtime.place(self._build_selector())
        return self._selector

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> dict[str, Any]:
        partial: dict[str, Any] = {}
        counts = [r.num_samples for _, r in results]
        weighted = self.weights_by_samples
        for key, out in (("model", "global"), ("selector", "selector"),
                         ("selector_adam", "selector_adam")):
            uploads = [r.upload[key] for _, r in results if key in r.upload]
            if uploads:
                partial[out] = mean_partial(uploads, counts, weighted)
        personal = {c: r.upload["personal"] for c, r in results if "personal" in r.upload}
        if personal:
            partial["personal"] = personal
        return partial

    # ----- inference -----
    def predict_many(self, runtime: ClientRuntime, models: dict[str, Any], x: np.ndarray,
                     sources: np.ndarray, batch_size: int
                     ) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """All evaluation models on one chunk, with one selector pass shared by every gamma."""
        scores = None
        outputs = {}
        for name, model in models.items():
            if isinstance(model, dict) and model.get("kind") == "super" and scores is None:
                selector = self._selector_module(runtime)
                set_weights(selector, model["selector"])  # the same selector for every gamma
                scores = predict_proba(selector, x, self._selector_info(), batch_size,
                                       runtime.device)
            outputs[name] = self._predict(runtime, model, x, sources, batch_size, scores)
        return outputs

    def predict(self, runtime: ClientRuntime, model: Any, x: np.ndarray, sources: np.ndarray,
                batch_size: int) -> tuple[np.ndarray, np.ndarray | None]:
        return self.predict_many(runtime, {"": model}, x, sources, batch_size)[""]

    def _predict(self, runtime: ClientRuntime, model: Any, x: np.ndarray, sources: np.ndarray,
                 batch_size: int, scores: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray | None]:
        if not isinstance(model, dict) or "kind" not in model:
            return super().predict(runtime, model, x, sources, batch_size)
        if model["kind"] == "own":  # each sample's own client's personalized model
            routes = np.where(sources >= 0, sources, GLOBAL)
        elif scores is None:
            raise ValueError("a super model is predicted with the selector's scores")
        elif self.params.variant == "extra":  # class 0 is the global model
            routes = scores.argmax(axis=1) - 1
        else:
            routes = np.where(scores.max(axis=1) > model["gamma"], scores.argmax(axis=1), GLOBAL)
        # class probabilities per sample, or predicted masks for a segmentation task
        predictions: np.ndarray | None = None
        module = runtime.model
        for route in np.unique(routes):
            rows = np.flatnonzero(routes == route)
            set_weights(module, model["global"] if route == GLOBAL else model["personal"][route])
            predicted = predict_proba(module, x[rows], runtime.info, batch_size, runtime.device)
            if predictions is None:
                predictions = np.zeros((len(x), *predicted.shape[1:]), predicted.dtype)
            predictions[rows] = predicted
        if predictions is None:  # no sample: the empty predictions of the task
            predictions = predict_proba(module, x, runtime.info, batch_size, runtime.device)
        return predictions, routes


def _adam_moments(optimizer: torch.optim.Adam) -> Weights:
    """Adam's moment estimates and step count as arrays (averaged by the server)."""
    moments: dict[str, np.ndarray] = {}
    for index, entry in optimizer.state_dict()["state"].items():
        moments[f"{index}.exp_avg"] = entry["exp_avg"].cpu().numpy().copy()
        moments[f"{index}.exp_avg_sq"] = entry["exp_avg_sq"].cpu().numpy().copy()
        moments[f"{index}.step"] = np.asarray(float(entry["step"]), dtype=np.float64)
    return moments


def _adam_state(moments: Weights, optimizer: torch.optim.Adam) -> dict[str, Any]:
    """An Adam state dict built from averaged moments."""
    state = optimizer.state_dict()
    indices = sorted({int(key.split(".")[0]) for key in moments})
    state["state"] = {i: {"step": torch.tensor(float(moments[f"{i}.step"])),
                          "exp_avg": torch.from_numpy(np.array(moments[f"{i}.exp_avg"])),
                          "exp_avg_sq": torch.from_numpy(np.array(moments[f"{i}.exp_avg_sq"]))}
                      for i in indices}
    return state
