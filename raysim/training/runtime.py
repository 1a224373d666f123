"""What a client's local work runs on: the worker's data, resident model and local trainer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from raysim.configuration.schema import OptimizerConfig
from raysim.data.dataset import DataInfo
from raysim.seeding import client_keys, seed_sequence
from raysim.training.client_models import ClientModels
from raysim.training.client_rows import ClientRows
from raysim.training.compiled_step import likely_counts, warm_shapes
from raysim.training.context import ClientData, RunContext
from raysim.training.first_step import FirstStepFromStart
from raysim.training.losses import loss_function, training_loss
from raysim.training.merged_training import JobResult, VectorizedJob, train_jobs
from raysim.training.vectorized import (
    LOOP,
    VECTORIZED,
    choose_path,
    plans_on_device,
    step_batches,
)
from raysim.vectors.weights import (
    FlatWeights,
    Proximal,
    Weights,
    convert_once,
    on_device,
    release_state,
    set_weights,
)


@dataclass
class TrainOutcome:
    """The result of one client's local training."""

    mean_loss: float
    num_samples: int
    steps: int
    optimizer_state: dict[str, Any] | None
    """What the optimizer carries to the client's next round (None: nothing, e.g. SGD
    without momentum; a fresh optimizer of the same config is the same)."""


@dataclass
class StepLosses:
    """One client's training losses, step by step, still on the device: each step's mean
    batch loss (detached) and its batch size. Their sum weighted by the batch sizes is taken
    on the host (:func:`losses_to_host`), so a step queues no kernel for it."""

    losses: list[torch.Tensor]
    sizes: list[int]

    @property
    def seen(self) -> int:
        """Samples seen (with repeats): the sum of the batch sizes."""
        return sum(self.sizes)


@dataclass
class _Trained:
    """One client's training with its losses still on the device."""

    losses: StepLosses
    num_samples: int
    steps: int
    optimizer_state: dict[str, Any] | None

    def outcome(self, total_loss: float) -> TrainOutcome:
        """The outcome, given the summed loss read back to the host."""
        return TrainOutcome(total_loss / max(self.losses.seen, 1), self.num_samples, self.steps,
                            self.optimizer_state)


def losses_to_host(totals: Sequence[StepLosses]) -> list[float]:
    """Each client's summed loss, sum over steps of loss x batch size, as a Python float; the
    step losses of all clients are read back together (one wait for the device, not one per
    client or step). The sum is taken in the losses' dtype, step after step from zero: the
    bits of accumulating ``loss * size`` into a zero tensor on the device. Tests count its
    calls."""
    steps = [loss for total in totals for loss in total.losses]
    if not steps:
        return [0.0] * len(totals)
    values = torch.stack(steps).cpu().numpy()
    dtype = values.dtype.type
    sums, position = [], 0
    for total in totals:
        count = len(total.losses)
        products = values[position:position + count] * np.asarray(total.sizes, values.dtype)
        position += count
        summed = dtype(0)
        for product in products:
            summed = dtype(summed + product)
        sums.append(float(summed))
    return sums


def make_optimizer(parameters: Any, config: OptimizerConfig) -> torch.optim.Optimizer:
    """Build the configured optimizer."""
    if config.name == "sgd":
        return torch.optim.SGD(parameters, lr=config.lr, momentum=config.momentum,
                               weight_decay=config.weight_decay)
    optimizer_class = torch.optim.Adam if config.name == "adam" else torch.optim.AdamW
    return optimizer_class(parameters, lr=config.lr, weight_decay=config.weight_decay)


def batch_bounds(num_samples: int, batch_size: int) -> list[tuple[int, int]]:
    """[start, stop) of each minibatch of an epoch; a trailing batch of one sample joins the
    previous batch (BatchNorm cannot train on one sample)."""
    bounds = [(i, min(i + batch_size, num_samples)) for i in range(0, num_samples, batch_size)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], num_samples)]
    return bounds


