"""The majority-class baseline of the FedVCK settings' test sets (a constant prediction of the
most frequent training class), scored with raysim's metrics, into
docs/results/fedvck/majority_class.csv (key column ``experiment``: the dataset).

    python experiments/fedvck/majority_class.py --data-root DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from raysim.configuration.schema import DatasetConfig
from raysim.data import load_dataset
from raysim.training.evaluation import classification_metrics

OUTPUT = Path(__file__).resolve().parents[2] / "docs" / "results" / "fedvck" / "majority_class.csv"


def majority_row(name: str, data_root: str) -> dict[str, object]:
    """Metrics of predicting the training split's most frequent class on the test split."""
    dataset = load_dataset(DatasetConfig(name=name, root=data_root, download=False), None)
    classes = dataset.info.num_classes
    majority = int(np.bincount(dataset.train_y, minlength=classes).argmax())
    probabilities = np.full((len(dataset.test_y), classes), 1e-6)
    probabilities[:, majority] = 1.0
    probabilities /= probabilities.sum(1, keepdims=True)
    metrics = classification_metrics(dataset.test_y, probabilities)
    return {"experiment": name, "majority_class": majority, "test_images": len(dataset.test_y),
            **{k: metrics[k] for k in ("accuracy", "auc", "macro_f1")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=None,
                        help="directory of the MedMNIST npz files (default: medmnist's)")
    args = parser.parse_args()
    rows = [majority_row(name, args.data_root)
            for name in ("pneumoniamnist", "breastmnist", "retinamnist")]
    pd.DataFrame(rows).to_csv(OUTPUT, index=False)
    print(OUTPUT)


if __name__ == "__main__":
    main()
