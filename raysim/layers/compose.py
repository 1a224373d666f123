"""An algorithm object for a run: the registered algorithm, wrapped in the layers the run's
settings ask for (client-level DP, FedBuff). The same composition on the driver and on every
worker; only the driver's FedBuff layer holds the clock's plan."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raysim.layers.fedbuff import FedBuff
from raysim.layers.private_mean import PrivateMean
from raysim.layers.server_optimizer import ServerOptimizer

if TYPE_CHECKING:
    from raysim.algorithms.base import Algorithm
    from raysim.schema import StrictModel
    from raysim.system.plan import SystemPlan
    from raysim.training.context import RunContext


def compose(algorithm_class: type[Algorithm[Any, Any]], params: StrictModel,
            context: RunContext, plan: Callable[[], SystemPlan] | None = None) -> Any:
    """``algorithm_class(params, context)``, wrapped, innermost first: in :class:`PrivateMean`
    under ``privacy:`` when it declares ``mean_uploads`` (an algorithm with its own DP handles
    ``context.privacy`` itself); in :class:`ServerOptimizer` under ``server_optimizer:``
    (``context.server_optimizer``, which also holds FedBuff's ``system.server_lr`` as an SGD
    step), so the optimizer sees only the private mean; in :class:`FedBuff` under
    ``system.policy: fedbuff`` (``context.fedbuff_server_lr`` set), whose buffered mean the
    optimizer steps on. ``plan``: the clock's plan, for the server's FedBuff layer."""
    algorithm: Any = algorithm_class(params, context)
    if context.privacy is not None and algorithm_class.mean_uploads:
        algorithm = PrivateMean(algorithm)
    if context.server_optimizer is not None:
        algorithm = ServerOptimizer(algorithm, context.server_optimizer)
    if context.fedbuff_server_lr is not None:
        algorithm = FedBuff(algorithm, plan)
    return algorithm
