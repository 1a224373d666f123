"""Probe: does one client's condensed set teach a model?

Condenses 600 real PneumoniaMNIST training images (drawn with the seed) with FedVCK (uniform
selection, no contrastive loss: the client side alone; p = 2 %, 64 real images per class per
step, image lr 0.2), trains a fresh ConvNet (BatchNorm) only on the uploaded uint8 images (300
epochs, SGD lr 0.01 momentum 0.9, lr x0.1 at half, one augmentation per batch) and prints the
final matching loss and the test accuracy and AUC as one CSV row.

    python experiments/fedvck/probe_condensation.py --mode single --iterations 300 \\
        --first-padding 3 --width 32 --seed 0 [--data-root DIR]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from raysim.algorithms.base import RunContext
from raysim.algorithms.fedvck import FedVCK, FedVCKParams
from raysim.condensation.augment import OPERATIONS
from raysim.condensation.synthetic import ServerTraining, train_on_synthetic
from raysim.configuration.schema import DatasetConfig, TrainingConfig
from raysim.data import load_dataset
from raysim.models import build_model
from raysim.models.convnet import ConvNetParams
from raysim.training.context import ClientData
from raysim.training.evaluation import classification_metrics, predict_proba
from raysim.training.runtime import ClientRuntime
from raysim.vectors.weights import get_weights, set_weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["single", "all"], default="single")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--first-padding", type=int, default=3)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-root", default=None,
                        help="directory of the MedMNIST npz files (default: medmnist's)")
    parser.add_argument("--header", action="store_true", help="print the CSV header first")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load_dataset(DatasetConfig(name="pneumoniamnist", root=args.data_root, download=False))
    picked = np.random.default_rng(args.seed).choice(len(data.train_y), 600, replace=False)
    model_params = ConvNetParams(width=args.width, depth=3, norm="batch",
                                 first_padding=args.first_padding)
    torch.manual_seed(args.seed)
    initial = get_weights(build_model(model_params, data.info))
    training = TrainingConfig(rounds=1)
    runtime = ClientRuntime(
        RunContext(args.seed, data.info, model_params, training, 1, 1),
        ClientData(data.train_x, data.train_y, [picked], initial),
        torch.device("cpu"))
    params = FedVCKParams(iterations=args.iterations, real_per_class=64, percent=2,
                          augmentation={"mode": args.mode}, selection="uniform",
                          contrastive=False)
    algorithm = FedVCK(params, RunContext(args.seed, data.info, model_params, training, 1, 1))
    started = time.time()
    result = algorithm.local_updates(runtime, [0], 0, {"model": initial}, [None])[0]
    seconds = time.time() - started
    model = build_model(model_params, data.info)
    set_weights(model, initial)
    train_on_synthetic(model, result.upload["synthetic"], result.upload["labels"], data.info,
                       ServerTraining(300, 0.01, 0.9, 0.0, 256, 0.1, OPERATIONS),
                       torch.Generator().manual_seed(0))
    metrics = classification_metrics(data.test_y, predict_proba(
        model, data.test_x, data.info, 512, torch.device("cpu")))
    if args.header:
        print("mode,iterations,first_padding,width,seed,matching_loss,synthetic_images,"
              "accuracy,auc,condense_seconds")
    print(f"{args.mode},{args.iterations},{args.first_padding},{args.width},{args.seed},"
          f"{result.metrics['matching_loss']:.2f},{len(result.upload['labels'])},"
          f"{metrics['accuracy']:.3f},{metrics['auc']:.3f},{seconds:.1f}", flush=True)


if __name__ == "__main__":
    main()
