"""What a method supports, declared in one place per method (:class:`Supports`): the features
and data it takes, and, for what it refuses, why (one clause each, which the refusal's
paragraph quotes). A new feature or data kind adds one field here, not a class variable in
every method file; ``tests/test_contract.py`` checks every registered method's declaration."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Supports:
    """One method's declaration. A ``..._refusal`` (or ``needs_images``,
    ``cross_entropy_only``) is None where the method takes the feature or the data, else the
    clause saying why it cannot; a method built on another starts from that one's
    (``dataclasses.replace(FedAvg.supports, ...)``)."""

    server_optimizers: bool = False
    """True when the next global model is the mean of the clients' models, so a server
    optimizer (``server_optimizer:``) can step on it."""
    heterogeneous: bool = False
    """True when clients may run different architectures (``clients.architectures``)."""
    needs_images: str | None = None
    """Why the method works on images only (None: it takes tabular data too); checked against
    the dataset before anything is loaded."""
    takes_signals: bool = False
    """With ``needs_images`` set: the method takes signals too (recordings), only tabular data
    is refused."""
    multi_label_refusal: str | None = None
    """Why the method cannot train on multi-label data (ChestMNIST); None: it can (its losses
    and predictions follow the task: per-label BCE, sigmoid scores)."""
    cross_entropy_only: str | None = None
    """Why the method is defined with cross-entropy on class labels only (a run with another
    ``training.loss`` is refused with it); None: it trains with any loss."""
    segmentation_refusal: str | None = (
        "its updates, outputs or losses are defined for one class label per sample, and a "
        "form of it on masks is not implemented")
    """Why the method cannot train on a segmentation task (masks, ``dataset.sites``); None: it
    can, with a segmentation network (its loss ``training.loss`` on masks, Dice metrics)."""
    volume_refusal: str | None = None
    """Why the method cannot train on 3D volumes (the MedMNIST 3D subsets); None: it can,
    with a 3D model."""
    asynchronous_refusal: str | None = (
        "its server step combines the uploads of one synchronous round, all from one "
        "broadcast")
    """Why the method cannot run ``system.policy: fedbuff``, when it declares no
    ``mean_uploads``."""
    private_releases: str | None = None
    """Set (what it releases) when the method clips and noises its own releases with
    ``context.privacy`` in local mode (FedDC's hand-overs, FedSM's and FedDF's models) instead
    of declaring ``mean_uploads``; its ``dp_releases`` counts them for the accountant."""
    central_privacy_refusal: str | None = None
    """Why ``privacy.mode: central`` is refused for a method with its own
    :attr:`private_releases`; None: a generic reason."""
    privacy_refusal: str = (
        "it has no weight upload that client-level DP (clipping and Gaussian noise of a weight "
        "update) could protect")
    """Why ``privacy:`` is refused when the method declares neither ``mean_uploads`` nor
    :attr:`private_releases`."""


PERSONAL_MODELS_PRIVACY_REFUSAL = (
    "its personal models are trained on the client's data without clipping or noise and are "
    "evaluated and recorded per client, so client-level DP on the global-model upload would "
    "not cover what the run releases")
"""The privacy refusal of a method that keeps personal models beside a global one (Ditto,
APFL)."""
