"""Every algorithm's config parameters, torch-free: loading and validating a config imports
this module, not the algorithms (which load torch). Each algorithm module imports its class
from here (``raysim.algorithms.<name>.<Name>Params`` still works)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from raysim.condensation.operations import OPERATIONS, Operation
from raysim.configuration.schema import StrictModel


class CentralizedParams(StrictModel):
    name: Literal["centralized"] = "centralized"
    data: Literal["clients", "full"] = "clients"
    """clients: the union of the clients' training samples (the same data the federated
    methods see); full: the whole training split, e.g. FedDC's centralized baseline, whose
    clients hold only a small sample of it."""


class FedAvgParams(StrictModel):
    name: Literal["fedavg"] = "fedavg"
    weighted: bool = True
    """Weight client models by their sample counts (False: plain mean)."""


class FedProxParams(StrictModel):
    name: Literal["fedprox"] = "fedprox"
    mu: float = Field(0.01, ge=0, description="proximal term weight")
    weighted: bool = True


class LocalOnlyParams(StrictModel):
    name: Literal["local"] = "local"


class ScaffoldParams(StrictModel):
    name: Literal["scaffold"] = "scaffold"
    control_update: Literal["I", "II"] = "II"
    """How a client refreshes its control variate c_i (Karimireddy et al. 2020, eq. 4):
    I: the gradient of its loss at the server model over its whole training set (one more
    pass over its data); II: c_i - c + (x - y_i) / (K lr), from the local steps it took."""
    server_lr: float = Field(1.0, gt=0)
    """eta_g: the server model moves by server_lr times the mean model difference."""
    weighted: bool = True
    """Weight the clients' models by their sample counts (False: plain mean, as the paper);
    control variates are always a plain mean."""


class DittoParams(StrictModel):
    name: Literal["ditto"] = "ditto"
    lam: float = Field(0.1, ge=0)
    """lambda: weight of the personal model's pull lambda/2 ||v - w||^2 towards the round's
    global model (0: each personal model trains alone, as local training)."""
    weighted: bool = True
    """Weight the clients' global-model updates by their sample counts (False: plain mean)."""


class FedBNParams(StrictModel):
    name: Literal["fedbn"] = "fedbn"
    weighted: bool = True
    """Weight the clients' shared layers by their sample counts (False: plain mean)."""


class LGFedAvgParams(StrictModel):
    name: Literal["lg_fedavg"] = "lg_fedavg"
    global_layers: int = Field(1, ge=1)
    """How many of the model's last layers with parameters are global (averaged by the
    server); the layers before them are each client's local representation."""
    weighted: bool = True
    """Weight the clients' global layers by their sample counts (False: plain mean)."""


class FedRepParams(StrictModel):
    name: Literal["fedrep"] = "fedrep"
    head_layers: int = Field(1, ge=1)
    """How many of the model's last layers with parameters are each client's personal head;
    the layers before them are the shared representation."""
    head_epochs: int = Field(10, ge=1)
    """Epochs of head training (the representation frozen) before each round's
    representation update (the run's local epochs or steps, the head frozen); the paper's
    default is 10."""
    weighted: bool = True
    """Weight the clients' representations by their sample counts (False: plain mean)."""


class APFLParams(StrictModel):
    name: Literal["apfl"] = "apfl"
    alpha: float = Field(0.5, ge=0, le=1)
    """The mixing weight's starting value: a client's personal model is alpha v + (1 - alpha)
    w of its own model v and the global model w."""
    adaptive: bool = True
    """Learn each client's alpha by gradient descent on the mixed model's loss (the paper's
    adaptive APFL); False keeps alpha fixed."""
    alpha_lr: float | None = Field(None, gt=0)
    """Step size of alpha's updates (None: the run's learning rate)."""
    weighted: bool = True
    """Weight the clients' global-model updates by their sample counts (False: plain mean)."""


