"""What raysim's speed is measured against, in this process on one device: for each method, a
plain PyTorch loop (written as a researcher would write it) and, for FedAvg and FedDC, the
on-device reference (the fastest way we know to run the same round in one process). Each
returns steady rounds per second after one warm-up round.

- FedAvg plain loop: one model; per sampled client the global weights copied in, one fresh
  SGD, the local steps, the client's state added in place to a float64 sum; the mean is the
  next global.
- FedAvg reference: every sampled client's weights as rows on the device, all clients of a
  round in one ``torch.func`` vmap call per step, the new global the mean of the rows.
- FedDC plain loop: every client's model a state dict on the device, loaded into one model,
  one SGD step, stored back; permuted every ``daisy_period`` rounds, averaged every
  ``aggregation_period``. Reference: parameters and float buffers as rows of two matrices, each
  client trained on views of its rows, daisy-chaining by a row gather, averaging by a row mean.
- FedVCK plain loop: each client's condensation (distribution matching with the siamese
  augmentation and the latent constraint; uniform selection, no contrastive loss) then the
  server's epochs on every synthetic set so far.
- MH-pFLID plain loop: per client its local model, receiver, transmitter and both Adam
  optimizers, injection then distillation epochs with the same losses on raysim's modules,
  then messenger averaging.

Every function takes the workload (``workloads.Workload``), the raysim config it runs as (its
dataset section says where the data is), the rounds and the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from workloads import Workload

from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import DatasetConfig
from raysim.data import load_dataset, to_tensor
from raysim.models import MODELS, build_model

Rate = Callable[[Workload, dict, int, torch.device], float]


def rounds_per_second(one_round: Callable[[], None], rounds: int,
                      device: torch.device) -> float:
    """Rounds per second of ``one_round`` after one warm-up round (kernels, allocator)."""
    one_round()
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(rounds):
        one_round()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return rounds / (time.perf_counter() - started)


def client_tensors(spec: Workload, raw: dict, device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.nn.Module]:
    """Every client's samples as (clients, samples, ...) tensors on ``device`` (a random
    split of the training set) and the workload's model there."""
    data = load_dataset(DatasetConfig(**raw["dataset"]))
    order = np.random.default_rng(0).permutation(len(data.train_y))[
        : spec.clients * spec.samples]
    x = to_tensor(data.train_x[order], data.info).to(device)
    x = x.reshape(spec.clients, spec.samples, *x.shape[1:])
    y = torch.from_numpy(data.train_y[order]).to(device).reshape(spec.clients, -1)
    torch.manual_seed(0)
    model = build_model(MODELS[spec.model["name"]].params(**spec.model), data.info)
    return x, y, model.to(device)


def _steps(spec: Workload) -> int:
    return spec.steps or spec.samples // spec.batch


def fedavg_plain_loop(spec: Workload, raw: dict, rounds: int, device: torch.device) -> float:
    """Rounds per second of the plain FedAvg loop (module docstring)."""
    x, y, model = client_tensors(spec, raw, device)
    rng = np.random.default_rng(0)
    state = dict(model.state_dict())
    global_state = {k: v.clone() for k, v in state.items()}
    per_round = spec.per_round or spec.clients

    def one_round() -> None:
        total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}
        for client in rng.choice(spec.clients, per_round, replace=False):
            with torch.no_grad():
                for k, v in state.items():
                    v.copy_(global_state[k])
            optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr)
            order = torch.randperm(spec.samples, device=device)
            for step in range(_steps(spec)):
                batch = order[step * spec.batch:(step + 1) * spec.batch]
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(model(x[client, batch]), y[client, batch]).backward()
                optimizer.step()
            for k, v in state.items():
                total[k].add_(v)
        for k in global_state:
            global_state[k] = (total[k] / per_round).to(global_state[k].dtype)

    return rounds_per_second(one_round, rounds, device)


