"""The public set of the public-data baselines (FedMD, FedDF), carved from the clients'
training data as MH-pFLID's comparison does (its appendix D.3: 50 samples per client).

Each client contributes ``per_client`` of its training samples, drawn from the stream (seed,
"fedmd-public", client); the samples stay in its private data too. FedMD uses them with their
labels (pre-training) and without (digest); FedDF's server uses them unlabelled.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from raysim.seeding import numpy_rng


def public_indices(client_indices: Sequence[np.ndarray], per_client: int, seed: int) -> np.ndarray:
    """Training-set indices of the public set: ``per_client`` seeded samples of each client."""
    picks = [numpy_rng(seed, "fedmd-public", client=c).permutation(indices)[:per_client]
             for c, indices in enumerate(client_indices)]
    return np.concatenate(picks)