class LCFedParams(StrictModel):
    name: Literal["lcfed"] = "lcfed"
    head_steps: int = Field(10, ge=0)
    """Steps of head training (the rest of the network frozen) at the start of each round,
    before the round's local work trains the shared layers with the head frozen (the
    authors' code: ``head_iter`` = 10)."""
    contrast_weight: float = Field(0.0, ge=0)
    """Weight of the contrastive site-embedding term, which pushes the channel gates of the
    client's own site away from those the other sites' embeddings give (the authors' code:
    ``alpha``, 0 by default)."""
    calibration_rounds: int = Field(0, ge=0)
    """The run's last rounds that train the head calibration alone (LC-Fed's second stage:
    the U-Net frozen, the sites' heads from the round's start); 0: none."""
    weighted: bool = False
    """Weight the clients' shared layers by their sample counts (False: a plain mean, the
    authors' code)."""


class MOONParams(StrictModel):
    name: Literal["moon"] = "moon"
    mu: float = Field(1.0, ge=0)
    """Weight of the model-contrastive term (MOON's mu; the paper uses 5 on CIFAR-10 and 1 on
    CIFAR-100 and Tiny-ImageNet; 0 is FedAvg)."""
    temperature: float = Field(0.5, gt=0)
    """tau of the contrastive term's softmax over the two cosine similarities."""
    weighted: bool = True
    """Weight the clients' models by their sample counts (False: plain mean)."""


class FedMixParams(StrictModel):
    name: Literal["fedmix"] = "fedmix"
    lam: float = Field(0.2, ge=0, lt=1)
    """lambda, the mixing ratio of FedMix's approximate mixup loss (0: FedAvg; 0.2: the Flower
    baseline's strategy default and FEMNIST setting; its CIFAR-10 experiment uses 0.05,
    CIFAR-100 0.1)."""
    mash_size: int | None = Field(None, ge=1)
    """M: local samples averaged into one mashed sample, in the client's data order (null:
    all of a client's data into one, as the Flower baseline's CIFAR-10 setting)."""
    weighted: bool = True
    """Weight the clients' models by their sample counts (False: plain mean)."""


class FedGenParams(StrictModel):
    name: Literal["fedgen"] = "fedgen"
    generative_alpha: float = Field(10.0, ge=0)
    """alpha: weight of a client's cross-entropy on the generator's features of sampled
    labels (the authors' MNIST setting; 0 with ``generative_beta`` 0: FedAvg)."""
    generative_beta: float = Field(10.0, ge=0)
    """beta: weight of the KL term pulling a client's predictions on its own batch towards its
    classifier's predictions on generated features of the same labels."""
    regularizer_decay: float = Field(0.98, gt=0, le=1)
    """Both weights decay by this factor per round (floored at 1e-4), as in the authors' code."""
    generated_batch_size: int = Field(32, ge=1)
    """Generated features per client step (their cross-entropy scaled by this over the batch
    size, as in the authors' code)."""
    noise_dim: int = Field(32, ge=1)
    """Width of the generator's uniform noise input."""
    generator_hidden: int = Field(256, ge=1)
    """Width of the generator's hidden layer."""
    generator_steps: int = Field(50, ge=0)
    """Adam steps on the generator per round (the authors' ensemble epochs)."""
    generator_batch_size: int = Field(32, ge=2)
    """Labels drawn per generator step."""
    generator_lr: float = Field(3e-4, gt=0)
    """The generator's Adam learning rate (x ``generator_lr_decay`` per round)."""
    generator_lr_decay: float = Field(0.98, gt=0, le=1)
    generator_weight_decay: float = Field(1e-2, ge=0)
    """L2 weight decay of the generator's Adam."""
    diversity_weight: float = Field(1.0, ge=0)
    """eta: weight of the generator's diversity loss."""
    weighted: bool = True
    """Weight the clients' models by their sample counts (False: plain mean)."""


class FedGANParams(StrictModel):
    name: Literal["fedgan"] = "fedgan"
    synthetic_weight: float = Field(1.0, ge=0)
    """lambda: weight of the classifier's cross-entropy on the global generator's images of
    uniformly drawn classes (0: FedAvg)."""
    synthetic_batch_size: int | None = Field(None, ge=1)
    """Generated images per classifier step (null: training.batch_size)."""
    gan_steps: int = Field(50, ge=0)
    """Local discriminator-and-generator steps per round (FedGAN's synchronisation interval
    K)."""
    gan_batch_size: int = Field(32, ge=1)
    gan_lr: float = Field(2e-4, gt=0)
    """Adam learning rate of both networks (betas 0.5, 0.999, as DCGAN)."""
    noise_dim: int = Field(100, ge=1)
    gan_width: int = Field(32, ge=1)
    """Base channel width of the generator and the discriminator."""
    weighted: bool = True
    """Weight the clients' models and GANs by their sample counts (False: plain mean)."""


