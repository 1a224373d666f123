"""A working copy of the FedDC authors' PneumoniaMNIST script (``Pneumonia/`` of
kampmichael/FedDC, a checkout the user fetched), with the only edits that let it run here on the
common setting. Each edit replaces one exact text and fails loudly if the text is not there, so
a changed upstream file is noticed rather than silently mis-edited.

What is edited (and nothing else):

1. ``dataset_pneum.py`` and ``pneumnet.py``: the ``torchvision`` imports go (the image-folder
   loader and torchvision's models are not called; torchvision's wheel may not load beside
   this torch).
2. ``feddc_pneum_pytorch.py``:
   - the device is the CPU (``mode = 'cpu'``), not ``cuda``;
   - the data come from :func:`fidelity_shim.common_data` (the MedMNIST npz as raysim
     normalises it) instead of ``getPneum`` (224 px folders);
   - the model is :func:`fidelity_shim.common_model` (raysim's model of the common setting)
     instead of torchvision's ResNet18 with a 2-class head;
   - the split and the daisy-chaining shuffle go through :func:`fidelity_shim.split` and
     :func:`fidelity_shim.daisy_chain`, which call the authors' own code unless lockstep mode
     asks for raysim's split and permutations.

The training step, the aggregation (``averaging.Average``), the schedule (``t % d == 0``,
``t % b == 0`` from t = 0), the evaluation and the result pickles are the authors' code.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from authors_code import EditFailed, apply_edits

__all__ = ["EDITS", "EditFailed", "prepare_copy"]

SCRIPT = "feddc_pneum_pytorch.py"
SHIM = Path(__file__).with_name("feddc_shim.py")

EDITS: dict[str, list[tuple[str, str]]] = {
    "dataset_pneum.py": [
        ("import torchvision\n", ""),
        ("from torchvision import transforms, datasets\n", ""),
    ],
    "pneumnet.py": [("import torchvision\n", "")],
    SCRIPT: [
        ("from torch.utils.data import TensorDataset, DataLoader\n",
         "from torch.utils.data import TensorDataset, DataLoader\nimport fidelity_shim\n"),
        ("mode = 'gpu'", "mode = 'cpu'"),
        ('device = torch.device("cuda")', 'device = torch.device("cpu")'),
        ("torchnetwork = torchvision.models.resnet18(progress=True).to(device) "
         "#(pretrained=True, progress=True).to(device)\n",
         "torchnetwork = fidelity_shim.common_model().to(device)\n"),
        ("        torchnetwork.fc = nn.Linear(512, 2).to(device)\n", ""),
        ("    X_train, y_train, X_test, y_test = getPneum(device)\n    n_train",
         "    X_train, y_train, X_test, y_test = fidelity_shim.common_data(device)\n    n_train"),
        ("client_idxs = splitIntoLocalData(n_train, args.num_clients, "
         "args.num_samples_per_client, rng)",
         "client_idxs = fidelity_shim.split(n_train, args.num_clients, "
         "args.num_samples_per_client, rng, splitIntoLocalData)"),
        ("rng.shuffle(localDataIndex)", "fidelity_shim.daisy_chain(localDataIndex, t, rng)"),
    ],
}


def prepare_copy(checkout: Path, work: Path) -> Path:
    """Copy ``<checkout>/Pneumonia/*.py`` into ``work``, apply :data:`EDITS` and put the shim
    beside them; returns the edited script's path."""
    source = checkout / "Pneumonia"
    if not (source / SCRIPT).is_file():
        raise EditFailed(f"{source / SCRIPT} does not exist: pass the root of a checkout of "
                         "https://github.com/kampmichael/FedDC as --authors")
    work.mkdir(parents=True, exist_ok=True)
    for path in source.glob("*.py"):
        shutil.copy2(path, work / path.name)
    apply_edits(work, EDITS)
    shutil.copy2(SHIM, work / "fidelity_shim.py")
    return work / SCRIPT
