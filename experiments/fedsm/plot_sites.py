"""Show what the site shift does: a few training images of every client of a FedSM config.

    python experiments/fedsm/plot_sites.py experiments/fedsm/retina_site_shift.yaml \
        --data-root DIR --output docs/img/fedsm_sites_retina.png
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from raysim.configuration.experiment import load_experiments
from raysim.data import load_dataset, make_partition
from raysim.data.site_shift import apply_site_shift


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("--data-root")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--images", type=int, default=5)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    config = next(iter(load_experiments(args.config).values()))
    dataset = load_dataset(config.dataset, args.data_root)
    partition = make_partition(dataset.train_y, dataset.test_y, config.partition,
                               dataset.info.num_classes, args.seed)
    shifted = apply_site_shift(dataset, partition, config.partition.site_shift, args.seed)
    clients = partition.num_clients
    figure, axes = plt.subplots(clients, args.images, figsize=(args.images * 1.2, clients * 1.25))
    for client in range(clients):
        for column in range(args.images):
            axis = axes[client, column]
            axis.imshow(shifted.train_x[partition.train[client][column]],
                        cmap="gray" if shifted.train_x.ndim == 3 else None, vmin=0, vmax=255)
            axis.set_xticks([])
            axis.set_yticks([])
        axes[client, 0].set_ylabel(f"client {client}", fontsize=8)
    figure.suptitle(f"{dataset.info.name}: site shift, seed {args.seed}", fontsize=9)
    figure.tight_layout()
    figure.savefig(args.output, dpi=110)


if __name__ == "__main__":
    main()