class DFRDParams(StrictModel):
    name: Literal["dfrd"] = "dfrd"
    server_iterations: int = Field(10, ge=0)
    """I: alternations of generator training and robust distillation per round (0: FedAvg)."""
    generator_steps: int = Field(1, ge=0)
    """Adam steps on the conditional generator per iteration."""
    distillation_steps: int = Field(5, ge=0)
    """Steps of distillation of the averaged model towards the ensemble per iteration (0:
    FedAvg)."""
    batch_size: int = Field(64, ge=2)
    """Generated images per generator step, and per generator at each distillation step."""
    generator_lr: float = Field(1e-3, gt=0)
    """The generator's Adam learning rate."""
    distillation_lr: float = Field(1e-3, gt=0)
    """The global model's Adam learning rate during distillation."""
    transferability_weight: float = Field(1.0, ge=0)
    """beta_tran: weight of the transferability term, -KL(ensemble || global model) on
    generated images that the two still classify alike."""
    diversity_weight: float = Field(1.0, ge=0)
    """beta_div: weight of the generator's diversity loss."""
    ema_decay: float = Field(0.5, ge=0, lt=1)
    """alpha: the EMA generator becomes alpha * itself + (1 - alpha) * the generator after
    each round's training."""
    ema_weight: float = Field(0.5, ge=0, le=1)
    """lambda: share of the EMA generator's images in the distillation loss (the generator's
    images take 1 - lambda; 0: no EMA generator)."""
    noise_dim: int = Field(100, ge=1)
    generator_width: int = Field(32, ge=1)
    """Base channel width of the conditional generator."""
    weighted: bool = True
    """Weight the clients' models by their sample counts (False: plain mean)."""


class DifferentialPrivacy(StrictModel):
    clip: float = Field(gt=0, description="S: L2 bound of an outgoing update")
    sigma: float = Field(ge=0, description="noise multiplier: std = sigma * S")


class FedDCParams(StrictModel):
    name: Literal["feddc"] = "feddc"
    daisy_period: int | None = Field(1, ge=1, description="d in rounds; null: never")
    aggregation_period: int | None = Field(10, ge=1, description="b in rounds; null: never")
    permutation: Literal["shuffle", "derangement"] = "shuffle"
    aggregator: Literal["mean", "radon", "median"] = "mean"
    radon_sample: Literal["first", "random"] = Field(
        "first", description="which r^h models the iterated Radon point uses when there are "
        "more: the first ones (the paper) or a fresh random draw per aggregation")
    weighted: bool = Field(False, description="mean weighted by sample counts (paper: unweighted)")
    mu: float = Field(0.0, ge=0, description="FedProx proximal weight towards the last aggregate")
    dp: DifferentialPrivacy | None = None
    schedule: Literal["end", "start"] = Field(
        "end", description="end: aggregate (and permute) in the last round of each period, "
        "rounds b-1, 2b-1, ... (the paper's Algorithm 1: t mod b = b - 1); start: in "
        "rounds 0, b, 2b, ..., as the authors' code counts (t % b == 0 from t = 0, one round "
        "earlier and once after the very first round)")


