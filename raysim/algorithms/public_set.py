"""The public set of the public-data baselines (FedMD, FedDF), carved from the clients'
training data as MH-pFLID's comparison does (its appendix D.3: 50 samples per client), or drawn
from the dataset's own public set where it has one (samples no client holds, e.g. the
recordings of subjects kept out of every client: ``dataset.public_subjects``).

Carved: each client contributes ``per_client`` of its training samples, drawn from the stream
(seed, "fedmd-public", client); the samples stay in its private data too. Drawn: ``per_client``
times the number of clients rows of the public set (all of it when it is smaller), from the
stream (seed, "public-set"). FedMD uses them with their labels (pre-training) and without
(digest); FedDF's server uses them unlabelled.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from raysim.seeding import numpy_rng


def public_indices(client_indices: Sequence[np.ndarray], per_client: int, seed: int,
                   public_rows: tuple[int, int] | None = None) -> np.ndarray:
    """Training-set indices of the public set: ``per_client`` seeded samples of each client,
    or, with ``public_rows`` (the dataset's public set), as many drawn from those rows."""
    if public_rows is not None:
        start, stop = public_rows
        count = min(per_client * len(client_indices), stop - start)
        return np.sort(start + numpy_rng(seed, "public-set").permutation(stop - start)[:count])
    picks = [numpy_rng(seed, "fedmd-public", client=c).permutation(indices)[:per_client]
             for c, indices in enumerate(client_indices)]
    return np.concatenate(picks)
