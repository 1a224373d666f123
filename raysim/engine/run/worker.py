"""The ClientWorker actor: trains many virtual clients per round on its share of the
resources and keeps their persistent state resident between rounds."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch
from torch import nn

from raysim.algorithms.base import Algorithm, RunContext
from raysim.configuration.schema import StrictModel
from raysim.data.partition import Partition
from raysim.engine.run.cluster_links import PartialSize, partial_size, serialized_bytes
from raysim.engine.run.gpu_share import cap_gpu_memory, gpu_memory_errors
from raysim.layers.assembly import compose
from raysim.rounds.client_work import ClientWork
from raysim.rounds.process_memory import freeze_imported_objects, keep_freed_memory
from raysim.rounds.round_loop import RoundReply
from raysim.training.context import ClientData
from raysim.training.evaluation import predict_proba, prediction_metrics
from raysim.training.membership import audit_sets, membership_auc
from raysim.training.resident_data import data_cap_bytes
from raysim.training.resident_states import state_cap_bytes
from raysim.training.runtime import ClientRuntime, warm_up
from raysim.vectors.reduction_tree import Subtree, merge_subtrees
from raysim.vectors.weighted_sum import settle
from raysim.vectors.weights import Weights, host_tree, set_weights


@dataclass(frozen=True)
class WorkerSetup:
    """Everything a worker needs, with the large arrays as object-store references."""

    algorithm_class: type[Algorithm]
    algorithm_params: StrictModel
    context: RunContext
    arrays: dict[str, Any]
    """train_x, train_y, test_x, test_y: zero-copy numpy arrays from the object store."""
    partition: Partition
    initial_weights: Weights
    eval_batch_size: int
    threads: int
    vectorize: str = "auto"
    compile_step: str = "never"
    """``engine.compile_step``."""
    per_client_loop: str | None = None
    """Why the method always trains on the per-client path (``Algorithm.per_client_loop``)."""
    test_sources: np.ndarray | None = None
    """The client whose test share holds each test sample (-1: unseen client, -2: none)."""
    membership_audit: int = 0
    """Members (and non-members) per client of the last round's membership audit (0: off)."""
    gpu_fraction: float = 0.0
    """The worker's share of a GPU (``engine.gpus_per_worker``); its memory is capped to it."""
    validation_index: np.ndarray | None = None
    """Training-set indices of the pooled validation set (``evaluation.validation``), or None."""
    validation_sources: np.ndarray | None = None
    """The client whose validation share holds each pooled validation sample."""


def pick_device() -> torch.device:
    """The GPU Ray assigned to this actor if torch can use it, else the CPU."""
    if ray.get_gpu_ids() and torch.cuda.is_available():
        return torch.device("cuda")  # Ray sets CUDA_VISIBLE_DEVICES to the assigned GPU
    return torch.device("cpu")


