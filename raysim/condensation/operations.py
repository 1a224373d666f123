"""Names of the differentiable siamese augmentation operations (torch-free: the config uses
them)."""

from __future__ import annotations

from typing import Literal, get_args

Operation = Literal["color", "crop", "cutout", "flip", "scale", "rotate"]
OPERATIONS: tuple[Operation, ...] = get_args(Operation)
AugmentationMode = Literal["single", "all"]
