"""Typed configuration sections shared by every layer (frozen pydantic models).

Model- and algorithm-specific hyperparameters live next to their implementation and register
themselves; :mod:`raysim.configuration.experiment` assembles the whole experiment configuration.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MEDMNIST_SIZES = (28, 64, 128, 224)


class StrictModel(BaseModel):
    """A frozen config section that rejects unknown keys (typos must not be ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class SegmentationSiteConfig(StrictModel):
    """One site (hospital) of a segmentation dataset: a folder of images and masks."""

    name: str = Field(description="the site's name (its clients' label in the tables)")
    path: str = Field(description="its folder (relative paths under --data-root when given): "
                      "images/ + masks/, Original/ + 'Ground Truth'/ (CVC-ClinicDB), or "
                      "train/ and test/ each with image/ + mask/ (kept as the split)")
    mask: Literal["threshold", "indices"] = Field(
        "threshold", description="threshold: a binary mask, foreground where the grey value > "
        "threshold; indices: grey values are the class indices 0..num_classes-1")
    threshold: int = Field(127, ge=0, le=254)
    invert: bool = Field(False, description="threshold masks whose foreground is dark (the "
                         "prostate slices: 0 = prostate)")
    unpaired: Literal["error", "skip"] = Field(
        "error", description="an image without a mask (or a mask without an image): refuse "
        "the folder, or leave the file out")
    split_blocks: int = Field(
        1, ge=1, description="the test split, the validation split and a site split into "
        "several clients take whole blocks of this many consecutive images (by file name): "
        "frames of one video stay on one side (CVC-ClinicDB)")


class DatasetConfig(StrictModel):
    """Which dataset to load and from where."""

    name: str = Field(description="a MedMNIST flag: 2D (pneumoniamnist, chestmnist, ...) or 3D "
                      "(adrenalmnist3d, organmnist3d, ...); or breast-cancer, digits, synthetic; "
                      "or a name a plug-in registered, or any label with `path`")
    size: Literal[28, 64, 128, 224] = Field(
        28, description="MedMNIST image size (3D subsets: 28 or 64, volumes of size^3)")
    root: str | None = Field(None, description="directory of MedMNIST npz files")
    download: bool = Field(True, description="download a missing MedMNIST file")
    verify_checksum: bool = Field(True, description="check the MD5 of MedMNIST files")
    train_subset: int | None = Field(
        None, ge=2, description="keep only this many training samples (fixed class-stratified "
        "draw, the same for every seed); the test set is kept whole")
    path: str | None = Field(
        None, description="a .npz file in MedMNIST's layout (train_images, train_labels, "
        "test_images, test_labels, optionally val_*) or a folder with train/, test/ (and "
        "val/) holding one folder of images per class; the dataset `name` labels it; "
        "relative paths are read under --data-root when given; or a folder of recordings "
        "(.npz files with `x` (epochs, length, channels) and `y`, DeepSleepNet's format)")
    test_subjects: int | None = Field(
        None, ge=1, description="recordings only: how many subjects (all their recordings) form "
        "the test split; default one in five, at least one")
    public_subjects: int = Field(
        0, ge=0, description="recordings only: how many further subjects no client holds, kept "
        "as the public set of the methods that distil on one (FedMD, FedDF, ...)")
    num_classes: int | None = Field(
        None, ge=2, description="recordings and segmentation: the number of classes, the "
        "background included (a label outside 0..num_classes-1 is refused); default the "
        "largest label + 1")
    sites: list[SegmentationSiteConfig] | None = Field(
        None, description="segmentation: the sites (hospitals) whose images and masks form "
        "the dataset, each sample's site its group (partition.scheme: sites)")
    medsegbench: str | None = Field(
        None, description="segmentation: a MedSegBench dataset (polypgen, promise12, kvasir, "
        "...), read from its npz <name>_<128|256|512>.npz under --data-root (or `root`): the "
        "smallest release at least `resize` px, resized to it; downloaded when missing where "
        "the medsegbench package (its metadata) is installed; its official train/val/test "
        "splits kept; PolypGen's six centres are its sites")
    resize: int = Field(64, ge=8, description="segmentation: images (bilinear) and masks "
                        "(nearest) resized to resize x resize")
    test_fraction: float = Field(
        0.2, gt=0, lt=1, description="segmentation: each site's share of images in the test "
        "split (a fixed draw, the same for every seed), where its folder has no split")
    subject_pattern: str = Field(
        r"^(S[CT]\d\d\d)", description="recordings only: a regular expression whose first "
        "group, matched at the start of a file's name, names the subject (the default reads "
        "Sleep-EDF's SC4ssN/ST7ssN names; a name it does not match is its own subject)")


class SiteShiftConfig(StrictModel):
    """A fixed, seeded appearance transform per client (site), standing in for different
    scanners and hospitals. Each effect's parameter is drawn per site uniformly within the
    given range; ``strength`` scales them all (0 turns the shift off)."""

    strength: float = Field(1.0, ge=0, le=1)
    brightness: float = Field(0.2, ge=0, le=1, description="intensity offset in [-b, b]")
    contrast: float = Field(0.4, ge=0, lt=1, description="contrast factor in [1-c, 1+c]")
    gamma: float = Field(0.5, ge=0, le=2, description="gamma exponent in [1/(1+g), 1+g]")
    blur: float = Field(1.0, ge=0, le=5, description="Gaussian blur sigma in [0, s] pixels at 28px")
    noise: float = Field(0.05, ge=0, le=0.5, description="Gaussian noise std in [0, n]")
    color: float = Field(0.25, ge=0, lt=1, description="RGB only: channel gains in [1-c, 1+c]")


class PartitionConfig(StrictModel):
    """How the training set is split across virtual clients."""

    scheme: Literal["iid", "dirichlet", "shards", "quantity", "replicate", "subjects",
                    "sites"] = "iid"
    """replicate: every client holds the whole training set and the whole test set (e.g.
    the same images at different resolutions, ``clients.downsample``). subjects: each client
    holds whole subjects (groups) of the training and of the test split, never one subject's
    samples on two clients (datasets that know each sample's subject: recordings). sites:
    each client is one site (hospital) of the dataset, or one of ``clients_per_site`` equal
    random parts of it, with its test share from the same site (multi-site segmentation)."""
    num_clients: int = Field(10, ge=1)
    beta: float = Field(0.5, gt=0, description="Dirichlet concentration (label or quantity skew)")
    min_size: int = Field(1, ge=0, description="smallest number of samples per client")
    samples_per_client: int | None = Field(
        None, ge=1, description="iid only: draw exactly this many samples per client"
    )
    classes_per_client: int = Field(2, ge=1, description="shards only: classes per client")
    clients_per_site: Annotated[int, Field(ge=1)] | list[Annotated[int, Field(ge=1)]] = Field(
        1, description="sites only: clients per site, each an equal random part of its "
        "training and test images (of its runs of consecutive images where the site has "
        "`split_blocks`); one number for every site, or a list with one per site, e.g. "
        "[2, 1] with holdout_client 2 trains on the first site's halves and tests on the "
        "unseen second site")
    label_skew: float | None = Field(
        None, gt=0, description="subjects only: on top of whole subjects, each client keeps the "
        "largest subset of its samples (training and test share alike) whose class mix is "
        "drawn from Dirichlet(label_skew); default none (the subjects' own mix)")
    site_shift: SiteShiftConfig | None = Field(
        None, description="images only: a seeded appearance transform per client (feature skew), "
        "applied to its training data and its test share; combines with any scheme")
    holdout_client: int | None = Field(
        None, ge=0, description="unseen-client experiment: this client of the partition takes "
        "no part in training; its test share is the `unseen_*` evaluation set")

    @model_validator(mode="after")
    def _check_scheme_options(self) -> PartitionConfig:
        if self.holdout_client is not None and self.holdout_client >= self.num_clients:
            raise ValueError(
                f"holdout_client={self.holdout_client} is not a client of the partition "
                f"(0..{self.num_clients - 1}); pick one of them"
            )
        if self.holdout_client is not None and self.num_clients < 2:
            raise ValueError("holdout_client needs at least 2 clients (one trains)")
        if self.scheme == "replicate" and (self.site_shift is not None
                                            or self.holdout_client is not None):
            raise ValueError("scheme 'replicate' gives every client the same samples, so it "
                             "cannot take a site shift or a held-out client; use another "
                             "scheme or remove site_shift/holdout_client")
        if self.label_skew is not None and self.scheme != "subjects":
            raise ValueError(
                f"label_skew applies to scheme 'subjects' only, not {self.scheme!r}; remove it, "
                "or use scheme dirichlet (with beta) for label skew without subjects")
        if self.samples_per_client is not None and self.scheme != "iid":
            raise ValueError(
                f"samples_per_client applies to scheme 'iid' only, not {self.scheme!r}; "
                "remove it or set partition.scheme=iid"
            )
        return self


class OptimizerConfig(StrictModel):
    """The client optimizer."""

    name: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = Field(0.01, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)


class TrainingConfig(StrictModel):
    """Rounds, client sampling and the local work of a round."""

    rounds: int = Field(10, ge=1)
    clients_per_round: int | None = Field(None, ge=1, description="default: every client")
    local_epochs: int | None = Field(None, ge=1, description="default 1 unless local_steps is set")
    local_steps: int | None = Field(None, ge=1, description="minibatch steps per round")
    batch_size: int = Field(32, ge=1)
    optimizer: OptimizerConfig = OptimizerConfig()
    loss: Literal["cross_entropy", "hinge", "dice", "dice_ce"] = Field(
        "cross_entropy", description="hinge: the multi-class hinge (with a binary-margin "
        "linear model, the linear SVM's loss); segmentation: cross_entropy per pixel, dice "
        "(MONAI's Dice loss) or dice_ce (MONAI's Dice + cross-entropy)")

    @model_validator(mode="after")
    def _check_local_work(self) -> TrainingConfig:
        if self.local_epochs is not None and self.local_steps is not None:
            raise ValueError(
                f"local_epochs={self.local_epochs} and local_steps={self.local_steps} are both "
                "set; a round is either epochs or steps, so set only one of them"
            )
        return self

    @property
    def epochs(self) -> int | None:
        """Local epochs per round, or None when the round is counted in steps."""
        if self.local_steps is not None:
            return None
        return self.local_epochs or 1


class EvaluationConfig(StrictModel):
    """When and how the models are evaluated."""

    every: int = Field(1, ge=0, description="evaluate every k rounds (and the last); 0: never")
    final_rounds: int = Field(
        1, ge=1,
        description="also evaluate each of the last this many rounds (with every > 0): a "
        "method whose accuracy alternates from round to round (e.g. FedAvg with one step per "
        "round on tiny clients) is then reported over both parities with `raysim report "
        "--window 2`")
    batch_size: int = Field(512, ge=1)
    clients: bool = Field(
        True,
        description="also evaluate personal models when there is a global model (algorithms "
        "without one, e.g. local-only, always evaluate their clients' models)",
    )
    keep_models: bool = Field(
        False, description="write the final server state and every client's state (the "
        "trained global, personalized and local models) to final_models.npz in each run's "
        "directory, read back with raysim.rounds.final_models.read_final_models (e.g. to draw "
        "predicted masks)")
    fine_tune_epochs: int = Field(
        0, ge=0,
        description="\"+FT\": after the last round every client fine-tunes the final global "
        "model for this many local epochs on its own training share (a fresh optimizer of "
        "the run's config) and is scored with it, as `ft_` columns beside the global model's "
        "in the last round's rounds and client_eval rows (0: off; methods with one global "
        "model only)")
    membership_audit: int = Field(
        0, ge=0,
        description="membership-inference audit of every client's upload in the last round: "
        "this many of its training samples against as many test samples (0: off); per-client "
        "AUC in the clients table (mia_auc), summary with `raysim report --privacy`")
    validation: Annotated[float, Field(ge=0, lt=1)] | Literal["official"] = Field(
        0.0,
        description="share of each client's training samples held out as its validation set "
        "and never trained on (0: none), or `official`: the dataset's own validation split "
        "(MedMNIST's val), split among the clients like the test set (by their training "
        "mix); evaluated models also report val_* metrics on the pooled validation set "
        "(personal models: val_* on each client's own share, pooled_val_* on the pooled "
        "set), and "
        "`raysim report --checkpoint best` reports every run at its round of best validation "
        "accuracy")


class LoggingConfig(StrictModel):
    """Live metrics where researchers already look, beside the Parquet files (which stay the
    source of truth)."""

    tensorboard: str | None = Field(
        None, description="directory of TensorBoard event files: one run per run root, variant "
        "and seed, at <dir>/<name>-<timestamp>/[<variant>/]seed_<s> "
        "(`pip install -e '.[tensorboard]'`; view with `tensorboard --logdir DIR`)")
    mlflow: str | None = Field(
        None, description="MLflow tracking URI, or `local` for a SQLite store in the results "
        "root (MLflow 3 retired its file store): one MLflow run per seed and variant with the "
        "config as parameters, every evaluated round, the final summary and the learning "
        "curves (`pip install -e '.[mlflow]'`)")

    @field_validator("tensorboard")
    @classmethod
    def _tensorboard_from_here(cls, directory: str | None) -> str | None:
        """A relative directory is relative to where raysim was started (the drivers that
        write the event files run elsewhere)."""
        return None if directory is None else os.path.abspath(os.path.expanduser(directory))

    @field_validator("mlflow")
    @classmethod
    def _mlflow_store_from_here(cls, uri: str | None) -> str | None:
        """A relative SQLite file (``sqlite:///mlflow.db``) or plain directory is relative to
        where raysim was started."""
        if uri is None or uri == "local":
            return uri
        sqlite = "sqlite:///"
        if uri.startswith(sqlite) and not uri[len(sqlite):].startswith("/"):
            return sqlite + os.path.abspath(uri[len(sqlite):])
        return uri if "://" in uri or ":" in uri.split("/")[0] else os.path.abspath(uri)


class ServerOptimizerConfig(StrictModel):
    """The server's step on the round's mean (Reddi et al. 2021, "Adaptive Federated
    Optimization", Algorithm 2): with the pseudo-gradient D = mean - global model, sgd moves
    the model by lr x m where m = momentum x m + D (FedAvgM, Hsu et al. 2019; lr 1 without
    momentum is FedAvg), adagrad, adam and yogi by lr x m / (sqrt(v) + tau) where
    m = beta1 x m + (1 - beta1) D and v is D^2 summed (adagrad), averaged (adam,
    v = beta2 v + (1 - beta2) D^2) or moved by its sign (yogi,
    v = v - (1 - beta2) D^2 sign(v - D^2)), v starting at tau^2 (``convention: flower``: Flower's
    equations instead). Only trainable parameters are stepped; running statistics take the
    mean. Under `privacy:` the step sees only the private mean; under FedBuff it is the
    server's step on each buffered update."""

    name: Literal["sgd", "adagrad", "adam", "yogi"] = Field(
        "sgd", description="sgd (FedAvgM), adagrad (FedAdagrad), adam (FedAdam), yogi (FedYogi)")
    lr: float | None = Field(
        None, gt=0, description="server learning rate eta (default: 1 for sgd, 0.01 for the "
        "adaptive ones, the middle of Reddi et al.'s tuned range; tune it on a validation split)")
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd: server momentum (FedAvgM)")
    beta1: float = Field(0.9, ge=0, lt=1, description="adagrad/adam/yogi: first-moment decay")
    beta2: float = Field(0.99, ge=0, lt=1, description="adam/yogi: second-moment decay")
    tau: float = Field(1e-3, gt=0, description="adagrad/adam/yogi: adaptivity (the step's "
                       "epsilon; v starts at tau^2)")
    convention: Literal["paper", "flower"] = Field(
        "paper", description="paper: Reddi et al.'s Algorithm 2 as written; flower: Flower's "
        "strategies' equations (v starts at 0, FedAdagrad without momentum, FedAdam's "
        "learning rate bias-corrected at Flower's round + 1); sgd is the same in both")

    @property
    def step_size(self) -> float:
        """The server learning rate, its default resolved."""
        return self.lr if self.lr is not None else (1.0 if self.name == "sgd" else 0.01)

    @model_validator(mode="after")
    def _flower_adagrad_has_no_momentum(self) -> ServerOptimizerConfig:
        if self.convention == "flower" and self.name == "adagrad" and \
                "beta1" in self.model_fields_set:
            raise ValueError(
                "Flower's FedAdagrad has no first-moment decay (its beta_1 is fixed at 0), so "
                "`beta1` cannot be set with `convention: flower` and `name: adagrad`. Remove "
                "`beta1`, or use `convention: paper`.")
        return self


class CompressionConfig(StrictModel):
    """``compression:``: how clients compress their model updates (:mod:`raysim.layers.
    compression`)."""

    method: Literal["topk", "int8"] = Field(
        "topk", description="topk: the largest-magnitude coordinates (int32 index + float32 value "
        "each); int8: every coordinate in 8 bits with one float32 scale per entry")
    fraction: float = Field(0.01, gt=0, le=1,
                            description="topk: the share of the update's coordinates sent")
    error_feedback: bool = Field(
        True, description="keep what compression dropped on the client and add it to its "
        "next update (EF-SGD)")


class AdaptiveClipConfig(StrictModel):
    """Adaptive clipping (Andrew et al. 2021): the clip follows a quantile of the clients'
    update norms. Every round the server learns the (noised) share b of sampled clients whose
    update was within the clip (from the bits centred at 1/2, sensitivity 1/2) and sets
    clip <- clip x exp(-learning_rate x (b - quantile)); the
    noise on that count is part of the privacy budget, so the updates get the noise multiplier
    (z^-2 - (2 count_noise_std)^-2)^-1/2 for the configured (or calibrated) z."""

    target_quantile: float = Field(0.5, gt=0, lt=1,
                                   description="share of updates the clip should keep whole")
    learning_rate: float = Field(0.2, gt=0, description="step of the geometric clip update")
    count_noise_std: float | None = Field(
        None, ge=0, description="std of the Gaussian noise on the count of clients within the "
        "clip; unset: expected clients per round / 20 (the paper's choice)")


class PrivacyConfig(StrictModel):
    """Client-level differential privacy for methods that share weights (DP-FedAvg, McMahan
    et al. 2018): each sampled client's update (its model minus the broadcast) clipped to L2
    norm <= ``clip``, Gaussian noise of std ``noise_multiplier`` x ``clip`` added to the sum by
    the server (``central``) or by every client to its own update (``local``); clients sampled
    by Poisson sampling at rate clients_per_round / num_clients; the privacy budget tracked by
    Google's dp-accounting after every round."""

    clip: float = Field(1.0, gt=0, description="L2 norm bound of a client's update (.inf: none)")
    noise_multiplier: float | None = Field(
        None, ge=0, description="noise std over clip; unset: calibrated to target_epsilon "
        "before the run (dp-accounting's calibrate_dp_mechanism)")
    mode: Literal["central", "local"] = Field(
        "central", description="central: the server adds the noise to the sum of clipped "
        "updates; local: every client adds it to its own clipped update")
    delta: float | None = Field(None, gt=0, lt=1,
                                description="unset: 1 / N^1.1 for N clients")
    target_epsilon: float | None = Field(
        None, gt=0, description="with noise_multiplier unset: calibrate the noise to reach "
        "it after all rounds; with noise_multiplier set: stop the run before a round that "
        "would exceed it")
    accountant: Literal["rdp", "pld"] = Field("rdp", description="dp-accounting's RDP or PLD")
    adaptive_clip: AdaptiveClipConfig | None = Field(
        None, description="central mode: the clip follows a quantile of the update norms "
        "(Andrew et al. 2021), starting from `clip`; or {target_quantile: 0.5, "
        "learning_rate: 0.2, count_noise_std: null}")

    @model_validator(mode="after")
    def _check_noise(self) -> PrivacyConfig:
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError("privacy needs privacy.noise_multiplier or privacy.target_epsilon "
                             "(the noise is calibrated to it); set one of them")
        return self


class LogNormalConfig(StrictModel):
    """A seeded log-normal draw per client: median x exp(sigma x N(0, 1))."""

    median: float = Field(gt=0)
    sigma: float = Field(0.5, ge=0)


class SiteDistributionConfig(StrictModel):
    """System profiles drawn per client from log-normal distributions."""

    speed_gflops: LogNormalConfig = Field(description="sustained training GFLOP/s")
    down_mbps: LogNormalConfig = Field(description="downlink Mbit/s")
    up_mbps: LogNormalConfig = Field(description="uplink Mbit/s")


class AvailabilityConfig(StrictModel):
    """When a site can train: always, or a window of ``window_h`` hours in every ``period_h``
    hours, at a seeded offset per site (e.g. nightly: 8 of every 24)."""

    period_h: float | None = Field(None, gt=0, description="unset: always available")
    window_h: float = Field(8.0, gt=0)

    @model_validator(mode="after")
    def _check_window(self) -> AvailabilityConfig:
        if self.period_h is not None and self.window_h > self.period_h:
            raise ValueError(f"window_h={self.window_h} exceeds period_h={self.period_h}; a "
                             "window lasts at most one period")
        return self


class SystemConfig(StrictModel):
    """Sites that differ in speed, bandwidth and availability, on a simulated clock (never
    wall time): a client's round time is download (broadcast bytes / downlink) + compute (3 x
    its model's forward FLOPs x samples / speed) + upload (the model's bytes / uplink). Profiles
    from built-in tiers (``tiers``: tier -> share of the sites), log-normal distributions
    (``distribution``) or a CSV/Parquet trace (``trace``: columns client, speed_gflops,
    down_mbps, up_mbps, optional available_from_h, available_to_h: one row per window)."""

    tiers: dict[str, float] | None = Field(
        None, description="share of the sites per built-in tier (workstation_gpu, cpu_server, "
        "constrained_site), e.g. {cpu_server: 0.5, constrained_site: 0.5}")
    distribution: SiteDistributionConfig | None = None
    trace: str | None = Field(None, description="CSV or Parquet file of site profiles")
    availability: AvailabilityConfig | None = Field(
        None, description="with `distribution`: when its sites can train (tiers have their "
        "own; a trace lists windows)")
    policy: Literal["sync", "deadline", "overselect", "fedbuff"] = Field(
        "sync", description="sync: wait for every selected client; deadline: drop clients "
        "past deadline_s; overselect: select clients_per_round x (1 + over_selection), keep "
        "the first clients_per_round to finish; fedbuff: asynchronous buffered aggregation "
        "(FedAvg/FedProx)")
    deadline_s: float | None = Field(None, gt=0, description="deadline: seconds per round")
    over_selection: float = Field(0.3, ge=0, description="overselect: extra share selected")
    buffer_size: int | None = Field(
        None, ge=1, description="fedbuff: arrivals per server update (default clients_per_round)")
    concurrency: int | None = Field(
        None, ge=1, description="fedbuff: clients training at once (default 2 x buffer_size)")
    staleness_exponent: float = Field(
        0.5, ge=0, description="fedbuff: an update of staleness s weighs (1 + s)^-exponent")
    server_lr: float = Field(1.0, gt=0, description="fedbuff: the server's step on the update")

    @model_validator(mode="after")
    def _check_source(self) -> SystemConfig:
        sources = [k for k in ("tiers", "distribution", "trace") if getattr(self, k) is not None]
        if len(sources) != 1:
            raise ValueError("system needs exactly one source of site profiles: tiers, "
                             f"distribution or trace (got {', '.join(sources) or 'none'})")
        if self.policy == "deadline" and self.deadline_s is None:
            raise ValueError("system.policy deadline needs system.deadline_s")
        return self


class EngineConfig(StrictModel):
    """Ray resources of one run."""

    num_workers: int = Field(2, ge=1, description="ClientWorker actors per run")
    cpus_per_worker: float = Field(1.0, gt=0,
                                   description="also the torch thread count of a worker")
    gpus_per_worker: float = Field(
        0.0, ge=0, description="0.25 packs four workers per GPU, each capped to 1/4 of its "
        "memory; on a cluster without any GPU the run goes on CPUs with a notice, while more "
        "than any node's GPUs on a cluster with GPUs is an error (exit 2)")
    address: str | None = Field(
        None,
        description="Ray cluster to join: host:port, or 'auto' for the cluster `ray start` "
        "started on this machine; 'local' always starts a Ray of the invocation's own. Unset: "
        "RAY_ADDRESS, else a running `ray start` cluster on this machine, else a local Ray")
    count_transfers: bool = Field(
        False,
        description="write the transfers table (bytes each round hands off: broadcast, "
        "partials, relayed client states) also when the run's driver and workers share one "
        "node; on several nodes it is always written")
    client_groups: int = Field(
        64,
        ge=1,
        description="clients are placed on workers in this many fixed groups; results do not "
        "depend on the number of workers",
    )
    vectorize: Literal["auto", "always", "never"] = Field(
        "auto",
        description="train many same-size clients in one torch.func call: auto picks it for "
        "small dense models on CPU and for every model on GPU (BatchNorm clients with their "
        "own running statistics); always also for BatchNorm models and convolutions on CPU",
    )
    compile_step: Literal["never", "always"] = Field(
        "never",
        description="always: the vectorised path's training step is compiled with "
        "torch.compile (on a GPU in its CUDA-graph mode, reduce-overhead), each (clients, "
        "batch) shape once per worker, those most rounds meet before the first round; numbers "
        "agree with never's to float32 rounding, not to the bit, and still do not depend on the "
        "number of workers; no effect on the per-client path",
    )
    merge_seeds: Literal["auto", "never"] = Field(
        "auto",
        description="auto: the seeds of one config that would otherwise wait for each other "
        "share worker processes, and where they train on the vectorised path, their clients "
        "of equal local-data size train in one call (the same numbers as separate runs); "
        "never: every run has workers of its own",
    )
    memory_format: Literal["auto", "channels_last", "contiguous"] = Field(
        "auto",
        description="tensor layout of the clients' convolutional models on the per-client "
        "path: auto is channels_last on CPUs (faster there) except for models with group or "
        "instance normalisation (slower), and contiguous on GPUs",
    )
    flush_seconds: float = Field(
        2.0, ge=0, description="write buffered result rows to a new Parquet part this often"
    )
    checkpoint_every: int = Field(
        10,
        ge=0,
        description="write a checkpoint (server and client states, round counter) every k "
        "rounds, for `raysim run --resume` and worker-failure recovery; 0: never",
    )
    checkpoint_seconds: float = Field(
        30.0,
        ge=0,
        description="checkpoints are also at least this many seconds apart (the first this long "
        "after the run's start), so that fast runs do not spend their time on checkpoints; 0 "
        "(and checkpoint_share 0): exactly every checkpoint_every rounds",
    )
    checkpoint_share: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="after the first, checkpoints take at most about this share of the run's "
        "wall time: after one that took t seconds the next waits at least t / share seconds "
        "(paper-scale client states of GBs); 0: no such floor",
    )
    max_worker_failures: int = Field(
        3, ge=0, description="worker actors that die are restarted this many times per run"
    )
    server_threads: int | None = Field(
        None, ge=1,
        description="threads of the driver's server-side training (FedVCK/FedDM on synthetic "
        "sets, FedDF distillation), which runs while the workers wait; default: "
        "cpus_per_worker. Like cpus_per_worker, a different value can change the last digits "
        "of results (floating-point reduction order); e.g. num_workers x cpus_per_worker uses "
        "every CPU of the run")
    reduction_threads: int | None = Field(
        None, ge=1, le=8,
        description="threads the driver sums the workers' partials and divides the mean with "
        "(elementwise work: the results' bits do not depend on it); default: the CPUs of the "
        "driver's node that no actor reserved when the run starts, 1 to 8 (e.g. a GPU node "
        "with more CPUs than workers)")
    placement: Literal["spread", "pack"] = Field(
        "spread",
        description="spread: a run's workers go to as many nodes as possible; pack: as few",
    )

    @model_validator(mode="after")
    def _check_gpu_fraction(self) -> EngineConfig:
        if self.gpus_per_worker > 1 and self.gpus_per_worker != int(self.gpus_per_worker):
            raise ValueError(
                f"gpus_per_worker={self.gpus_per_worker}: a worker uses a fraction of one GPU "
                "(e.g. 0.25) or a whole number of GPUs"
            )
        return self
