"""How much messenger (and local) information MH-pFLID's transmitter passes, per token design.

For each design (channel or spatial tokens, messenger input resized to 112 px or not, LayerNorm
on the tokens or not) builds a fresh messenger and transmitter (seed 0), a local model of the
given architecture, and probes the transmitter with 64 real images (raysim.models.messenger_
probes): the relative output change when the messenger's channels are permuted, and the number
of directions (singular values > 1 % of the largest) the output takes over messenger inputs
(local input fixed) and over local inputs (messenger input fixed). Prints one CSV row per design.

    python experiments/mhpflid/probe_tokens.py --data-root DIR \
        --architectures resnet17,vgg
"""

from __future__ import annotations

import argparse

import torch

from raysim.configuration.schema import DatasetConfig
from raysim.data import load_dataset, to_tensor
from raysim.models import MODELS, build_model
from raysim.models.messenger import InformationExchange, Messenger
from raysim.models.messenger_probes import probe_transmitter

DESIGNS = [  # (tokens, messenger input size, LayerNorm on tokens)
    ("channel", None, False), ("spatial", None, False), ("channel", 112, False),
    ("spatial", 112, False), ("spatial", None, True), ("spatial", 112, True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=None,
                        help="directory of the MedMNIST npz files (default: medmnist's)")
    parser.add_argument("--dataset", default="breastmnist")
    parser.add_argument("--architectures", default="resnet17,vgg")
    args = parser.parse_args()
    dataset = load_dataset(DatasetConfig(name=args.dataset, root=args.data_root, download=False),
                           args.data_root)
    info = dataset.info
    images = to_tensor(dataset.train_x[:64], info)
    print("architecture,tokens,messenger_input,layernorm,messenger_map,permutation_change,"
          "messenger_directions,local_directions,top_messenger_sv,top_local_sv")
    for architecture in args.architectures.split(","):
        torch.manual_seed(0)
        local = build_model(MODELS[architecture].params(), info).eval()
        with torch.no_grad():
            local_maps = local.body(images)
        for tokens, size, normalize in DESIGNS:
            torch.manual_seed(0)
            messenger = Messenger(info.input_shape[0], info.num_classes, input_size=size).eval()
            transmitter = InformationExchange(local.feature_channels, messenger.feature_channels,
                                              query_from="local", mode="attention",
                                              tokens=tokens, normalize=normalize)
            with torch.no_grad():
                messenger_maps = messenger.feature_map(images)
            probe = probe_transmitter(transmitter, local_maps, messenger_maps)
            grid = "x".join(map(str, messenger_maps.shape[2:]))
            print(f"{architecture},{tokens},{size or 'native'},{normalize},{grid},"
                  f"{probe.permutation_change:.3g},{probe.messenger_directions()},"
                  f"{probe.local_directions()},{probe.messenger_singular_values[0]:.3g},"
                  f"{probe.local_singular_values[0]:.3g}")


if __name__ == "__main__":
    main()