def fedavg_reference(spec: Workload, raw: dict, rounds: int, device: torch.device) -> float:
    """Rounds per second of the on-device FedAvg reference (module docstring)."""
    from torch.func import functional_call, grad, vmap

    x, y, model = client_tensors(spec, raw, device)
    global_params = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    per_round = spec.per_round or spec.clients
    generator = torch.Generator(device=device).manual_seed(0)

    def client_loss(params: dict, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, (params, buffers), (xb,)), yb)

    step = vmap(grad(client_loss), in_dims=(0, 0, 0))

    def one_round() -> None:
        sampled = torch.randperm(spec.clients, device=device, generator=generator)[:per_round]
        params = {k: v.unsqueeze(0).repeat(per_round, *[1] * v.ndim)
                  for k, v in global_params.items()}
        orders = torch.argsort(torch.rand(per_round, spec.samples, device=device,
                                          generator=generator), dim=1)
        rows = sampled[:, None]
        for k in range(_steps(spec)):
            batch = orders[:, k * spec.batch:(k + 1) * spec.batch]
            grads = step(params, x[rows, batch], y[rows, batch])
            with torch.no_grad():
                for name in params:
                    params[name].sub_(spec.lr * grads[name])
        for name in global_params:
            global_params[name] = params[name].mean(0)

    return rounds_per_second(one_round, rounds, device)


def feddc_plain_loop(spec: Workload, raw: dict, rounds: int, device: torch.device) -> float:
    """Rounds per second of the plain FedDC loop (module docstring)."""
    x, y, model = client_tensors(spec, raw, device)
    algorithm, clients = spec.algorithm, spec.clients
    states = [{k: v.clone() for k, v in model.state_dict().items()} for _ in range(clients)]
    generator = torch.Generator(device="cpu").manual_seed(0)
    done = [0]

    def one_round() -> None:
        for client in range(clients):
            model.load_state_dict(states[client])
            model.train()
            optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr)
            batch = torch.randperm(spec.samples, generator=generator)[:spec.batch]
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[client, batch]), y[client, batch]).backward()
            optimizer.step()
            states[client] = {k: v.clone() for k, v in model.state_dict().items()}
        done[0] += 1
        if done[0] % algorithm["aggregation_period"] == 0:
            mean = {k: torch.stack([s[k].double() for s in states]).mean(0).to(v.dtype)
                    for k, v in states[0].items()}
            states[:] = [{k: v.clone() for k, v in mean.items()} for _ in range(clients)]
        elif done[0] % algorithm["daisy_period"] == 0:
            order = torch.randperm(clients, generator=generator).tolist()
            states[:] = [states[i] for i in order]

    return rounds_per_second(one_round, rounds, device)


def feddc_reference(spec: Workload, raw: dict, rounds: int, device: torch.device) -> float:
    """Rounds per second of the on-device FedDC reference (module docstring)."""
    from torch.func import functional_call

    x, y, model = client_tensors(spec, raw, device)
    algorithm, clients = spec.algorithm, spec.clients
    names = [k for k, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    float_buffers = [(k, b.shape) for k, b in model.named_buffers() if b.is_floating_point()]
    other_buffers = {k: b for k, b in model.named_buffers() if not b.is_floating_point()}
    theta = torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])
    theta = theta.unsqueeze(0).repeat(clients, 1).contiguous()
    state = torch.cat([model.get_buffer(k).reshape(-1) for k, _ in float_buffers]
                      or [torch.zeros(0, device=device)])
    state = state.unsqueeze(0).repeat(clients, 1).contiguous()
    generator = torch.Generator(device="cpu").manual_seed(0)
    done = [0]

    def views(row: torch.Tensor, layout: list[tuple[str, torch.Size]]) -> dict[str, torch.Tensor]:
        out, start = {}, 0
        for name, shape in layout:
            size = int(np.prod(shape))
            out[name] = row[start:start + size].view(shape)
            start += size
        return out

    model.train()

    def one_round() -> None:
        nonlocal theta, state
        for client in range(clients):
            params = {k: v.requires_grad_() for k, v in views(
                theta[client].detach(), list(zip(names, shapes, strict=True))).items()}
            buffers = {**views(state[client], float_buffers), **other_buffers}
            batch = torch.randperm(spec.samples, generator=generator)[:spec.batch]
            loss = F.cross_entropy(
                functional_call(model, (params, buffers), (x[client, batch],)), y[client, batch])
            grads = torch.autograd.grad(loss, list(params.values()))
            with torch.no_grad():
                theta[client].sub_(spec.lr * torch.cat([g.reshape(-1) for g in grads]))
        done[0] += 1
        if done[0] % algorithm["aggregation_period"] == 0:
            theta[:] = theta.double().mean(0).to(theta.dtype)
            state[:] = state.double().mean(0).to(state.dtype)
        elif done[0] % algorithm["daisy_period"] == 0:
            order = torch.randperm(clients, generator=generator).to(device)
            theta, state = theta[order], state[order]

    return rounds_per_second(one_round, rounds, device)