class ClientWorker:
    """A pool member: one process that hosts many clients of one run at a time. Kept for every
    run of an invocation (:mod:`raysim.engine.pool.shared_actors`): ``configure`` binds it to a run,
    ``reset`` frees it; never one actor per client."""

    def __init__(self) -> None:
        # PyTorch's optimizers and torch.func import torch._dynamo at first use (about 1.1 s
        # of CPU): import it now, while the invocation still prepares its data, rather than in
        # the first run's warm-up. Only client workers pay for it (not in Ray's preload list,
        # so driver hosts of runs whose server does not train never import it).
        import torch._dynamo  # noqa: F401

        keep_freed_memory()

        self.setup: WorkerSetup | None = None  # set by configure (also after a Ray restart)
        self.work: ClientWork | None = None
        """The run's clients held here (:class:`~raysim.rounds.client_work.ClientWork`)."""

    def configure(self, setup: WorkerSetup, index: int) -> dict[str, Any]:
        """Bind this worker to one run: its algorithm, data and models, warmed up; client
        states of an earlier run are dropped. Returns :meth:`describe`."""
        self.reset()
        torch.set_num_threads(setup.threads)
        self.index = index
        self.device = pick_device()
        self.gpu_share = cap_gpu_memory(self.device, setup.gpu_fraction)
        context = setup.context
        self.algorithm = compose(setup.algorithm_class, setup.algorithm_params, context)
        self.arrays = {name: ray.get(ref) if isinstance(ref, ray.ObjectRef) else ref
                       for name, ref in setup.arrays.items()}
        self.runtime = ClientRuntime(
            context, ClientData(self.arrays["train_x"], self.arrays["train_y"],
                                setup.partition.train, setup.initial_weights),
            self.device, vectorize=setup.vectorize, per_client_loop=setup.per_client_loop,
            compile_step=setup.compile_step)
        with gpu_memory_errors(self.gpu_share, index, "while warming up"):
            warm_up(self.runtime.model, context.info, context.training.optimizer, self.device)
        freeze_imported_objects()  # torch's first training imported the rest of what it needs
        self.setup = setup
        self.work = ClientWork(self.algorithm, self.runtime, index,
                               lambda where: gpu_memory_errors(self.gpu_share, index, where),
                               self._audit if setup.membership_audit else None)
        return self.describe()

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` in this process: work a feature makes before the first round
        (:class:`~raysim.layers.feature.RunStart`), e.g. counting the models' FLOPs for the
        simulated clock's plan, whose FLOP counter imports ``torch._dynamo`` (0.8 s of CPU),
        which this process imports anyway for its optimizer."""
        return function(*args)

    def reset(self) -> None:
        """Forget the current run (its data references, models and client states)."""
        self.setup = None
        self.work = None
        for name in ("algorithm", "arrays", "runtime"):
            self.__dict__.pop(name, None)

    @property
    def client_states(self) -> dict[int, Any]:
        """The client states held here for the current run."""
        return {} if self.work is None else self.work.client_states

    @property
    def run_work(self) -> ClientWork:
        """The clients of the run this worker is configured for."""
        if self.work is None:
            raise RuntimeError(f"worker {os.getpid()} was used before configure()")
        return self.work

    @property
    def run_setup(self) -> WorkerSetup:
        """The setup of the run this worker is configured for."""
        if self.setup is None:
            raise RuntimeError(f"worker {os.getpid()} was used before configure()")
        return self.setup

    def describe(self) -> dict[str, Any]:
        """Where this worker runs: node, process, device, GPU ids, threads (and, once
        configured, its training path)."""
        where = {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                 "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                 "threads": torch.get_num_threads()}
        if self.setup is None:
            return {**where, "configured": False}
        return {**where, "device": str(self.device), "training_path": self.runtime.path,
                "training_path_reason": self.runtime.path_reason,
                "compiled_step": self.runtime.compile_step,
                **(self.gpu_share.describe() if self.gpu_share else {})}

    def set_groups(self, clients: np.ndarray, groups: np.ndarray) -> dict[str, object]:
        """The fixed client group of each client this worker holds (a contiguous range of
        groups: the worker merges them into subtrees of the fixed reduction tree); their
        training rows go onto the worker's device for the run, and a compiled step is compiled
        for their shapes. Returns where the data lives."""
        gpu_cap = self.gpu_share.cap_bytes if self.gpu_share else None
        self.run_work.set_groups(clients, groups, state_cap_bytes(self.device, gpu_cap))
        where = self.runtime.keep_rows_on_device(clients.tolist(),
                                                 data_cap_bytes(self.device, gpu_cap))
        if self.runtime.compile_step:
            started = time.perf_counter()
            with gpu_memory_errors(self.gpu_share, self.index, "while compiling the step"):
                self.runtime.warm_compiled_step(clients.tolist())
            where["step_compile_s"] = round(time.perf_counter() - started, 2)
        return where

    def run_round(self, round_: int, message: dict[str, Any], clients: np.ndarray,
                  incoming: list[ray.ObjectRef] | None = None,
                  moves: np.ndarray | None = None, audit: bool = False,
                  sizes: bool = False) -> RoundReply:
        """The round's local work of this worker's sampled ``clients``
        (:meth:`ClientWork.run_round`), with the client states relayed here (``incoming``)
        and those leaving for other workers (the reply's ``outgoing``) in the object store,
        never sent through the driver. ``audit``: the driver's
        :class:`~raysim.rounds.round_callbacks.MembershipAudit` decides the round. ``sizes``:
        measure the relayed states' bytes (for the ``transfers`` table; off, nothing is
        pickled twice)."""
        bundles = ray.get(list(incoming)) if incoming else []
        reply = self.run_work.run_round(round_, message, clients, bundles, moves, audit)
        outgoing = {worker: host_tree(states) for worker, states in reply.outgoing.items()}
        return dataclasses.replace(
            reply, outgoing={worker: ray.put(states) for worker, states in outgoing.items()},
            outgoing_sizes={worker: (len(states), serialized_bytes(states))
                            for worker, states in outgoing.items()} if sizes else {})

    @ray.method(num_returns=2)
    def run_round_apart(self, round_: int, message: dict[str, Any], clients: np.ndarray,
                        incoming: list[ray.ObjectRef] | None = None,
                        moves: np.ndarray | None = None, audit: bool = False,
                        sizes: bool = False) -> tuple[RoundReply, list[Subtree]]:
        """:meth:`run_round` with the partial (the reply's subtree roots) as a second object,
        which stays on this node for :meth:`merge_partials`."""
        reply = self.run_round(round_, message, clients, incoming, moves, audit, sizes)
        return dataclasses.replace(reply, groups=[]), reply.groups

    def merge_partials(self, span: tuple[int, int], *partials: list[Subtree]
                       ) -> tuple[list[Subtree], list[PartialSize]]:
        """The partials of the workers on this node (:meth:`run_round_apart`), merged into the
        roots of the aligned blocks of the node's groups ``span``: what crosses to the driver's
        node is one partial per node, not one per worker (the same merges as on the driver).
        Returns the roots and the size of each partial merged."""
        roots = merge_subtrees([s for subtrees in partials for s in subtrees], *span,
                               self.algorithm.merge)
        settle(roots)
        return roots, [partial_size(0, subtrees) for subtrees in partials]

    def _audit(self, client: int, upload: dict[str, Any]) -> float:
        """Membership-inference AUC of one client's upload (see raysim.training.membership)."""
        test_x, test_y = self.arrays["test_x"], self.arrays["test_y"]
        members, nonmembers = audit_sets(self.runtime.client_indices[client],
                                         self.arrays["train_y"], test_y,
                                         self.run_setup.membership_audit,
                                         self.run_setup.context.seed, client)
        return membership_auc(
            lambda x, y: self.algorithm.membership_scores(self.runtime, client, upload, x, y),
            self.runtime, members, nonmembers, test_x, test_y)

    def snapshot_states(self) -> dict[int, Any]:
        """Every client state held here (for a checkpoint), with device tensors on the host."""
        return host_tree(dict(self.client_states))

    def restore_states(self, states: dict[int, Any]) -> int:
        """Replace the client states held here (after a restart or a rollback)."""
        self.run_work.client_states = dict(states)
        return len(states)

    def receive_states(self, refs: list[ray.ObjectRef]) -> int:
        """Adopt client states relayed from other workers; returns how many arrived."""
        return self.run_work.receive(ray.get(list(refs)) if refs else [])

    def predict_test(self, models: dict[str, Any], chunks: list[tuple[int, int]],
                     split: str = "test"
                     ) -> dict[str, list[tuple[np.ndarray, np.ndarray | None]]]:
        """Each evaluation model's (probabilities, routes) on chunks [start, stop) of the test
        set, or (``split="validation"``) of the pooled validation set."""
        setup = self.run_setup
        outputs: dict[str, list[tuple[np.ndarray, np.ndarray | None]]] = {name: [] for name in models}
        for start, stop in chunks:
            if split == "validation":
                assert setup.validation_index is not None and setup.validation_sources is not None
                x = self.arrays["train_x"][setup.validation_index[start:stop]]
                sources = setup.validation_sources[start:stop]
            else:
                assert setup.test_sources is not None
                x, sources = self.arrays["test_x"][start:stop], setup.test_sources[start:stop]
            with gpu_memory_errors(self.gpu_share, self.index, "while evaluating"):
                predicted = self.algorithm.predict_many(self.runtime, models, x, sources,
                                                        setup.eval_batch_size)
            for name, output in predicted.items():
                outputs[name].append(output)
        return outputs

    def evaluate_clients(self, round_: int, clients: list[int],
                         base: Weights | None = None) -> list[dict[str, Any]]:
        """Evaluate each client's personal model (its own architecture, at its own input
        resolution; built on ``base``, the algorithm's ``personal_base`` of the round) on its
        own test share and the global test set, and with a validation split on its own
        validation share (``val_``) and the pooled validation set (``pooled_val_``)."""
        rows: list[dict[str, Any]] = []
        for client in clients:
            weights = self.algorithm.compose_personal(self.client_states.get(client), base)
            if weights is None:
                continue
            model = self.runtime.client_model(client)
            set_weights(model, weights)
            described = ({"architecture": self.runtime.architecture(client).name}  # type: ignore[attr-defined]
                         if self.run_setup.context.architectures else {})
            rows.append({"round": round_, "client": client, **described,
                         **self._client_rows(model, client, "")})
        return rows

    def fine_tune_clients(self, round_: int, clients: list[int], start: Weights,
                          epochs: int) -> list[dict[str, Any]]:
        """"+FT": each client fine-tunes ``start`` (the final global model) for ``epochs``
        local epochs on its own training share and is scored as :meth:`evaluate_clients`
        scores a personal model, its columns prefixed ``ft_``."""
        from raysim.training.fine_tune import fine_tuned

        rows = []
        for client in clients:
            with gpu_memory_errors(self.gpu_share, self.index, "while fine-tuning"):
                model = fine_tuned(self.runtime, client, round_, start, epochs)
            rows.append({"client": client, **self._client_rows(model, client, "ft_")})
        return rows

    def _client_rows(self, model: nn.Module, client: int, prefix: str) -> dict[str, float]:
        """A client's model's metrics on its own test share (``own_``), the global test set
        (``global_``) and, with a validation split, its validation share (``val_``) and the
        pooled validation set (``pooled_val_``), each key after ``prefix``."""
        test_x, test_y = self.arrays["test_x"], self.arrays["test_y"]
        train_x, train_y = self.arrays["train_x"], self.arrays["train_y"]
        share = self.run_setup.partition.test[client]
        scores: dict[str, float] = {}
        validation = self.run_setup.partition.validation
        if validation is not None and len(validation[client]):
            held = validation[client]
            scores.update(self._client_model_scores(model, client, f"{prefix}val_",
                                                    train_x[held], train_y[held]))
        pooled_validation = self.run_setup.validation_index
        if pooled_validation is not None and len(pooled_validation):
            scores.update(self._client_model_scores(
                model, client, f"{prefix}pooled_val_", train_x[pooled_validation],
                train_y[pooled_validation]))
        scores.update(self._client_model_scores(model, client, f"{prefix}own_", test_x[share],
                                                test_y[share]))
        scores.update(self._client_model_scores(model, client, f"{prefix}global_", test_x,
                                                test_y))
        return scores

    def _client_model_scores(self, model: nn.Module, client: int, prefix: str, x: np.ndarray,
                             y: np.ndarray) -> dict[str, float]:
        """A client's own model's metrics on (x, y), at the client's input resolution, each key
        prefixed."""
        probabilities = predict_proba(
            model, x, self.run_setup.context.info, self.run_setup.eval_batch_size, self.device,
            lambda inputs: self.runtime.client_inputs(client, inputs))
        return {f"{prefix}{k}": v for k, v in prediction_metrics(y, probabilities).items()}
