"""The suite's generated MedMNIST-layout files (:mod:`raysim.data.generated`)."""

from raysim.data.generated import (
    write_medmnist_npz,
    write_multilabel_npz,
    write_recordings,
    write_segmentation_sites,
    write_volume_npz,
)

__all__ = ["write_medmnist_npz", "write_multilabel_npz", "write_recordings",
           "write_segmentation_sites", "write_volume_npz"]