class FedSMParams(StrictModel):
    name: Literal["fedsm"] = "fedsm"
    variant: Literal["fedsm", "extra"] = "fedsm"
    """fedsm: selector label = client index, trained with the models; extra: FedSM-extra."""
    softpull_lambda: float = Field(0.7, le=1.0)
    """SoftPull coefficient in [1/K, 1]: 1 keeps each personal model, 1/K averages them."""
    gamma: float = Field(0.9, ge=0.0, le=1.0)
    """Selector confidence above which a personalized model answers (1: global only)."""
    gamma_sweep: list[float] = Field(default_factory=list)
    """More gammas to evaluate at every evaluation (no retraining), columns ``g<gamma>_*``."""
    selector_lr: float = Field(1e-3, gt=0)
    """Adam learning rate of the selector (full-batch steps)."""
    selector_epochs: int | None = Field(None, ge=1)
    """Full-batch Adam steps of the selector per client and round (NVFlare's selector
    epochs); default: training.local_epochs (1 with local_steps)."""
    selector_model: dict[str, Any] | None = None
    """The selector's architecture as a model section (e.g. {name: convnet, norm: none}; the
    authors use VGG-11 without normalisation); default: the task model."""
    extra_rounds: int = Field(0, ge=0)
    """FedSM-extra: the last ``extra_rounds`` rounds train only the selector."""
    weighted: bool = True
    """Average the global model and the selector by sample counts."""

    @model_validator(mode="after")
    def _check(self) -> FedSMParams:
        bad = [g for g in self.gamma_sweep if not 0.0 <= g <= 1.0]
        if bad:
            raise ValueError(f"gamma_sweep holds {bad[0]}, but gamma lies in [0, 1]")
        if self.variant == "extra" and self.extra_rounds < 1:
            raise ValueError("variant 'extra' (FedSM-extra) needs extra_rounds >= 1: the "
                             "rounds at the end that train only the selector")
        if self.variant == "fedsm" and self.extra_rounds:
            raise ValueError("extra_rounds applies to variant 'extra' only; set "
                             "algorithm.variant=extra or remove extra_rounds")
        return self


class EnsembleDistillationParams(StrictModel):
    """What FedDF and pFedDF share: the public set and the server's distillation."""

    public_per_client: int = Field(50, ge=1)
    """Samples each client contributes to the unlabelled public set."""
    distillation_steps: int = Field(200, ge=0)
    """Server Adam steps per group and round (the paper: up to 10^4 with early stopping)."""
    distillation_lr: float = Field(1e-3, gt=0)
    distillation_batch_size: int = Field(64, ge=1)
    temperature: float = Field(1.0, gt=0)
    weighted: bool = True
    """Average a group's models by the clients' sample counts (False: plain mean)."""


class FedDFParams(EnsembleDistillationParams):
    name: Literal["feddf"] = "feddf"


class PFedDFParams(EnsembleDistillationParams):
    name: Literal["pfeddf"] = "pfeddf"


class PublicSetParams(StrictModel):
    """What every method that exchanges outputs on a public set shares (FedMD, DS-pFL,
    KT-pFL)."""

    public_per_client: int = Field(50, ge=1)
    """Samples each client contributes to the public set (all of them if it has fewer)."""
    digest_epochs: int = Field(1, ge=0)
    """Epochs of training towards the server's targets on the public set each round."""
    pretrain_epochs: int = Field(5, ge=0)
    """Epochs of supervised training on the labelled public set before the first round."""


class FedMDParams(PublicSetParams):
    name: Literal["fedmd"] = "fedmd"
    digest_loss: Literal["l1", "mse", "kl"] = "l1"
    """How the digest pulls logits to the consensus: the authors' mean absolute error (l1),
    squared error (mse) or temperature-scaled KL divergence (kl)."""
    temperature: float = Field(1.0, gt=0)
    """Softmax temperature of ``digest_loss: kl``."""


class DSpFLParams(PublicSetParams):
    name: Literal["dspfl"] = "dspfl"
    era_temperature: float | None = Field(0.1, gt=0)
    """Entropy reduction aggregation (Itahara et al.): the server's soft labels are
    softmax(mean of the clients' soft labels / era_temperature); the paper's 0.1. None: simple
    averaging (the paper's SA baseline)."""


class KTpFLParams(PublicSetParams):
    name: Literal["ktpfl"] = "ktpfl"
    temperature: float = Field(10.0, gt=0)
    """Softmax temperature of the uploaded soft predictions and of the distillation (the
    authors' configs: 10)."""
    coefficient_lr: float = Field(0.5, ge=0)
    """Step size of the gradient step on the knowledge-coefficient matrix each round (0: the
    matrix stays uniform, every client gets the plain mean)."""
    penalty: float = Field(0.1, ge=0)
    """rho: weight of the pull of each matrix row towards 1/N."""
    coefficient_sharpness: float = Field(5.0, gt=0)
    """Each row is renormalised as softmax(sharpness x row) after the step (the authors'
    code: 5)."""


