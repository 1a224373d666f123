"""A working copy of the FedVCK authors' code (Youth-49/FedVCK_2024, a checkout the user
fetched), with the only edits that let it run here on the common setting. Each edit replaces
one exact text and fails loudly if the text is not there (:mod:`authors_code`).

What is edited (and nothing else):

1. ``main.py``: the data come from :func:`fidelity_shim.get_dataset` (the MedMNIST npz as
   raysim normalises it, at 28 px) instead of the ``medmnist`` package; the split file is
   :func:`fidelity_shim.split_file` (raysim's Dirichlet partition of the seed, written in the
   authors' JSON layout with their rule for a client's classes: at least 10 samples); no
   ``torch.cuda.set_device``.
2. ``src/server.py``, ``src/client.py``, ``dataset/data/dataset.py``: the ``torchvision`` and
   ``medmnist`` imports go (only ``save_image`` and the replaced loader used them);
   ``get_gpu_mem_info`` returns before it asks NVML (a log line only); the server skips a
   client that holds no class of 10 samples (the authors' own lines, commented out in their
   file: without them their code stops on such a client, which raysim's Dirichlet partitions
   contain and their split files do not; raysim's FedVCK lets such a client upload nothing);
   the server's synthetic
   DataLoader runs in the main process (``num_workers=0``: two worker processes per server
   epoch cost seconds on a CPU and do not change the batches).
3. ``src/utils.py``: ``ConvNetBN``'s width is the common setting's (``dataset_info``'s
   ``net_width``, set by the shim; 128 without it).

Condensation, selection, the latent constraint, the server's training with the relational
contrastive loss, the evaluation and the log are the authors' code.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from authors_code import EditFailed, apply_edits

__all__ = ["EDITS", "EditFailed", "prepare_copy"]

SCRIPT = "main.py"
SHIM = Path(__file__).with_name("fedvck_shim.py")
FILES = ("main.py", "config.py", "src/__init__.py", "src/client.py", "src/server.py",
         "src/utils.py", "src/models.py", "dataset/__init__.py", "dataset/data/__init__.py",
         "dataset/data/dataset.py")
"""What the copy holds (the ``__init__`` files are created when the checkout has none)."""

NO_NVML = ("def get_gpu_mem_info(gpu_id=0):\n    import pynvml\n",
           "def get_gpu_mem_info(gpu_id=0):\n    return 0, 0, 0  # no NVML here\n"
           "    import pynvml\n")

EDITS: dict[str, list[tuple[str, str]]] = {
    "main.py": [
        ("from dataset.data.dataset import get_dataset, PerLabelDatasetNonIID\n",
         "from dataset.data.dataset import PerLabelDatasetNonIID\n"
         "from fidelity_shim import get_dataset, split_file as fidelity_split_file\n"),
        ("_alpha={args.alpha}.json'\n        args.split_file = os.path.join("
         "os.path.dirname(__file__), \"dataset/split_file\"+split_file)\n",
         "_alpha={args.alpha}.json'\n        args.split_file = fidelity_split_file(args)\n"),
        ("    torch.cuda.set_device(device)\n", ""),
    ],
    "src/server.py": [
        ("from torchvision.utils import save_image\n", ""),
        NO_NVML,
        ("                # if len(client.classes) == 0:\n"
         "                #     logging.info(f\"skip client {client.cid}\")\n"
         "                #     continue\n",
         "                if len(client.classes) == 0:\n"
         "                    logging.info(f\"skip client {client.cid}\")\n"
         "                    continue\n"),
        ("DataLoader(synthetic_dataset, self.batch_size, shuffle=True, num_workers=2)",
         "DataLoader(synthetic_dataset, self.batch_size, shuffle=True, num_workers=0)"),
    ],
    "src/client.py": [("from torchvision.utils import save_image\n", "")],
    "src/utils.py": [
        ("            net_width=128,\n            net_depth=3,\n            net_act='relu',\n"
         "            net_norm='batchnorm',",
         "            net_width=dataset_info.get('net_width', 128),\n            net_depth=3,\n"
         "            net_act='relu',\n            net_norm='batchnorm',"),
    ],
    "dataset/data/dataset.py": [
        ("from torchvision import datasets, transforms\n", ""),
        ("from torchvision.utils import save_image\n", ""),
        ("from medmnist import PathMNIST, OCTMNIST, OrganSMNIST, OrganCMNIST, PneumoniaMNIST, "
         "RetinaMNIST\n", ""),
    ],
}


def prepare_copy(checkout: Path, work: Path) -> Path:
    """Copy the authors' Python files (:data:`FILES`) into ``work``, apply :data:`EDITS` and put
    the shim beside ``main.py``; returns the edited ``main.py``."""
    if not (checkout / SCRIPT).is_file() or not (checkout / "src" / "server.py").is_file():
        raise EditFailed(f"{checkout} holds no main.py and src/server.py: pass the root of a "
                         "checkout of https://github.com/Youth-49/FedVCK_2024 as --authors")
    for name in FILES:
        source, target = checkout / name, work / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_file():
            shutil.copy2(source, target)
        elif name.endswith("__init__.py"):
            target.write_text("")
        else:
            raise EditFailed(f"{source} does not exist; the authors' checkout changed")
    apply_edits(work, EDITS)
    shutil.copy2(SHIM, work / "fidelity_shim.py")
    return work / SCRIPT
