"""Ray-free preparation of an experiment, shared by ``raysim run``, ``validate`` and ``costs``:
load the data, build every seed's partition, check per-client settings, and describe a run to
its algorithm. Every input error is raised here, before Ray starts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from raysim.algorithms import ALGORITHMS
from raysim.algorithms.base import RunContext
from raysim.configuration.experiment import ExperimentConfig
from raysim.data import ArrayDataset, Partition, load_dataset, make_partition
from raysim.data.builtin import BUILTIN_DATASETS, TABULAR_DATASETS
from raysim.data.medmnist_io import is_volumetric, task_of
from raysim.data.partition import share_like_training
from raysim.data.site_shift import apply_site_shift
from raysim.errors import ConfigError
from raysim.layers.assembly import check_features, feature_settings
from raysim.layers.feature import algorithms_with
from raysim.models import build_model, segmentation_models
from raysim.results.live import check_available
from raysim.seeding import torch_generator
from raysim.vectors.weights import get_weights


def initial_weights(config: ExperimentConfig, dataset: ArrayDataset, seed: int) -> dict:
    """The initial global model, drawn from the stream (seed, "init")."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch_generator(seed, "init").initial_seed()))
        return get_weights(build_model(config.model, dataset.info))


def pooled(partition: Partition, num_test: int, num_train: int | None = None) -> Partition:
    """The union of all clients' training data (or, with ``num_train``, the whole training
    split less the clients' validation shares) as a single client (centralized training)."""
    held, _ = partition.validation_sources()
    train = (np.setdiff1d(np.arange(num_train), held) if num_train is not None
             else np.sort(np.concatenate(partition.train)))
    validation = None if partition.validation is None else [np.sort(held)]
    return Partition([train], [np.arange(num_test)], partition.unseen, validation)


def prepare(config: ExperimentConfig, data_root: str | None,
            read: Callable[[], ArrayDataset] | None = None
            ) -> dict[int, tuple[ArrayDataset, Partition]]:
    """Load the data and build every seed's partition (with its site shift and held-out
    client, if configured) and the model once: all input errors are raised here, before Ray
    starts. Returns (dataset, partition) per seed; seeds share one dataset object unless a
    site shift makes the images seed-specific. ``read``: returns the config's dataset, or
    raises the error of reading it (e.g. ``Future.result`` of ``load_dataset(config.dataset,
    data_root)`` run in another thread), called after the config's own checks; by default
    the dataset is read here."""
    check_method_data(config)
    check_features(config)
    check_available(config.logging)
    dataset = load_dataset(config.dataset, data_root) if read is None else read()
    check_data_kind(config, dataset)
    build_model(config.model, dataset.info)
    check_client_settings(config, dataset)
    settings = config.partition
    validation = config.evaluation.validation
    official = validation == "official"
    runs_on = with_official_validation(dataset) if official else dataset
    runs_on = with_public_set(runs_on)
    prepared = {}
    for seed in config.seeds:
        partition = make_partition(dataset.train_y, dataset.test_y, settings,
                                   dataset.info.num_classes, seed, dataset.train_groups,
                                   dataset.test_groups, dataset.train_blocks,
                                   dataset.test_blocks)
        if official:
            assert dataset.val_y is not None
            partition = replace(partition, validation=share_like_training(
                partition, dataset.train_y, dataset.val_y, dataset.info.num_classes,
                len(dataset.train_y), seed))
        shifted = runs_on
        if settings.site_shift is not None:
            shifted = apply_site_shift(runs_on, partition, settings.site_shift, seed)
        if not isinstance(validation, str) and validation > 0:
            partition = _split_validation(partition, validation, seed,
                                          dataset.train_groups if settings.scheme == "subjects"
                                          else dataset.train_blocks)
        if settings.holdout_client is not None:
            partition = partition.hold_out(settings.holdout_client)
        prepared[seed] = (shifted, partition)
    algorithm_class = ALGORITHMS[config.algorithm.name]
    first_dataset, first_partition = prepared[config.seeds[0]]
    num_clients = 1 if algorithm_class.pooled else first_partition.num_clients
    algorithm = algorithm_class(config.algorithm, run_context(config, first_dataset,
                                                              config.seeds[0], num_clients))
    if config.evaluation.fine_tune_epochs:
        _check_fine_tuning(config, algorithm, initial_weights(config, first_dataset,
                                                              config.seeds[0]))
    return prepared


def _check_fine_tuning(config: ExperimentConfig, algorithm: Any, start: dict) -> None:
    """"+FT" fine-tunes one global model on every client: refused (one paragraph) for a
    method without one, or one trained on the pooled data."""
    name = config.algorithm.name
    if ALGORITHMS[name].pooled:
        why = "it trains one model on the pooled data, so there is no client to fine-tune on"
    elif algorithm.global_weights(algorithm.init_server_state(start)) is None:
        why = ("it has no one global model to fine-tune (its clients keep their own models "
               "or layers, which are evaluated as they are)")
    else:
        return
    raise ConfigError(
        f"Invalid config field `evaluation.fine_tune_epochs` = "
        f"{config.evaluation.fine_tune_epochs}: algorithm {name!r} cannot be fine-tuned "
        f"after training: {why}. Set evaluation.fine_tune_epochs: 0 for {name}, or use a "
        "method with a global model (fedavg, fedprox, scaffold, ditto, apfl, fedsm, ...).")