class MHpFLIDParams(StrictModel):
    name: Literal["mhpflid"] = "mhpflid"
    injection_epochs: int = Field(4, ge=0)
    distillation_epochs: int = Field(1, ge=0)
    """The paper: 1; chosen on BreastMNIST's validation split (docs/mhpflid-study.md)."""
    injection_lr: float = Field(1e-4, gt=0)
    distillation_lr: float = Field(1e-3, gt=0)
    """The paper: 1e-5, at which the messenger moves ~0.1 % per round; raysim's default 1e-3 is
    the setting chosen on BreastMNIST's validation split (docs/mhpflid-study.md), tied there with
    others within noise."""
    injection_local_weight: float = Field(0.9, ge=0.0, le=1.0)
    """lambda^l_inj: weight of the local model's cross-entropy in the injection stage."""
    injection_messenger_weight: float = Field(0.1, ge=0.0, le=1.0)
    """lambda^m_inj: weight of the messenger head's cross-entropy on the receiver output."""
    distillation_messenger_weight: float = Field(0.9, ge=0.0, le=1.0)
    """lambda^m_dis: weight of the messenger head's cross-entropy on the transmitter output."""
    distillation_kl_weight: float = Field(0.1, ge=0.0, le=1.0)
    """lambda^con_dis: weight of KL(local || messenger) in the distillation stage."""
    receiver: Literal["attention", "add"] = "attention"
    transmitter: Literal["attention", "add"] = "attention"
    share_messenger_body: bool = True
    share_messenger_head: bool = True
    tokens: Literal["channel", "spatial"] = "spatial"
    """Attention tokens: spatial positions (D_mes features each, the paper's Eq. 8) or messenger
    channels (each a token_grid^2 map; degenerate over a 1x1 messenger map, kept to compare)."""
    token_grid: int = Field(4, ge=1, le=16)
    messenger_input_size: int | None = Field(112, ge=32)
    """Images are resized (bilinear) to this size before the messenger, so that its map keeps
    spatial tokens: 112 px gives 4x4 (28 px gives 1x1). None: the client's own resolution.
    A segmentation messenger always works at the images' own resolution."""
    messenger_widths: tuple[int, int, int] = (64, 64, 512)
    """Output channels of the messenger body's three convolutions (Appendix E: 64, 64, 512)."""
    messenger_hidden: int = Field(256, ge=1)
    segmentation_messenger_widths: tuple[int, int, int, int] = (64, 64, 64, 512)
    """Segmentation (Table 10): output channels of the messenger body's four convolutions."""
    segmentation_messenger_decoder: int = Field(64, ge=1)
    """Segmentation (Table 10): channels of the head's first three 2x2 transposed
    convolutions (the fourth gives the classes)."""
    weighted: bool = True
    """Average messengers by the clients' sample counts (False: plain mean)."""


class AugmentationParams(StrictModel):
    """Differentiable siamese augmentation of the matching steps (and of server training)."""

    mode: Literal["single", "all"] = "single"
    """single: one operation per step, drawn from ``operations`` (the FedVCK authors' default);
    all: every operation in turn (DSA's original)."""
    operations: tuple[Operation, ...] = OPERATIONS  # type: ignore[assignment]
    server: bool = True
    """Augment the synthetic batches while the server trains on them (one random operation per
    batch, not siamese), as the authors do."""

    @model_validator(mode="before")
    @classmethod
    def _operations_shorthand(cls, value: Any) -> Any:
        """``augmentation: [crop, flip]`` (or ``[]`` for none) means those operations."""
        return {"operations": value} if isinstance(value, list | tuple) else value


class CondensationParams(StrictModel):
    """Settings every condensation method shares: matching, augmentation, server training."""

    iterations: int = Field(1000, ge=1)
    real_per_class: int = Field(256, ge=1)
    image_lr: float = Field(1.0, gt=0)
    momentum: float = Field(0.5, ge=0, lt=1)
    augmentation: AugmentationParams = AugmentationParams()
    server_epochs: int = Field(1000, ge=1)
    server_lr: float = Field(1e-3, gt=0)
    server_momentum: float = Field(0.9, ge=0, lt=1)
    server_weight_decay: float = Field(1e-6, ge=0)
    server_batch_size: int = Field(256, ge=2)
    server_lr_decay: float = Field(0.1, gt=0, le=1)
    """Factor on the server's learning rates (and FedVCK's contrastive weight) from half the
    server epochs on (the authors' StepLR); 1 keeps them constant."""


class FedDMParams(CondensationParams):
    name: Literal["feddm"] = "feddm"
    images_per_class: int = Field(10, ge=1)
    rho: float = Field(5.0, ge=0)
    """Largest norm of the random perturbation of the global model."""


