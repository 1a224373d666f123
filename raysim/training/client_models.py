"""A worker's clients' models: one resident model per architecture on the worker's device
(weights are loaded into it for each client, never a model per client), each client's
architecture, and each architecture's initial weights."""

from __future__ import annotations

import torch
from torch import nn

from raysim.configuration.schema import StrictModel
from raysim.models import build_model
from raysim.seeding import torch_generator
from raysim.training.context import RunContext
from raysim.training.memory_format import M, place
from raysim.vectors.weights import Weights, get_weights


class ClientModels:
    """The clients' models on one worker (a part of
    :class:`~raysim.training.runtime.ClientRuntime`)."""

    def __init__(self, context: RunContext, initial_weights: Weights, device: torch.device):
        self.seed = context.seed
        self.info = context.info
        self.device = device
        self.initial_weights = initial_weights
        self.memory_format = context.memory_format
        """``engine.memory_format`` for the per-client path's models (see ``place``)."""
        self.architectures = context.architectures
        self._model_params = context.model
        self._models: dict[str, nn.Module] = {}
        self._initial: dict[str, Weights] = {context.model.model_dump_json(): initial_weights}

    @property
    def model(self) -> nn.Module:
        """The resident model of the run's configured architecture."""
        return self.model_for(self._model_params)

    def model_for(self, params: StrictModel) -> nn.Module:
        """The resident model for an architecture config, built on first use."""
        key = params.model_dump_json()
        if key not in self._models:
            self._models[key] = self.place(build_model(params, self.info))
        return self._models[key]

    def place(self, module: M) -> M:
        """A module moved to the worker's device in the run's memory format (for modules an
        algorithm builds beside the client models, e.g. MH-pFLID's messenger)."""
        return place(module, self.device, self.memory_format)

    def architecture(self, client: int) -> StrictModel:
        """A client's architecture (the configured model unless ``clients.architectures``)."""
        return self.architectures[client] if self.architectures else self._model_params

    def client_model(self, client: int) -> nn.Module:
        """The resident model of a client's architecture."""
        return self.model_for(self.architecture(client))

    def client_initial_weights(self, client: int) -> Weights:
        """The initial weights of a client's architecture: the run's initial model for the
        configured architecture, else drawn from the stream (seed, "init-<architecture>")."""
        params = self.architecture(client)
        key = params.model_dump_json()
        if key not in self._initial:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(torch_generator(self.seed, f"init-{key}").initial_seed())
                self._initial[key] = get_weights(build_model(params, self.info))
        return self._initial[key]