def with_official_validation(dataset: ArrayDataset) -> ArrayDataset:
    """The dataset with its official validation split appended to the training arrays (rows
    ``len(train_y)`` on), where clients' validation shares index it; never trained on, as
    only the partition's training shares are."""
    if dataset.val_x is None or dataset.val_y is None or not len(dataset.val_y):
        raise ConfigError(
            f"Invalid config field `evaluation.validation` = 'official': dataset "
            f"{dataset.info.name!r} has no official validation split (MedMNIST subsets have "
            "one; the built-in datasets do not). Use a fraction instead, e.g. "
            "evaluation.validation: 0.1, which holds out that share of each client's data.")
    return replace(dataset, train_x=np.concatenate([dataset.train_x, dataset.val_x]),
                   train_y=np.concatenate([dataset.train_y, dataset.val_y]),
                   val_x=None, val_y=None)


def with_public_set(dataset: ArrayDataset) -> ArrayDataset:
    """The dataset with its public set (samples no client holds, where it has one) appended to
    the training arrays from row ``public_from`` on, which no client's share indexes; the
    methods that distil on a public set draw theirs from those rows
    (:attr:`RunContext.public_rows`)."""
    if dataset.public_x is None or dataset.public_y is None:
        return dataset
    groups = dataset.train_groups
    return replace(dataset, train_x=np.concatenate([dataset.train_x, dataset.public_x]),
                   train_y=np.concatenate([dataset.train_y, dataset.public_y]),
                   public_x=None, public_y=None, public_from=len(dataset.train_y),
                   train_groups=None if groups is None else np.concatenate(
                       [groups, np.full(len(dataset.public_y), -1, dtype=np.int64)]))


def _split_validation(partition: Partition, fraction: float, seed: int,
                      groups: np.ndarray | None) -> Partition:
    split = partition.split_validation(fraction, seed, groups)
    if not sum(len(share) for share in split.validation or []):
        largest = int(partition.sizes().max())
        raise ConfigError(
            f"Invalid config field `evaluation.validation` = {fraction}: no client can spare a "
            f"validation sample (the largest holds {largest} training sample"
            f"{'s' if largest != 1 else ''}, and each keeps at least one to train on). Use "
            "clients with at least two samples, or set evaluation.validation: 0.")
    return split


def check_method_data(config: ExperimentConfig) -> None:
    """One paragraph when the method cannot work on the dataset's kind of data (before any
    data is loaded or downloaded)."""
    algorithm_class = ALGORITHMS[config.algorithm.name]
    reason = algorithm_class.supports.needs_images
    tabular = sorted(name for name, cls in ALGORITHMS.items() if cls.supports.needs_images is None)
    if reason is not None and config.dataset.name in TABULAR_DATASETS:
        kinds = "images and signals" if algorithm_class.supports.takes_signals else "images"
        raise ConfigError(
            f"Invalid combination: algorithm `{config.algorithm.name}` works on {kinds} only "
            f"({reason}), and dataset `{config.dataset.name}` holds tabular feature vectors. "
            f"It accepts digits and the MedMNIST subsets (pneumoniamnist, bloodmnist, ...). "
            f"Pick one with `--set dataset.name=digits` (and an image model such as convnet), "
            f"or a method that takes tabular data ({', '.join(tabular)}).")
    name = config.dataset.name.lower()
    task = task_of(name) if name not in BUILTIN_DATASETS else None
    if task == "multi-label":
        if algorithm_class.supports.multi_label_refusal is not None:
            raise ConfigError(
                f"Invalid combination: algorithm `{config.algorithm.name}` does not support "
                f"multi-label data, and dataset `{name}` gives each image a 0/1 vector of "
                f"labels: {algorithm_class.supports.multi_label_refusal}. Use a single-label dataset, "
                f"or a method that supports multi-label data: "
                f"{algorithms_with('multi_label_refusal', truthy=False)}.")
        if config.training.loss == "hinge":
            raise ConfigError(
                f"Invalid config field `training.loss` = 'hinge': dataset `{name}` is "
                "multi-label, and its loss is the binary cross-entropy of each label. Set "
                "training.loss: cross_entropy (multi-label runs use its per-label form).")
    if task is not None and is_volumetric(name) and algorithm_class.supports.volume_refusal is not None:
        raise ConfigError(
            f"Invalid combination: algorithm `{config.algorithm.name}` does not support 3D "
            f"volumes, and dataset `{name}` is a MedMNIST 3D subset: "
            f"{algorithm_class.supports.volume_refusal}. Use a 2D dataset, or a method that supports "
            f"3D data: {algorithms_with('volume_refusal', truthy=False)}.")