def fedvck_plain_loop(spec: Workload, raw: dict, rounds: int, device: torch.device) -> float:
    """Rounds per second of the plain FedVCK loop (module docstring), on the CPU."""
    from raysim.condensation.augment import augment
    from raysim.condensation.synthetic import to_uint8
    from raysim.data.partition import make_partition

    parsed = parse_config(raw)
    algorithm = parsed.algorithm
    real_per_class = algorithm.real_per_class  # type: ignore[union-attr]
    dataset = load_dataset(parsed.dataset)
    info = dataset.info
    partition = make_partition(dataset.train_y, dataset.test_y, parsed.partition,
                               info.num_classes, 0)
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    model = build_model(parsed.model, info)
    clients = []  # (class -> real indices, class -> synthetic images)
    for indices in partition.train:
        labels = dataset.train_y[indices]
        counts = np.bincount(labels, minlength=info.num_classes)
        sizes = {c: max(5, int(np.ceil(0.01 * n))) for c, n in enumerate(counts) if n >= 10}
        clients.append(({c: indices[labels == c] for c in sizes},
                        {c: torch.randn((n, *info.input_shape)) for c, n in sizes.items()}))
    buffer_x: list[np.ndarray] = []
    buffer_y: list[np.ndarray] = []

    def condense(by_class: dict, synthetic: dict) -> None:
        classes = sorted(synthetic)
        images = [synthetic[c].requires_grad_(True) for c in classes]
        optimizer = torch.optim.SGD(images, lr=algorithm.image_lr,  # type: ignore[union-attr]
                                    momentum=algorithm.momentum)  # type: ignore[union-attr]
        for _ in range(algorithm.iterations):  # type: ignore[union-attr]
            picks = [by_class[c] if len(by_class[c]) <= real_per_class else
                     rng.choice(by_class[c], real_per_class, replace=False) for c in classes]
            seed = int(rng.integers(0, 2**62))
            real = augment(to_tensor(dataset.train_x[np.concatenate(picks)], info), seed)
            syn = augment(torch.cat(images), seed)
            model.train()
            with torch.no_grad():
                real_embedding = model.embed(real)
            model.eval()
            syn_embedding = model.embed(syn)
            loss = sum(((r.mean(0) - s.mean(0)) ** 2).sum() for r, s in zip(
                real_embedding.split([len(p) for p in picks]),
                syn_embedding.split([len(s) for s in images]), strict=True))
            optimizer.zero_grad()
            loss.backward()  # type: ignore[union-attr]
            torch.nn.utils.clip_grad_norm_(images, 10.0)
            optimizer.step()
        buffer_x.append(to_uint8(torch.cat(images), info))
        buffer_y.append(np.repeat(classes, [len(s) for s in images]))
        for c, image in zip(classes, images, strict=True):
            synthetic[c] = image.detach()

    def one_round() -> None:
        model.requires_grad_(False)
        for by_class, synthetic in clients:
            if synthetic:
                condense(by_class, synthetic)
        model.requires_grad_(True)
        model.train()
        x = to_tensor(np.concatenate(buffer_x), info)
        y = torch.from_numpy(np.concatenate(buffer_y))
        optimizer = torch.optim.SGD(model.parameters(), lr=algorithm.server_lr,  # type: ignore[union-attr]
                                    momentum=0.9, weight_decay=1e-6)
        epochs = algorithm.server_epochs  # type: ignore[union-attr]
        for epoch in range(epochs):
            if epoch == epochs // 2:  # the authors' StepLR
                for group in optimizer.param_groups:
                    group["lr"] *= 0.1
            for batch in torch.randperm(len(y)).split(256):
                inputs = augment(x[batch], int(rng.integers(0, 2**62)))  # one op per batch
                loss = F.cross_entropy(model(inputs), y[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

    return rounds_per_second(one_round, rounds, torch.device("cpu"))


def mhpflid_plain_loop(spec: Workload, raw: dict, rounds: int, device: torch.device) -> float:
    """Rounds per second of the plain MH-pFLID loop (module docstring), on the CPU."""
    from raysim.algorithms.mhpflid import MHpFLIDParams
    from raysim.models.messenger import InformationExchange, Messenger

    parsed = parse_config(raw)
    dataset = load_dataset(parsed.dataset)
    info = dataset.info
    architectures = raw["clients"]["architectures"]
    count, per_client, batch_size = len(architectures), spec.samples, spec.batch
    rng = np.random.default_rng(0)
    chosen = rng.permutation(len(dataset.train_y))[: count * per_client].reshape(count, -1)
    xs = [to_tensor(dataset.train_x[c], info) for c in chosen]
    ys = [torch.from_numpy(dataset.train_y[c]) for c in chosen]
    torch.manual_seed(0)
    locals_ = [build_model(MODELS[a].params(), info) for a in architectures]
    p = MHpFLIDParams()
    global_messenger = Messenger(info.input_shape[0], info.num_classes,
                                 input_size=p.messenger_input_size)
    messengers = [Messenger(info.input_shape[0], info.num_classes,
                            input_size=p.messenger_input_size) for _ in architectures]
    receivers = [InformationExchange(m.feature_channels, 512, query_from="messenger",
                                     mode="attention") for m in locals_]
    transmitters = [InformationExchange(m.feature_channels, 512, query_from="local",
                                        mode="attention") for m in locals_]
    injection = [torch.optim.Adam([*m.parameters(), *r.parameters()], lr=p.injection_lr)
                 for m, r in zip(locals_, receivers, strict=True)]
    distillation = [torch.optim.Adam([*m.parameters(), *t.parameters()], lr=p.distillation_lr)
                    for m, t in zip(messengers, transmitters, strict=True)]

    def step(i: int, stage: str, x: torch.Tensor, y: torch.Tensor) -> None:
        local, messenger = locals_[i], messengers[i]
        if stage == "inject":
            features = local.body(x)
            with torch.no_grad():
                mes = messenger.feature_map(x)
            loss = 0.9 * F.cross_entropy(local.head(features), y) + 0.1 * (
                F.cross_entropy(messenger.head(receivers[i](features, mes)), y))
            optimizer = injection[i]
        else:
            with torch.no_grad():
                features = local.body(x)
                target = F.log_softmax(local.head(features), 1)
            logits = messenger.head(transmitters[i](features, messenger.feature_map(x)))
            loss = 0.9 * F.cross_entropy(logits, y) + 0.1 * F.kl_div(
                F.log_softmax(logits, 1), target, reduction="batchmean", log_target=True)
            optimizer = distillation[i]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def one_round() -> None:
        for i in range(count):
            local, messenger = locals_[i], messengers[i]
            messenger.load_state_dict(global_messenger.state_dict())
            for stage, epochs in (("inject", p.injection_epochs),
                                  ("distill", p.distillation_epochs)):
                messenger.requires_grad_(stage == "distill")  # the frozen side takes no grads
                local.requires_grad_(stage == "inject")
                local.train(stage == "inject")
                messenger.train(stage == "distill")
                for _ in range(epochs):
                    for batch in torch.randperm(per_client).split(batch_size):
                        step(i, stage, xs[i][batch], ys[i][batch])
        with torch.no_grad():
            states = [m.state_dict() for m in messengers]
            global_messenger.load_state_dict(
                {k: torch.stack([s[k].double() for s in states]).mean(0).to(states[0][k].dtype)
                 for k in states[0]})

    return rounds_per_second(one_round, rounds, torch.device("cpu"))


BASELINES: dict[str, tuple[Rate, Rate | None]] = {
    "fedavg": (fedavg_plain_loop, fedavg_reference),
    "feddc": (feddc_plain_loop, feddc_reference),
    "fedvck": (fedvck_plain_loop, None),
    "mhpflid": (mhpflid_plain_loop, None),
}
"""Each method's plain loop and on-device reference (None: none written)."""
