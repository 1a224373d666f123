"""Membership-inference audit of what clients upload (reusable by every method).

For each audited client: up to ``n`` of its training samples (members) and as many test samples
(non-members, never trained on by anyone) with the members' class mix, so that an attack cannot
score by label alone (a one-class client's members would otherwise all carry the label that the
skewed model favours), drawn from the stream (seed, "membership", client),
are scored by an attack on the client's upload; the ROC AUC of members against non-members is
reported per client (``mia_auc`` in the ``clients`` table). The attack depends on the upload:

- a model (``model``): the loss attack (Yeom et al. 2018): score = -CE(model(x), y), members
  are expected to have lower loss;
- a synthetic image set (``synthetic`` + ``labels``, FedDM/FedVCK): the nearest-neighbour
  attack: score = -min L2 distance (normalised pixels) to the uploaded images of the sample's
  class (all of them if the class is absent), members are expected to lie closer.

AUC 0.5 is chance; a client at AUC <= 0.5 counts as a total defence (the FedVCK paper's Table 6).
Simpler than LiRA (which trains shadow models): an honest, cheap lower bound on leakage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score

from raysim.data.dataset import to_tensor
from raysim.seeding import numpy_rng
from raysim.training.weights import set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


def audit_sets(train_indices: np.ndarray, train_labels: np.ndarray, test_labels: np.ndarray,
               size: int, seed: int, client: int) -> tuple[np.ndarray, np.ndarray]:
    """Balanced (members, non-members) with the same number of samples of every class: up to
    ``size`` training indices of the client, then per class as many test indices of that class
    (members of a class with fewer test samples are dropped to that count)."""
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


@torch.no_grad()
def attack_scores(runtime: ClientRuntime, upload: dict[str, Any], x: np.ndarray,
                  y: np.ndarray) -> np.ndarray | None:
    """Membership scores (higher = more likely a member) of samples under an upload, or None
    when the upload holds nothing attackable."""
    inputs = to_tensor(x, runtime.info).to(runtime.device)
    labels = torch.from_numpy(np.asarray(y, dtype=np.int64)).to(runtime.device)
    if "model" in upload:
        model = runtime.model
        set_weights(model, upload["model"])
        model.eval()
        return -F.cross_entropy(model(inputs), labels, reduction="none").cpu().numpy()
    if "synthetic" in upload and len(upload["synthetic"]):
        synthetic = to_tensor(upload["synthetic"], runtime.info).to(runtime.device).flatten(1)
        synthetic_labels = torch.from_numpy(upload["labels"].astype(np.int64)).to(runtime.device)
        distances = torch.cdist(inputs.flatten(1), synthetic)
        same_class = labels[:, None] == synthetic_labels[None, :]
        has_class = same_class.any(dim=1, keepdim=True)
        distances = distances.masked_fill(has_class & ~same_class, float("inf"))
        return -distances.min(dim=1).values.cpu().numpy()
    return None


def membership_auc(runtime: ClientRuntime, upload: dict[str, Any], members: np.ndarray,
                   nonmembers: np.ndarray, test_x: np.ndarray, test_y: np.ndarray
                   ) -> float:
    """ROC AUC of the attack separating members (training indices) from non-members (test
    indices); NaN when the upload is not attackable."""
    member_scores = attack_scores(runtime, upload, runtime.train_x[members],
                                  runtime.train_y[members])
    if member_scores is None or len(members) == 0:
        return float("nan")
    nonmember_scores = attack_scores(runtime, upload, test_x[nonmembers], test_y[nonmembers])
    truth = np.concatenate([np.ones(len(members)), np.zeros(len(nonmembers))])
    return float(roc_auc_score(truth, np.concatenate([member_scores, nonmember_scores])))
