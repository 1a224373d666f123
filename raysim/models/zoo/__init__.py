"""Compact heterogeneous architectures for 28-64 px MedMNIST inputs, each a
:class:`~raysim.models.split.SplitModel` (body + head), one family per module."""

from __future__ import annotations

from raysim.models.zoo import (  # noqa: F401  (registration)
    densenet,
    mobilenetv2,
    resnet_family,
    resnext,
    senet,
    shufflenetv2,
    squeezenet,
    vgg,
)
