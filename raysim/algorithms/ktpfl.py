"""KT-pFL (Zhang et al., NeurIPS 2021, "Parameterized Knowledge Transfer for Personalized
Federated Learning"): every client gets its own, personalized soft targets on the public set,
a linear combination of all clients' soft predictions whose coefficients the server learns.

Clients upload their soft predictions softmax(z / T) on the public set
(:mod:`raysim.algorithms.public_exchange`; T = ``temperature``). The server keeps the knowledge
coefficient matrix C (N x N, rows start at 1/N) and each round, as the authors' code does:

1. takes one gradient step of size ``coefficient_lr`` on
   sum_n MSE(s_n, sum_m C_nm s_m) + ``penalty`` x MSE(C_n, 1/N),
   so that a client's target leans on the clients whose predictions explain its own;
2. renormalises each row as softmax(``coefficient_sharpness`` x C_n);
3. broadcasts the targets t_n = sum_m C_nm s_m.

Client n then distils towards t_n with KL(t_n || softmax(z / T)) before it revisits its
private data. A client that has not uploaded yet is left out of the combinations until it has.
Where raysim differs from the authors' code (the KL's reduction, one public set for every round,
a fixed step size on C): docs/methods.md's deviation table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithms.base import ClientResult, register_algorithm
from raysim.algorithms.params import KTpFLParams
from raysim.algorithms.public_exchange import PublicSetExchange
from raysim.state_codec import persistable
from raysim.vectors.weights import Weights


@persistable
@dataclass
class KnowledgeState:
    """The coefficient matrix C, each client's latest soft predictions on the public set
    (NaN rows: not uploaded yet) and the targets of the next round (None before the first)."""

    coefficients: np.ndarray
    predictions: np.ndarray
    targets: np.ndarray | None = None


def coefficient_step(coefficients: np.ndarray, predictions: np.ndarray, known: np.ndarray,
                     lr: float, penalty: float, sharpness: float) -> np.ndarray:
    """C after one gradient step on sum_n MSE(s_n, sum_m C_nm s_m) + penalty MSE(C_n, 1/N)
    over the clients in ``known`` (the others' rows and columns stay), each row then
    renormalised as softmax(sharpness x row) over the known clients."""
    n = len(coefficients)
    index = np.flatnonzero(known)
    matrix = torch.tensor(coefficients[np.ix_(index, index)], dtype=torch.float64,
                          requires_grad=True)
    soft = torch.tensor(predictions[index], dtype=torch.float64)  # (k, samples, classes)
    mixed = torch.einsum("nm,msc->nsc", matrix, soft)
    fit = ((soft - mixed) ** 2).mean(dim=(1, 2)).sum()
    pull = ((matrix - 1.0 / n) ** 2).mean(dim=1).sum()
    (fit + penalty * pull).backward()
    assert matrix.grad is not None
    with torch.no_grad():
        stepped = torch.softmax(sharpness * (matrix - lr * matrix.grad), dim=1)
    updated = coefficients.copy()
    updated[np.ix_(index, index)] = stepped.numpy()
    return updated


@register_algorithm
class KTpFL(PublicSetExchange[KTpFLParams, KnowledgeState]):
    """Personalized soft targets from a learned knowledge-coefficient matrix."""

    params_class = KTpFLParams

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> KnowledgeState:
        n = self.context.num_clients
        return KnowledgeState(np.full((n, n), 1.0 / n), np.zeros((n, 0, 0)))

    def broadcast(self, state: KnowledgeState, round_: int) -> dict[str, Any]:
        return {} if state.targets is None else {"targets": state.targets}

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> dict[int, np.ndarray]:
        return {client: r.upload["logits"] for client, r in results}

    def aggregate(self, state: KnowledgeState, partials: Sequence[dict[int, np.ndarray]],
                  round_: int) -> KnowledgeState:
        uploads = {c: p for partial in partials for c, p in partial.items()}
        if not uploads:
            return state
        predictions = state.predictions
        if predictions.size == 0:  # the first uploads fix the public set's shape
            shape = next(iter(uploads.values())).shape
            predictions = np.full((len(state.coefficients), *shape), np.nan)
        predictions = predictions.copy()
        for client, soft in uploads.items():
            predictions[client] = soft
        known = ~np.isnan(predictions).any(axis=(1, 2))
        p = self.params
        coefficients = coefficient_step(state.coefficients, predictions, known,
                                        p.coefficient_lr, p.penalty, p.coefficient_sharpness)
        index = np.flatnonzero(known)
        targets = np.einsum("nm,msc->nsc", coefficients[np.ix_(index, index)],
                            predictions[index])
        full = np.zeros_like(predictions)
        full[index] = targets
        return KnowledgeState(coefficients, predictions, full.astype(np.float32))

    # ----- client -----
    def target_of(self, message: dict[str, Any], client: int) -> np.ndarray | None:
        targets = message.get("targets")
        if targets is None or not np.any(targets[client]):
            return None
        return targets[client]

    def public_outputs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits / self.params.temperature, dim=1)

    def digest_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """KL(target || softmax(logits / T)) per sample (``batchmean``: the KL divergence; the
        authors' ``reduction='mean'`` also divides by the number of classes)."""
        return F.kl_div(F.log_softmax(logits / self.params.temperature, dim=1), target,
                        reduction="batchmean")