def check_data_kind(config: ExperimentConfig, dataset: ArrayDataset) -> None:
    """One paragraph when a method that works on images only meets signals, or one that takes
    no masks meets a segmentation task, or a model or loss does not fit the task (known once
    the data is read)."""
    supports = ALGORITHMS[config.algorithm.name].supports
    info = dataset.info
    if info.segmentation:
        _check_segmentation(config, supports.segmentation_refusal, info.name)
    elif config.model.name in segmentation_models() or config.training.loss in ("dice",
                                                                                "dice_ce"):
        what = (f"`model.name` = {config.model.name!r}" if config.model.name in
                segmentation_models() else f"`training.loss` = {config.training.loss!r}")
        raise ConfigError(
            f"Invalid config field {what}: it is for segmentation (a class per pixel), and "
            f"dataset {info.name!r} gives one label per sample. Use a classification model "
            "and training.loss cross_entropy or hinge, or a segmentation dataset "
            "(dataset.sites).")
    reason = supports.needs_images
    if reason is not None and dataset.info.kind == "signal" and not supports.takes_signals:
        raise ConfigError(
            f"Invalid combination: algorithm `{config.algorithm.name}` works on images only "
            f"({reason}), and dataset `{dataset.info.name}` holds signals "
            f"({dataset.info.input_shape[0]} channel(s) x {dataset.info.input_shape[1]} "
            f"samples). Use a method that takes signals: {_signal_methods()}.")


def _signal_methods() -> str:
    """The registered methods that take signals, listed."""
    return ", ".join(sorted(name for name, cls in ALGORITHMS.items()
                            if cls.supports.needs_images is None or cls.supports.takes_signals))


def _check_segmentation(config: ExperimentConfig, refusal: str | None, name: str) -> None:
    """A segmentation task needs a method that takes masks, a segmentation network and a
    loss defined on masks."""
    if refusal is not None:
        raise ConfigError(
            f"Invalid combination: algorithm `{config.algorithm.name}` does not take "
            f"segmentation masks ({refusal}), and dataset `{name}` is a segmentation task. "
            f"Use a method that does: {algorithms_with('segmentation_refusal', truthy=False)}.")
    architectures = config.clients.architectures or []
    for field, model in [("model.name", config.model),
                         *(("clients.architectures", a) for a in architectures)]:
        model_name = model.name  # type: ignore[attr-defined]
        if model_name not in segmentation_models():
            raise ConfigError(
                f"Invalid config field `{field}` = {model_name!r}: dataset `{name}` is a "
                "segmentation task (a class per pixel) and this model gives one prediction "
                f"per image. Use a segmentation network: {', '.join(segmentation_models())}.")
    if config.training.loss == "hinge":
        raise ConfigError(
            f"Invalid config field `training.loss` = 'hinge': dataset `{name}` is a "
            "segmentation task. Use cross_entropy (per pixel), dice or dice_ce.")


def check_client_settings(config: ExperimentConfig, dataset: ArrayDataset) -> None:
    """Per-client architectures and resolutions need an algorithm that supports them, and
    every listed architecture must build for the dataset."""
    per_client = config.clients
    algorithm_class = ALGORITHMS[config.algorithm.name]
    for key in ("architectures", "downsample"):
        if getattr(per_client, key) is not None and not algorithm_class.supports.heterogeneous:
            raise ConfigError(
                f"Invalid config field `clients.{key}`: algorithm {config.algorithm.name!r} "
                f"trains one shared model, so every client must use the same architecture and "
                f"input. Set `model` (and remove clients.{key}), or use an algorithm for "
                f"heterogeneous clients: {algorithms_with('heterogeneous')}.")
    for architecture in per_client.architectures or ():
        build_model(architecture, dataset.info)
    if per_client.downsample and dataset.info.kind != "image":
        raise ConfigError("Invalid config field `clients.downsample`: dataset "
                          f"{dataset.info.name!r} is tabular; downsampling applies to images. "
                          "Remove clients.downsample.")


def run_context(config: ExperimentConfig, dataset: ArrayDataset, seed: int,
                num_clients: int) -> RunContext:
    """What the algorithm of one run knows about it (``num_clients``: 1 for pooled runs)."""
    holdout = config.partition.holdout_client is not None
    training_clients = config.partition.num_clients - int(holdout)  # a held-out client sits out
    per_client = config.clients
    architectures = (per_client.resolve(config.model, config.partition.num_clients, seed)
                     if per_client.architectures is not None else ())
    downsample = tuple(per_client.downsample or ())
    if holdout:  # the partition renumbers the training clients without the held-out one
        kept = config.partition.holdout_client
        architectures = tuple(a for c, a in enumerate(architectures) if c != kept)
        downsample = tuple(d for c, d in enumerate(downsample) if c != kept)
    per_round = min(config.clients_per_round, training_clients)
    public = (None if dataset.public_from is None
              else (dataset.public_from, len(dataset.train_y)))
    return RunContext(seed, dataset.info, config.model, config.training, num_clients,
                      per_round, architectures, downsample, config.engine.memory_format,
                      features=feature_settings(config, num_clients, per_round),
                      public_rows=public)