def batch_plans(num_samples: int, batch_size: int, epochs: int | None, steps: int | None,
                seed: int, round_: int, clients: np.ndarray, stream: str = "batches"
                ) -> list[np.ndarray]:
    """Minibatch positions (into each client's local data) for one round of many clients of
    the same size: a list over steps of (clients, batch) arrays.

    Each epoch is a fresh permutation from the client's own stream (seed, ``stream``, round,
    client); a round of ``steps`` runs through as many epochs as it needs.
    """
    bounds = batch_bounds(num_samples, batch_size)
    if steps is None:
        schedule = [(epoch, b) for epoch in range(epochs or 1) for b in bounds]
    else:
        schedule = [(k // len(bounds), bounds[k % len(bounds)]) for k in range(steps)]
    num_epochs = schedule[-1][0] + 1
    keys = client_keys(seed, stream, round_, clients, num_epochs * num_samples)
    orders = np.argsort(keys.reshape(len(clients), num_epochs, num_samples), axis=2,
                        kind="stable")
    return [orders[:, epoch, start:stop] for epoch, (start, stop) in schedule]


def rng_seed(seed: int, purpose: str, round_: int, client: int) -> int:
    """A 63-bit integer seed for the stream (seed, purpose, round, client)."""
    return int(seed_sequence(seed, purpose, round_, client).generate_state(1, np.uint64)[0] >> 1)


def warm_up(model: nn.Module, info: DataInfo, config: OptimizerConfig, device: torch.device) -> None:
    """Run one throw-away optimizer step so lazy imports and kernel selection happen before
    round 0 (keeps first-round timings honest). Leaves the model's weights as they were."""
    saved = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    optimizer = make_optimizer(model.parameters(), config)
    model.train()
    batch = torch.zeros((2, *info.input_shape), device=device)
    model(batch).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.load_state_dict(saved)


def proximal_term(model: nn.Module, anchor: Weights, mu: float) -> Callable[[], torch.Tensor]:
    """``() -> mu/2 * sum ||p - anchor_p||^2`` over the model's trainable parameters (the
    anchor is put on the model's device once; views of it when it is there already)."""
    device = next(model.parameters()).device
    anchored = on_device(anchor, device)
    entries = anchored.tensors()
    pairs = [(param, entries[name]) for name, param in model.named_parameters()
             if param.requires_grad]

    def term() -> torch.Tensor:
        return cast(torch.Tensor, 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in pairs))

    return term


def linear_term(model: nn.Module, shift: Weights) -> Callable[[], torch.Tensor]:
    """``() -> sum <shift_p, p>`` over the model's trainable parameters named in ``shift``:
    added to the loss, it adds ``shift_p`` to every step's gradient of ``p`` (a gradient
    correction, e.g. SCAFFOLD's c - c_i)."""
    device = next(model.parameters()).device
    shifted = on_device(shift, device).tensors()
    pairs = [(param, shifted[name]) for name, param in model.named_parameters()
             if param.requires_grad and name in shifted]

    def term() -> torch.Tensor:
        return cast(torch.Tensor, sum((p * s).sum() for p, s in pairs))

    return term


def _sum_of(terms: Sequence[Callable[[], torch.Tensor] | None]
            ) -> Callable[[], torch.Tensor] | None:
    """One regularizer adding the given ones (None when there is none)."""
    present = [t for t in terms if t is not None]
    if len(present) <= 1:
        return present[0] if present else None
    return lambda: cast(torch.Tensor, sum(t() for t in present))


class ClientRuntime(ClientRows, ClientModels):
    """Per-worker services for the algorithms' client code: the clients' training rows
    (:class:`~raysim.training.client_rows.ClientRows`), their models (:class:`~raysim.
    training.client_models.ClientModels`: one resident model per architecture, weights
    loaded into it for each client) and, here, the local training shared by every algorithm
    (the per-client loop and the vectorised path, and which of the two a run takes).
    """

    def __init__(self, context: RunContext, data: ClientData, device: torch.device,
                 vectorize: str = "auto", per_client_loop: str | None = None,
                 compile_step: str = "never"):
        ClientRows.__init__(self, data, context.info, device, context.downsample)
        ClientModels.__init__(self, context, data.initial_weights, device)
        self.context = context
        self.training = context.training
        self.job_trainer: Callable[[list[VectorizedJob]], list[JobResult]] = train_jobs
        """Trains the vectorised path's jobs: alone, or with other runs' jobs on a shared
        worker (:class:`~raysim.training.merged_training.Rendezvous`)."""
        if per_client_loop is not None:
            self.path, self.path_reason = LOOP, per_client_loop
        elif len({a.model_dump_json() for a in self.architectures}) > 1 or any(
                f > 1 for f in self.downsample):
            self.path, self.path_reason = LOOP, "clients differ in architecture or resolution"
        else:
            self.path, self.path_reason = choose_path(self.model, self.training.optimizer,
                                                      device, vectorize)
        self.compile_step = compile_step == "always" and self.path == VECTORIZED
        """The vectorised path's steps are compiled (``engine.compile_step``)."""
        if compile_step == "always":
            self.path_reason += ("; its step compiled (engine.compile_step)" if self.compile_step
                                 else "; engine.compile_step applies to the vectorised path only")
        if self.path == VECTORIZED:  # torch.func's batched weights keep the default layout
            self.memory_format = "contiguous"
            for model in self._models.values():
                model.to(memory_format=torch.contiguous_format)  # type: ignore[call-overload]

    def train_many(self, clients: Sequence[int], round_: int, weights: Sequence[Weights],
                   optimizer_states: Sequence[Any], *, prox: Proximal | None = None,
                   gradient_shifts: Sequence[Weights] | None = None,
                   steps_scale: int = 1) -> list[tuple[Weights, TrainOutcome]]:
        """Train each client's model (``weights[i]``, optimizer state ``optimizer_states[i]``)
        for the round's local work; returns (new weights, outcome) per client, in order.
        ``prox``: a proximal term with one anchor for all clients. ``gradient_shifts``: per client, a constant
        added to every step's gradient of each named trainable parameter
        (:func:`linear_term`; these clients train on the per-client path).

        Uses the path chosen for this run (``self.path``): one ``torch.func`` call for all
        clients of equal size, or a loop over clients with the resident model of each client's
        architecture. Both draw the same batches from each client's own stream.
        """
        if self.path == VECTORIZED and gradient_shifts is None:
            return self._train_vectorized(clients, round_, weights, optimizer_states, prox,
                                          steps_scale)
        starts = self.on_device(weights)
        anchor = self.on_device([prox[0]])[0] if prox and prox[1] > 0 else None
        plans = self.round_plans(clients, round_, steps_scale)
        indices = plans_on_device(plans, self.device)  # one transfer for the round
        seeds = self.round_seeds(clients, round_)
        models: list[Weights] = []
        trained: list[_Trained] = []
        for k, (client, start, optimizer_state, plan, index, seed) in enumerate(zip(
                clients, starts, optimizer_states, plans, indices, seeds, strict=True)):
            model = self.client_model(client)
            from_start = FirstStepFromStart.bind(model, start, self.training.optimizer,
                                                 optimizer_state)
            if from_start is None:  # the start copied into the model, the optimizer steps
                set_weights(model, start)
            try:
                regularizer = _sum_of([
                    proximal_term(model, anchor, prox[1])
                    if anchor is not None and prox is not None else None,
                    None if gradient_shifts is None else linear_term(model, gradient_shifts[k])])
                trained.append(self._train_on_device(
                    model, client, round_, regularizer=regularizer,
                    optimizer_state=optimizer_state, steps_scale=steps_scale, plan=plan,
                    plan_index=index, torch_seed=seed, from_start=from_start))
            finally:
                if from_start is not None:
                    from_start.finish()
            models.append(release_state(model))  # no copy
        # the losses to the host together: on a GPU, reading one per client would make the
        # host wait for each client's kernels before it queues the next client's
        totals = losses_to_host([t.losses for t in trained])
        return [(model, t.outcome(total)) for model, t, total in zip(
            models, trained, totals, strict=True)]

    def round_plans(self, clients: Sequence[int], round_: int, steps_scale: int = 1
                    ) -> list[list[np.ndarray]]:
        """Each client's minibatch positions for the round's local work on its own data (what
        :meth:`fit` would draw for it), computed for all clients of equal size at once."""
        plans: list[list[np.ndarray]] = [[] for _ in clients]
        for size, members in self._size_groups(clients):
            steps_of = batch_plans(size, self.training.batch_size, self.training.epochs,
                                   self._local_steps(steps_scale), self.seed, round_,
                                   np.asarray(clients)[members])
            for row, position in enumerate(members.tolist()):
                plans[position] = [step[row] for step in steps_of]
        return plans

    def round_seeds(self, clients: Sequence[int], round_: int) -> list[int]:
        """Each client's seed of torch's global generator for its training this round (what
        :meth:`fit` would derive), computed together: between two clients' training one
        derivation costs about five times what it costs in a row (35 against 7 us on the
        development machine)."""
        return [rng_seed(self.seed, "torch", round_, client) for client in clients]

    def _local_steps(self, steps_scale: int) -> int | None:
        """The round's local steps (``training.local_steps`` x ``steps_scale``), or None when
        the round is counted in epochs."""
        steps = self.training.local_steps
        return None if steps is None else steps * steps_scale

    def _size_groups(self, clients: Sequence[int]) -> list[tuple[int, np.ndarray]]:
        """(size, positions in ``clients``) for every distinct training-set size, ascending."""
        sizes = np.array([len(self.client_indices[c]) for c in clients])
        return [(int(size), np.flatnonzero(sizes == size)) for size in np.unique(sizes)]

    def on_device(self, weights: Sequence[Weights]) -> list[FlatWeights]:
        """Each start on the worker's device as FlatWeights, a start shared by several clients
        (the broadcast) converted once."""
        return convert_once(weights, lambda w: on_device(w, self.device))

    def warm_compiled_step(self, clients: Sequence[int]) -> None:
        """Compile the step for the shapes the rounds of ``clients`` (the worker's) are likely
        to meet under uniform sampling (:func:`likely_counts` of each local-data size), by
        training them once from the initial model, so that the first rounds do not pay for it;
        nothing is kept but the compiled code. No-op unless the steps are compiled."""
        if not self.compile_step or not len(clients):
            return
        starts = self.on_device([self.client_initial_weights(c) for c in clients])
        _, jobs = self._vectorized_jobs(clients, 0, starts, [None] * len(clients), None, 1)
        for job in jobs:
            held = len(job.weights)
            for count in likely_counts(held, self.context.num_clients,
                                       self.context.clients_per_round):
                dataclasses.replace(
                    job, weights=job.weights[:count], momentum=job.momentum[:count],
                    inputs=job.inputs[:count], targets=job.targets[:count],
                    plan=[step[:count] for step in warm_shapes(job.plan)]).train()

    def _train_vectorized(self, clients: Sequence[int], round_: int, weights: Sequence[Weights],
                          optimizer_states: Sequence[Any], prox: Proximal | None,
                          steps_scale: int) -> list[tuple[Weights, TrainOutcome]]:
        groups, jobs = self._vectorized_jobs(clients, round_, self.on_device(weights),
                                             optimizer_states, prox, steps_scale)
        results: dict[int, tuple[Weights, TrainOutcome]] = {}
        for (positions, size, taken), (new_weights, new_momentum, losses) in zip(
                groups, self.job_trainer(jobs), strict=True):
            for k, (i, loss) in enumerate(zip(positions, losses.tolist(), strict=True)):
                outcome = TrainOutcome(loss, size, taken, {"momentum": new_momentum[k]})
                results[i] = (cast(Weights, new_weights[k]), outcome)  # a Weights mapping
        return [results[i] for i in range(len(clients))]

    def _vectorized_jobs(self, clients: Sequence[int], round_: int,
                         weights: Sequence[FlatWeights], optimizer_states: Sequence[Any],
                         prox: Proximal | None, steps_scale: int
                         ) -> tuple[list[tuple[list[int], int, int]], list[VectorizedJob]]:
        """One job per client size: (positions in ``clients``, size, steps) and the job."""
        steps = self._local_steps(steps_scale)
        groups: list[tuple[list[int], int, int]] = []
        jobs: list[VectorizedJob] = []
        for size, members in self._size_groups(clients):  # one job per client size
            ids = np.asarray(clients)[members]
            index = np.stack([self.client_indices[c] for c in ids])
            inputs, targets = self.gather(index.reshape(-1))
            inputs = inputs.reshape(len(ids), size, *inputs.shape[1:])
            targets = targets.reshape(len(ids), size, *targets.shape[1:])
            plan = batch_plans(size, self.training.batch_size, self.training.epochs, steps,
                               self.seed, round_, ids)
            momentum = [None if optimizer_states[i] is None else optimizer_states[i]["momentum"]
                        for i in members.tolist()]
            groups.append((members.tolist(), size, len(plan)))
            jobs.append(VectorizedJob(self.model, [weights[i] for i in members.tolist()],
                                      momentum, inputs, targets, plan, self.training.optimizer,
                                      prox,
                                      training_loss(self.training.loss, self.info),
                                      self.compile_step))
        return groups, jobs

    def train(self, model: nn.Module, client: int, round_: int, *,
              regularizer: Callable[[], torch.Tensor] | None = None,
              optimizer_state: dict[str, Any] | None = None,
              steps_scale: int = 1, plan: list[np.ndarray] | None = None,
              torch_seed: int | None = None,
              from_start: FirstStepFromStart | None = None) -> TrainOutcome:
        """Train ``model`` in place with cross-entropy on the client's data for the round's
        local work (the configured optimizer, epochs or steps, batch size; ``plan`` and
        ``torch_seed``: its minibatch positions and generator seed from :meth:`round_plans`
        and :meth:`round_seeds`, else derived here; ``from_start``: the model reads its start
        for the first step, which writes into its own weights)."""
        trained = self._train_on_device(
            model, client, round_, regularizer=regularizer, optimizer_state=optimizer_state,
            steps_scale=steps_scale, plan=plan, torch_seed=torch_seed, from_start=from_start)
        return trained.outcome(losses_to_host([trained.losses])[0])

    def _train_on_device(self, model: nn.Module, client: int, round_: int, *,
                         regularizer: Callable[[], torch.Tensor] | None,
                         optimizer_state: dict[str, Any] | None, steps_scale: int,
                         plan: list[np.ndarray] | None, torch_seed: int | None,
                         from_start: FirstStepFromStart | None,
                         plan_index: torch.Tensor | None = None) -> _Trained:
        """:meth:`train` with the summed loss left on the device (no wait for the kernels)."""
        steps = self._local_steps(steps_scale)
        optimizer = make_optimizer(model.parameters(), self.training.optimizer)
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
        loss_fn = loss_function(training_loss(self.training.loss, self.info))
        model.train()
        losses, samples, taken = self._fit_on_device(
            client, round_, optimizer, lambda inputs, targets: loss_fn(model(inputs), targets),
            epochs=self.training.epochs, steps=steps, regularizer=regularizer, plan=plan,
            plan_index=plan_index, torch_seed=torch_seed,
            first_step=None if from_start is None else lambda: from_start.step(optimizer))
        return _Trained(losses, samples, taken,
                        optimizer.state_dict() if optimizer.state else None)

    def fit(self, client: int, round_: int, optimizer: torch.optim.Optimizer,
            batch_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
            epochs: int | None, steps: int | None = None, batch_size: int | None = None,
            stream: str = "batches",
            regularizer: Callable[[], torch.Tensor] | None = None,
            data: tuple[torch.Tensor, torch.Tensor] | None = None,
            plan: list[np.ndarray] | None = None, torch_seed: int | None = None,
            first_step: Callable[[], None] | None = None) -> tuple[float, int, int]:
        """The local training loop every algorithm shares: minibatches of the client's data,
        ``batch_loss(inputs, targets)`` (+ ``regularizer()``, not reported), one optimizer step
        each. Returns (mean reported loss, samples, steps); modules' train/eval modes are the
        caller's. ``data``: (inputs, targets) to train on instead of the client's own data
        (e.g. a public set). ``plan``: the batch positions when the caller drew them already
        (:meth:`round_plans`; the same as drawn here); ``torch_seed``: the generator's seed
        when the caller derived it already (:meth:`round_seeds`). ``first_step``: takes the
        place of the optimizer's first ``step()`` (:class:`FirstStepFromStart`).

        Batch order comes from the stream (seed, ``stream``, round, client) and global-RNG
        ops (dropout) from (seed, "torch"/"torch-<stream>", round, client), so the result is
        the same on any worker.
        """
        losses, samples, taken = self._fit_on_device(
            client, round_, optimizer, batch_loss, epochs=epochs, steps=steps,
            batch_size=batch_size, stream=stream, regularizer=regularizer, data=data, plan=plan,
            torch_seed=torch_seed, first_step=first_step)
        return losses_to_host([losses])[0] / max(losses.seen, 1), samples, taken

    def _fit_on_device(self, client: int, round_: int, optimizer: torch.optim.Optimizer,
                       batch_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
                       epochs: int | None, steps: int | None = None,
                       batch_size: int | None = None, stream: str = "batches",
                       regularizer: Callable[[], torch.Tensor] | None = None,
                       data: tuple[torch.Tensor, torch.Tensor] | None = None,
                       plan: list[np.ndarray] | None = None,
                       plan_index: torch.Tensor | None = None,
                       torch_seed: int | None = None,
                       first_step: Callable[[], None] | None = None
                       ) -> tuple[StepLosses, int, int]:
        """:meth:`fit`'s loop; returns (the step losses on the device, the client's
        training-set size, steps). ``plan_index``: ``plan``'s steps concatenated, already on
        the device (:func:`~raysim.training.vectorized.plans_on_device`)."""
        x, y = self.client_data(client) if data is None else data
        # only the CPU generator (torch.manual_seed also seeds every accelerator backend,
        # which costs about a millisecond per call)
        if torch_seed is None:
            purpose = "torch" if stream == "batches" else f"torch-{stream}"
            torch_seed = rng_seed(self.seed, purpose, round_, client)
        torch.default_generator.manual_seed(torch_seed)
        if self.device.type == "cuda":
            torch.cuda.manual_seed(torch_seed)
        if plan is None:
            plan = [step[0] for step in batch_plans(
                len(y), batch_size or self.training.batch_size, epochs, steps, self.seed,
                round_, np.array([client]), stream)]
        if plan_index is None:
            plan_index = plans_on_device([plan], self.device)[0]
        losses = StepLosses([], [])
        for positions, (inputs, targets) in zip(plan, step_batches(x, y, plan, plan_index),
                                                strict=True):
            optimizer.zero_grad(set_to_none=True)
            loss = batch_loss(inputs, targets)
            losses.losses.append(loss.detach())
            losses.sizes.append(len(positions))
            if regularizer is not None:
                loss = loss + regularizer()
            loss.backward()
            if first_step is None:
                optimizer.step()
            else:
                first_step()
                first_step = None
        return losses, len(y), len(plan)
