"""Centralized training on the pooled data of all clients: the upper bound."""

from __future__ import annotations

from typing import Literal

from raysim.algorithms.base import register_algorithm
from raysim.algorithms.local_only import LocalOnly
from raysim.schema import StrictModel


class CentralizedParams(StrictModel):
    name: Literal["centralized"] = "centralized"


@register_algorithm
class Centralized(LocalOnly):
    """One model trained on the union of the clients' training data with the same budget:
    ``local_epochs`` epochs per round, or, when rounds are counted in steps, as many steps as
    all sampled clients of a federated round take together."""

    params_class = CentralizedParams
    pooled = True

    def local_work_scale(self) -> int:
        return self.context.clients_per_round
