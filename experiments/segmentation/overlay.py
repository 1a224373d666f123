"""The overlay figure of a segmentation study (MH-pFLID's Figure 4): one test image of each
client, its ground truth, and each method's predicted mask, drawn from the final models a run
kept (``evaluation.keep_models: true``), seed 0 of every variant.

Each client's image is the first of its test share whose mask holds foreground. A method with
personal models (local training, Ditto, MH-pFLID, ...) predicts with the client's own model; the
others with their evaluated model (FedSM: its super model, routed by the selector). A
personal model built on the server's (FedBN, LG-FedAvg, FedRep, LC-Fed, APFL) is composed from
the final server state as the run evaluated it.

    python experiments/segmentation/overlay.py RUN_ROOT [RUN_ROOT ...] --data-root DIR \
        --out docs/figures/polyp_overlay.png --csv docs/results/segmentation/overlay.csv
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
import torch

from raysim.algorithms import ALGORITHMS
from raysim.configuration.experiment import parse_config
from raysim.preparation import initial_weights, pooled, prepare, run_context
from raysim.rounds.final_models import read_final_models
from raysim.training.context import ClientData
from raysim.training.evaluation import predict_proba, segmentation_scores
from raysim.training.runtime import ClientRuntime
from raysim.vectors.weights import set_weights


def predicted_masks(run_dir: Path, data_root: str | None
                    ) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """(variant, images, ground truths, predicted masks, the clients) of one run."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    config = parse_config(manifest["config"])
    seed = int(manifest["seed"])
    dataset, partition = prepare(config, data_root)[seed]
    shares = partition.test
    picks = [int(next((i for i in share if dataset.test_y[i].any()), share[0]))
             for share in shares]
    algorithm_class = ALGORITHMS[config.algorithm.name]
    if algorithm_class.pooled:
        partition = pooled(partition, len(dataset.test_y))
    context = run_context(config, dataset, seed, partition.num_clients)
    start = initial_weights(config, dataset, seed)
    runtime = ClientRuntime(context, ClientData(dataset.train_x, dataset.train_y,
                                                partition.train, start),
                            torch.device("cpu"))
    algorithm = algorithm_class(config.algorithm, context)
    final = read_final_models(run_dir)
    x = dataset.test_x[picks]
    masks = []
    for client in range(len(picks)):
        own = (algorithm.compose_personal(final.client_states.get(client),
                                          algorithm.personal_base(final.server_state))
               if algorithm_class.personalized else None)
        if own is not None:
            model = runtime.client_model(client)
            set_weights(model, own)
            masks.append(predict_proba(model, x[client:client + 1], runtime.info, 1,
                                       runtime.device)[0])
        else:
            evaluated = algorithm.evaluation_models(final.server_state)[""]
            predicted, _ = algorithm.predict(runtime, evaluated, x[client:client + 1],
                                             np.array([client]), 1)
            masks.append(predicted[0])
    variant = run_dir.parent.name
    return variant, x, dataset.test_y[picks], np.stack(masks), picks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_roots", type=Path, nargs="+",
                        help="invocation roots (or variant folders) whose runs kept their models")
    parser.add_argument("--data-root")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--csv", type=Path, required=True)
    parser.add_argument("--variants", nargs="*", help="variants in drawing order (default: all)")
    args = parser.parse_args()
    runs = sorted({p.parent for root in args.run_roots
                   for pattern in ("*/seed_0/final_models.npz", "seed_0/final_models.npz")
                   for p in root.glob(pattern)})
    if args.variants:
        order = {name: i for i, name in enumerate(args.variants)}
        runs = sorted((r for r in runs if r.parent.name in order),
                      key=lambda r: order[r.parent.name])
    rows, columns = [], []
    images = truths = None
    for run_dir in runs:
        variant, x, truth, masks, picks = predicted_masks(run_dir, args.data_root)
        images, truths = x, truth
        columns.append((variant, masks))
        scores = segmentation_scores(truth, masks)
        rows += [{"variant": variant, "client": c, "test_index": picks[c],
                  "dice": float(scores["dice"][c])} for c in range(len(picks))]
    if images is None or truths is None:
        raise SystemExit(f"no run under {', '.join(map(str, args.run_roots))} kept its final models "
                         "(evaluation.keep_models: true)")
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    draw(images, truths, columns, args.out)


def draw(images: np.ndarray, truths: np.ndarray, columns: list[tuple[str, np.ndarray]],
         out: Path) -> None:
    """A grid: a row per client (its image), a column per method's mask, then the truth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("image", None), *columns, ("ground truth", truths)]
    rows = len(images)
    figure, axes = plt.subplots(rows, len(panels), figsize=(1.6 * len(panels), 1.6 * rows),
                                squeeze=False)
    for row in range(rows):
        for column, (title, masks) in enumerate(panels):
            axis = axes[row][column]
            axis.imshow(images[row])
            if masks is not None:
                overlay = np.zeros((*masks[row].shape, 4))
                overlay[masks[row] > 0] = (0.1, 0.9, 0.2, 0.55)
                axis.imshow(overlay)
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title(title, fontsize=8)
            if column == 0:
                axis.set_ylabel(f"client {row}", fontsize=8)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)


if __name__ == "__main__":
    main()
