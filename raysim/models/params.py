"""Every model's config parameters, torch-free: loading and validating a config imports this
module, not the models (which load torch). Each model module registers its builder for the
class of its name (``raysim.models.<module>.<Name>Params`` still works)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, create_model

from raysim.configuration.schema import StrictModel


class SimpleCNNParams(StrictModel):
    name: Literal["cnn"] = "cnn"
    channels: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] = (32, 64)
    hidden: int = Field(128, ge=1)


class ConvNetParams(StrictModel):
    name: Literal["convnet"] = "convnet"
    width: int = Field(128, ge=1)
    depth: int = Field(3, ge=1)
    norm: Literal["instance", "batch", "none"] = "instance"
    pooling: Literal["avg", "max"] = "avg"
    first_padding: int = Field(1, ge=0, le=3)
    """Zero padding of the first convolution: 1 keeps the size; 3 (the FedVCK/DC authors' code
    on 28 px inputs) grows 28 to 32 px, so three poolings end on a 4x4 map instead of 3x3."""


class MLPParams(StrictModel):
    name: Literal["mlp"] = "mlp"
    hidden: tuple[Annotated[int, Field(ge=1)], ...] = Field(
        (64,), description="hidden layer widths; () is a linear model"
    )
    binary_margin: bool = Field(
        False, description="two classes only: one output f(x), logits (0, f(x)); a linear "
        "model then has features + 1 parameters (a linear SVM with training.loss: hinge)")


class ResNet18Params(StrictModel):
    name: Literal["resnet18"] = "resnet18"
    norm: Literal["batch", "group"] = "batch"
    stem: Literal["auto", "small", "imagenet"] = "auto"
    """auto: 3x3 stride-1 stem without max-pool up to 64 px, the 7x7 ImageNet stem above."""

class ConvNet3DParams(StrictModel):
    """The ConvNet for 3D volumes: ``depth`` x [conv3x3x3(width) - norm - ReLU - pool2x2x2],
    then one linear classifier. norm instance (GroupNorm, one group per channel) or none
    keeps it free of BatchNorm, so the vectorised path can train it (``engine.vectorize``)."""

    name: Literal["convnet3d"] = "convnet3d"
    width: int = Field(16, ge=1)
    depth: int = Field(3, ge=1)
    norm: Literal["instance", "batch", "none"] = "instance"
    pooling: Literal["avg", "max"] = "max"


class ResNet18_3DParams(StrictModel):
    """ResNet-18 with every layer in 3D, MedMNIST v2's "ResNet-18 (3D)" baseline: the small
    3x3x3 stride-1 stem up to 64 px, 64-512 channels."""

    name: Literal["resnet18_3d"] = "resnet18_3d"
    norm: Literal["batch", "group"] = "batch"
    stem: Literal["auto", "small", "imagenet"] = "auto"


class TCNParams(StrictModel):
    """A temporal convolutional network (Bai, Kolter and Koltun 2018) for signals: a strided
    stem, then ``levels`` residual blocks of two dilated causal convolutions (dilation 1, 2,
    4, ...), ReLU and dropout; global average pooling and one linear classifier."""

    name: Literal["tcn"] = "tcn"
    channels: int = Field(32, ge=1)
    levels: int = Field(4, ge=1)
    kernel: int = Field(5, ge=2)
    stem_stride: int = Field(4, ge=1, description="the stem's stride (and kernel 2x it): "
                             "shortens the sequence the blocks run over")
    dropout: float = Field(0.1, ge=0, lt=1)


class SignalTransformerParams(StrictModel):
    """A Transformer encoder for time series (Zerveas et al. 2021): the signal cut into patches
    of ``patch`` samples, each projected to ``width`` features, plus learned positions;
    ``layers`` of PyTorch's encoder layer (pre-norm, ``heads`` heads); mean over the tokens and
    one linear classifier."""

    name: Literal["signal_transformer"] = "signal_transformer"
    width: int = Field(32, ge=1)
    heads: int = Field(4, ge=1)
    layers: int = Field(2, ge=1)
    patch: int = Field(20, ge=1)
    feedforward: int = Field(64, ge=1)
    dropout: float = Field(0.1, ge=0, lt=1)


class RNNParams(StrictModel):
    """A recurrent classifier: a strided convolutional stem, then ``layers`` of a GRU or LSTM
    over the shortened sequence; the mean of its outputs and one linear classifier."""

    name: Literal["rnn"] = "rnn"
    cell: Literal["gru", "lstm"] = "gru"
    hidden: int = Field(32, ge=1)
    layers: int = Field(1, ge=1)
    stem_stride: int = Field(4, ge=1, description="the stem's stride (and kernel 2x it)")


class UNetParams(StrictModel):
    """MONAI's U-Net (``monai.networks.nets.UNet``, 2D) for segmentation: ``channels`` per
    level, stride-2 downsampling between levels; ``residual_units`` > 0 makes it the residual
    U-Net (Res-UNet: that many residual units per level, MONAI's ``num_res_units``)."""

    name: Literal["unet"] = "unet"
    channels: tuple[Annotated[int, Field(ge=1)], ...] = Field((16, 32, 64, 128), min_length=2)
    residual_units: int = Field(0, ge=0)
    norm: Literal["instance", "batch"] = "instance"
    dropout: float = Field(0.0, ge=0, lt=1)
    head_features: int | None = Field(
        None, ge=1, description="channels of the full-resolution feature map the body hands "
        "the 1x1-convolution head (None: the first level's)")


class LCFedUNetParams(StrictModel):
    """LC-Fed's network (:mod:`raysim.models.local_calibration`): the U-Net of
    :class:`UNetParams` with the personalised channel selection at its bottleneck and the head
    calibration after its head, for ``sites`` sites (the run's clients)."""

    name: Literal["lcfed_unet"] = "lcfed_unet"
    channels: tuple[Annotated[int, Field(ge=1)], ...] = Field((16, 32, 64, 128), min_length=2)
    residual_units: int = Field(0, ge=0)
    norm: Literal["instance", "batch"] = "instance"
    dropout: float = Field(0.0, ge=0, lt=1)
    head_features: int | None = Field(None, ge=1)
    sites: int = Field(4, ge=2, description="the sites the channel selection and the head "
                       "calibration know (the run's clients)")
    calibration_kernel: int | None = Field(
        None, ge=3, description="the head calibration's local-maximum window and Gaussian "
        "width in pixels (odd; None: the paper's 31 px at 384 px, scaled to the input)")

    def unet(self) -> UNetParams:
        """The U-Net underneath."""
        return UNetParams(channels=self.channels, residual_units=self.residual_units,
                          norm=self.norm, dropout=self.dropout,
                          head_features=self.head_features)


class UNetPlusPlusParams(StrictModel):
    """MONAI's UNet++ (``monai.networks.nets.BasicUNetPlusPlus``, 2D, Zhou et al. 2019):
    ``features`` are its six widths (five levels and the last up-sampling block)."""

    name: Literal["unetpp"] = "unetpp"
    features: tuple[int, int, int, int, int, int] = (16, 16, 32, 64, 128, 16)
    norm: Literal["instance", "batch"] = "instance"
    head_features: int | None = Field(
        None, ge=1, description="channels of the full-resolution feature map the body hands "
        "the 1x1-convolution head (None: the first width)")


class FCNParams(StrictModel):
    """A fully convolutional network (Long et al. 2015, FCN-8s): a VGG-style encoder of five
    stages (``channels``, two 3x3 conv-BatchNorm-ReLU and a 2x2 max-pool each), the
    stride-8, -16 and -32 maps each projected to ``head_features`` channels, upsampled
    (bilinear) and summed, then upsampled to the input's size for the 1x1-convolution head."""

    name: Literal["fcn"] = "fcn"
    channels: tuple[int, int, int, int, int] = (16, 32, 64, 128, 128)
    head_features: int = Field(16, ge=1)


ZOO_MODELS: dict[str, str] = {
    "densenet": "DenseNet-BC, 3 blocks x 6 layers, growth 12.",
    "mobilenetv2": "MobileNetV2, 5 inverted-residual stages.",
    "resnet5": "ResNet5: 1 bottleneck block(s), stages (1,).",
    "resnet8": "ResNet8: 2 bottleneck block(s), stages (1, 1).",
    "resnet11": "ResNet11: 3 bottleneck block(s), stages (1, 1, 1).",
    "resnet17": "ResNet17: 5 bottleneck block(s), stages (2, 2, 1).",
    "resnext": "ResNeXt, 3 stages x 2 blocks, cardinality 8.",
    "senet": "SE-ResNet, 3 stages x 2 SE basic blocks, 32-128 channels.",
    "shufflenetv2": "ShuffleNetV2, stages of 48/96/192 channels, 256 output channels.",
    "squeezenet": "SqueezeNet 1.1-style, 4 fire modules.",
    "vgg": "VGG-11 with BatchNorm, 32-256 channels.",
}
"""The heterogeneous zoo (``raysim.models.zoo``): split architectures without hyperparameters,
by config name, with a one-line description."""


class _ZooParams(StrictModel):
    """The base of a zoo architecture's params: its one field, ``name``, needs no attribute
    docstrings, and pydantic's search for the source of a class made by ``create_model``
    scans every loaded module for each (0.6 s for the zoo in every process that loads a
    config)."""

    model_config = ConfigDict(use_attribute_docstrings=False)


def _zoo_params(name: str, doc: str) -> type[StrictModel]:
    params = create_model(f"Zoo_{name}_Params", __base__=_ZooParams, __module__=__name__,
                          name=(Literal[name], name))  # type: ignore[arg-type]
    params.__doc__ = doc
    return params


ZOO_PARAMS: dict[str, type[StrictModel]] = {name: _zoo_params(name, doc)
                                            for name, doc in ZOO_MODELS.items()}

MODEL_PARAMS: tuple[type[StrictModel], ...] = (
    SimpleCNNParams, ConvNetParams, ConvNet3DParams, MLPParams, ResNet18Params,
    ResNet18_3DParams, UNetParams, LCFedUNetParams, UNetPlusPlusParams, FCNParams, TCNParams,
    SignalTransformerParams, RNNParams, *ZOO_PARAMS.values())
"""The params class of every model raysim ships (a test checks it against the registry)."""

PLUGIN_MODEL_PARAMS: list[type[StrictModel]] = []
"""The params classes of models registered by plug-ins (:mod:`raysim.plugins`)."""


def model_params() -> tuple[type[StrictModel], ...]:
    """The params class of every registered model: raysim's, then the plug-ins'."""
    return (*MODEL_PARAMS, *PLUGIN_MODEL_PARAMS)
