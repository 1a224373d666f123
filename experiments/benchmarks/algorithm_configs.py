"""One small configuration per registered algorithm (3 clients, 3 rounds, a generated
PneumoniaMNIST-layout file): the metrics fingerprint runs them, and the contract tests share
them (``tests/algorithm_configs.py``)."""

from __future__ import annotations

HETERO = {"clients": {"architectures": ["resnet5", "shufflenetv2"], "assign": "cycle"},
          "model": {"name": "resnet5"}}
CONFIGS: dict[str, dict] = {
    "fedavg": {},
    "fedprox": {"algorithm": {"name": "fedprox", "mu": 0.1}},
    "scaffold": {"algorithm": {"name": "scaffold"},
                 "training": {"rounds": 3, "batch_size": 16,
                              "optimizer": {"name": "sgd", "lr": 0.05}}},
    "ditto": {"algorithm": {"name": "ditto", "lam": 0.1}},
    "apfl": {"algorithm": {"name": "apfl", "alpha": 0.5}},
    "fedbn": {"algorithm": {"name": "fedbn"},
              "model": {"name": "convnet", "width": 8, "depth": 2, "norm": "batch"}},
    "fedrep": {"algorithm": {"name": "fedrep", "head_epochs": 1}},
    "lg_fedavg": {"algorithm": {"name": "lg_fedavg", "global_layers": 1}},
    "moon": {"algorithm": {"name": "moon", "mu": 1.0}},
    "fedmix": {"algorithm": {"name": "fedmix", "lam": 0.2, "mash_size": 8}},
    "fedgan": {"algorithm": {"name": "fedgan", "gan_steps": 3, "gan_batch_size": 8,
                             "gan_width": 4, "noise_dim": 8}},
    "fedgen": {"algorithm": {"name": "fedgen", "generator_steps": 5, "generator_hidden": 16,
                             "noise_dim": 8, "generator_batch_size": 8,
                             "generated_batch_size": 8}},
    "dfrd": {"algorithm": {"name": "dfrd", "server_iterations": 2, "distillation_steps": 2,
                           "batch_size": 8, "generator_width": 4, "noise_dim": 8}},
    "centralized": {},
    "local": HETERO,
    "feddc": {"algorithm": {"name": "feddc", "daisy_period": 1, "aggregation_period": 2}},
    "fedsm": {"algorithm": {"name": "fedsm", "gamma": 0.5},
              "partition": {"scheme": "iid", "num_clients": 3, "site_shift": {"strength": 1.0}}},
    "feddm": {"algorithm": {"name": "feddm", "iterations": 3, "real_per_class": 8,
                            "server_epochs": 1, "server_batch_size": 16},
              "model": {"name": "convnet", "width": 8, "depth": 2, "norm": "batch"}},
    "fedvck": {"algorithm": {"name": "fedvck", "iterations": 3, "real_per_class": 8,
                             "server_epochs": 1, "server_batch_size": 16, "hard_negatives": 1},
               "model": {"name": "convnet", "width": 8, "depth": 2, "norm": "batch"}},
    "desa": {"clients": {"architectures": [{"name": "convnet", "width": 8, "depth": 2},
                                           {"name": "convnet", "width": 6, "depth": 1}],
                         "assign": "cycle"},
             "algorithm": {"name": "desa", "images_per_class": 2, "iterations": 3,
                           "real_per_class": 8}},
    "mhpflid": {**HETERO, "algorithm": {"name": "mhpflid", "injection_epochs": 1,
                                        "distillation_epochs": 1,
                                        "messenger_widths": [8, 8, 16], "messenger_hidden": 8}},
    "fedmd": {**HETERO, "algorithm": {"name": "fedmd", "public_per_client": 4,
                                      "pretrain_epochs": 1}},
    "dspfl": {**HETERO, "algorithm": {"name": "dspfl", "public_per_client": 4,
                                      "pretrain_epochs": 1}},
    "ktpfl": {**HETERO, "algorithm": {"name": "ktpfl", "public_per_client": 4,
                                      "pretrain_epochs": 1}},
    "feddf": {**HETERO, "algorithm": {"name": "feddf", "public_per_client": 4,
                                      "distillation_steps": 3, "distillation_batch_size": 8}},
    "pfeddf": {**HETERO, "algorithm": {"name": "pfeddf", "public_per_client": 4,
                                       "distillation_steps": 3, "distillation_batch_size": 8}},
}


def contract_raw(root, name: str) -> dict:
    """A 3-client, 3-round config of algorithm ``name`` on the data under ``root``."""
    raw = {
        "name": f"contract-{name}",
        "dataset": {"name": "pneumoniamnist", "root": str(root), "download": False,
                    "verify_checksum": False},
        "partition": {"scheme": "iid", "num_clients": 3},
        "model": {"name": "convnet", "width": 8, "depth": 2},
        "algorithm": {"name": name},
        "training": {"rounds": 3, "batch_size": 16, "optimizer": {"name": "adam", "lr": 0.003}},
        "seeds": [0],
    }
    raw.update(CONFIGS[name])
    return raw
