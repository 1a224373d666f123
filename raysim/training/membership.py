"""Membership-inference audit of what clients upload (reusable by every method).

For each audited client: up to ``n`` of its training samples (members) and as many test samples
(non-members, never trained on by anyone) with the members' class mix, so that an attack cannot
score by label alone (a one-class client's members would otherwise all carry the label that the
skewed model favours), drawn from the stream (seed, "membership", client),
are scored by an attack on the client's upload; the ROC AUC of members against non-members is
reported per client (``mia_auc`` in the ``clients`` table). The attack is the algorithm's
(``Algorithm.membership_scores``), by what it uploads:

- a model (``model``, the default): the loss attack (Yeom et al. 2018): score = -CE(model(x), y), members
  are expected to have lower loss;
- a synthetic image set (``synthetic`` + ``labels``, FedDM/FedVCK): the nearest-neighbour
  attack: score = -min L2 distance (normalised pixels) to the uploaded images of the sample's
  class (all of them if the class is absent), members are expected to lie closer.

AUC 0.5 is chance; a client at AUC <= 0.5 counts as a total defence (the FedVCK paper's Table 6).
Simpler than LiRA (which trains shadow models): an honest, cheap lower bound on leakage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from raysim.data.dataset import to_tensor
from raysim.seeding import numpy_rng
from raysim.training.losses import sample_losses
from raysim.vectors.weights import Weights, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


def audit_sets(train_indices: np.ndarray, train_labels: np.ndarray, test_labels: np.ndarray,
               size: int, seed: int, client: int) -> tuple[np.ndarray, np.ndarray]:
    """Balanced (members, non-members) with the same number of samples of every class: up to
    ``size`` training indices of the client, then per class as many test indices of that class
    (members of a class with fewer test samples are dropped to that count). Multi-label
    samples are matched by their dominant finding (:func:`raysim.data.partition.label_keys`)."""
    from raysim.data.partition import label_keys

    train_labels, test_labels = (label_keys(train_labels, train_labels),
                                 label_keys(train_labels, test_labels))
    rng = numpy_rng(seed, "membership", client=client)
    members = rng.choice(train_indices, min(size, len(train_indices)), replace=False)
    kept, nonmembers = [], []
    for cls in np.unique(train_labels[members]):
        of_class = members[train_labels[members] == cls]
        pool = np.flatnonzero(test_labels == cls)
        count = min(len(of_class), len(pool))
        kept.append(of_class[:count])
        nonmembers.append(rng.choice(pool, count, replace=False))
    if not kept:
        return members[:0], members[:0]
    return np.concatenate(kept), np.concatenate(nonmembers)


Scores = Callable[[np.ndarray, np.ndarray], "np.ndarray | None"]
"""Membership scores (higher = more likely a member) of stored samples (x, y), or None when
the upload holds nothing attackable."""


@torch.no_grad()
def loss_attack_scores(runtime: ClientRuntime, client: int, weights: Weights, x: np.ndarray,
                       y: np.ndarray) -> np.ndarray:
    """-CE (summed binary CE for multi-label data) of the client's architecture with
    ``weights`` on (x, y) seen at its resolution."""
    model = runtime.client_model(client)
    set_weights(model, weights)
    model.eval()
    inputs = runtime.client_inputs(client, to_tensor(x, runtime.info).to(runtime.device))
    labels = torch.from_numpy(np.asarray(y, dtype=np.int64)).to(runtime.device)
    return -sample_losses(model(inputs), labels, runtime.info.multi_label).cpu().numpy()


@torch.no_grad()
def nearest_synthetic_scores(runtime: ClientRuntime, synthetic: np.ndarray,
                             synthetic_labels: np.ndarray, x: np.ndarray, y: np.ndarray
                             ) -> np.ndarray | None:
    """-min L2 distance to the synthetic images of the sample's class (all of them if the class
    is absent); None for an empty synthetic set."""
    if not len(synthetic):
        return None
    inputs = to_tensor(x, runtime.info).to(runtime.device)
    labels = torch.from_numpy(np.asarray(y, dtype=np.int64)).to(runtime.device)
    images = to_tensor(synthetic, runtime.info).to(runtime.device).flatten(1)
    image_labels = torch.from_numpy(synthetic_labels.astype(np.int64)).to(runtime.device)
    distances = torch.cdist(inputs.flatten(1), images)
    same_class = labels[:, None] == image_labels[None, :]
    has_class = same_class.any(dim=1, keepdim=True)
    distances = distances.masked_fill(has_class & ~same_class, float("inf"))
    return -distances.min(dim=1).values.cpu().numpy()


def membership_auc(scores: Scores, runtime: ClientRuntime, members: np.ndarray,
                   nonmembers: np.ndarray, test_x: np.ndarray, test_y: np.ndarray
                   ) -> float:
    """ROC AUC of ``scores`` separating members (training indices) from non-members (test
    indices); NaN when the upload is not attackable."""
    member_scores = scores(runtime.train_x[members], runtime.train_y[members])
    if member_scores is None or len(members) == 0:
        return float("nan")
    nonmember_scores = scores(test_x[nonmembers], test_y[nonmembers])
    truth = np.concatenate([np.ones(len(members)), np.zeros(len(nonmembers))])
    from sklearn.metrics import roc_auc_score  # imported when an audit runs

    return float(roc_auc_score(truth, np.concatenate([member_scores, nonmember_scores])))