class FedVCKParams(CondensationParams):
    name: Literal["fedvck"] = "fedvck"
    percent: float = Field(1.0, gt=0, le=100)
    """p: synthetic images per class = max(min_images_per_class, ceil(p% of local n_c))."""
    min_images_per_class: int = Field(5, ge=1)
    min_class_samples: int = Field(10, ge=1)
    """Classes with fewer local samples are not condensed."""
    iterations: int = Field(5000, ge=1)
    image_lr: float = Field(0.2, gt=0)
    kernel: Literal["linear", "gaussian", "polynomial"] = "linear"
    latent_constraint: bool = True
    selection: Literal["model_guided", "uniform"] = "model_guided"
    alpha: float = Field(0.5, ge=0, le=1)
    """Self-ensemble weight of the current model's logits."""
    gamma: float = Field(1.0, gt=0)
    offset: float = 0.0
    """b in w = sigmoid(gamma (CE - b))."""
    contrastive: bool = True
    beta: float = Field(0.1, ge=0)
    """Weight of the relational contrastive loss (x server_lr_decay from half the epochs)."""
    tau: float = Field(1.0, gt=0)
    hard_negatives: int | None = Field(None, ge=1)
    """K hard-negative classes per class (default min(5, classes - 1))."""
    projector_hidden: int = Field(128, ge=1)
    """Hidden width of the projector MLP (Linear-BatchNorm-ReLU-Linear), new every round."""
    projector_lr: float = Field(0.01, gt=0)
    """Adam learning rate of the projector."""
    keep_rounds: int | None = Field(None, ge=1)
    """Rounds of synthetic sets the server trains on (default max(10, R/2))."""


class DESAParams(StrictModel):
    name: Literal["desa"] = "desa"
    images_per_class: int = Field(50, ge=1)
    """ipc: synthetic anchor images each client condenses for every class (the authors' 50)."""
    iterations: int = Field(1000, ge=1)
    """Distribution-matching steps of a client's anchors (the authors' ``inv_iters``)."""
    real_per_class: int = Field(256, ge=1)
    """Real images per class per matching step."""
    image_lr: float = Field(1.0, gt=0)
    momentum: float = Field(0.5, ge=0, lt=1)
    augmentation: AugmentationParams = AugmentationParams()
    lambda_ori: float = Field(1.0, ge=0)
    """Weight of the cross-entropy on the client's data joined with the anchors."""
    lambda_kd: float = Field(1.0, ge=0)
    """Weight of the distillation towards the other clients' logits on the anchors."""
    lambda_reg: float = Field(1.0, ge=0)
    """Weight of the supervised contrastive term between the batch's and anchor features."""
    kd_temperature: float = Field(20.0, gt=0)
    kd_weight: float = Field(0.9, ge=0, le=1)
    """The distillation term is (1 - kd_weight) CE + kd_weight T^2 KL (the authors' 0.9)."""
    supcon_temperature: float = Field(0.07, gt=0)


ALGORITHM_PARAMS: tuple[type[StrictModel], ...] = (
    CentralizedParams,
    FedAvgParams,
    FedProxParams,
    LocalOnlyParams,
    ScaffoldParams,
    DittoParams,
    FedBNParams,
    LGFedAvgParams,
    FedRepParams,
    APFLParams,
    LCFedParams,
    MOONParams,
    FedMixParams,
    FedGenParams,
    FedGANParams,
    DFRDParams,
    FedDCParams,
    FedSMParams,
    FedDFParams,
    PFedDFParams,
    FedMDParams,
    DSpFLParams,
    KTpFLParams,
    MHpFLIDParams,
    FedDMParams,
    FedVCKParams,
    DESAParams,
)
"""The params class of every algorithm raysim ships (a test checks it against the registry)."""

PLUGIN_ALGORITHM_PARAMS: list[type[StrictModel]] = []
"""The params classes of algorithms registered by plug-ins (:mod:`raysim.plugins`), in the
order they registered."""


def algorithm_params() -> tuple[type[StrictModel], ...]:
    """The params class of every registered algorithm: raysim's, then the plug-ins'."""
    return (*ALGORITHM_PARAMS, *PLUGIN_ALGORITHM_PARAMS)
