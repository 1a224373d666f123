"""Model weights as raysim's algorithms and its training layer exchange them.

Two forms, both read as a ``Mapping[str, numpy array]`` (:data:`Weights`):

- a plain ``dict[str, np.ndarray]``: what crosses Ray's object store (the round's broadcast,
  checkpoints, the server state); cheap to put there and zero-copy to read back;
- :class:`FlatWeights`: a model's float32 state as **one flat torch tensor on the worker's
  device** plus its layout, what the training layer returns for every trained client. Its
  reductions (:class:`~raysim.vectors.weighted_sum.WeightedSum`) and the vectorised trainer
  use the tensor directly, so a client's weights never leave the device unless an algorithm
  reads an entry as numpy (then the whole vector is copied to the host once, through
  :func:`to_host`) or the weights are pickled (into the object store or a checkpoint).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from raysim.state_codec import persistable

Weights = Mapping[str, np.ndarray]
"""A model's state by entry name (see the module docstring for its two forms)."""

Proximal = tuple[Weights, float]
"""A proximal term mu/2 ||w - anchor||^2 in the clients' local objective: (anchor, mu)."""


Layout = tuple[tuple[str, tuple[int, ...]], ...]
"""Names and shapes of the float32 entries held in a flat vector, in vector order."""
T = TypeVar("T")


def state_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state tensors (sharing storage with its parameters and buffers), cached on
    the model: building ``state_dict()`` anew costs more than copying a small model."""
    cached = model.__dict__.get("_raysim_state_tensors")
    if cached is None:
        cached = dict(model.state_dict())
        model.__dict__["_raysim_state_tensors"] = cached
    return cached


def to_host(tensor: torch.Tensor) -> np.ndarray:
    """The one place where weights on a device become host numpy (a copy for device tensors,
    a view of CPU tensors). Tests count its calls: a round converts a constant number of
    vectors per worker, not one per client."""
    return tensor.detach().cpu().numpy()


def get_weights(model: nn.Module) -> dict[str, np.ndarray]:
    """Copy a model's full state (parameters and buffers) to numpy arrays."""
    return {name: tensor.detach().cpu().numpy().copy()
            for name, tensor in state_tensors(model).items()}


# Arrays from Ray's object store are read-only; raysim never writes through tensors made from
# them, so torch's warning about that is silenced once here rather than per call (hot path).
warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                        category=UserWarning)


def as_tensor(array: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A CPU tensor sharing memory with ``array`` (also for read-only object-store arrays);
    tensors are returned as they are."""
    if isinstance(array, torch.Tensor):
        return array
    return torch.from_numpy(np.asarray(array))


def is_flat_dtype(dtype: Any) -> bool:
    """Whether entries of this (numpy or torch) dtype live in a flat float32 vector."""
    return dtype in (np.float32, torch.float32) or str(dtype) == "float32"


def layout_of(weights: Mapping[str, Any]) -> Layout:
    """The float32 entries of ``weights`` (state order) as a flat layout."""
    if isinstance(weights, FlatWeights):
        return weights.layout
    return tuple((name, tuple(value.shape)) for name, value in weights.items()
                 if is_flat_dtype(value.dtype))


def model_layout(model: nn.Module) -> Layout:
    """The flat layout of a model's float32 state (cached on the model, like its tensors)."""
    cached = model.__dict__.get("_raysim_layout")
    if cached is None:
        cached = model.__dict__["_raysim_layout"] = layout_of(state_tensors(model))
    return cached


def convert_once(weights: Sequence[Weights], convert: Callable[[Weights], T]) -> list[T]:
    """``convert`` applied to each distinct object of ``weights`` once (the broadcast that
    every client starts from is converted, e.g. put on the device, once); repeated objects
    give the same result object."""
    converted: dict[int, T] = {}
    for w in weights:
        if id(w) not in converted:
            converted[id(w)] = convert(w)
    return [converted[id(w)] for w in weights]


def flat_state(model: nn.Module) -> FlatWeights:
    """A copy of a model's state as :class:`FlatWeights` on the model's device (one copy of
    its flat vector where it has one, else one copy of each entry into a new vector; entries
    that are not float32, such as BatchNorm's batch counter, are copied to ``extras``)."""
    tensors = state_tensors(model)
    layout = model_layout(model)
    bound = bound_vector(model)
    with torch.no_grad():
        if bound is not None:
            vector = bound.clone()
        else:  # each entry copied once into its place (channels-last ones too, no reshape copy)
            first = next(iter(tensors.values()))
            vector = torch.empty(sum(math.prod(shape) for _, shape in layout),
                                 dtype=torch.float32, device=first.device)
            for name, (start, stop, shape) in _offsets(layout).items():
                vector[start:stop].view(shape).copy_(tensors[name])
    return FlatWeights(vector, layout, _extras(tensors))


RELEASE_MIN_VALUES = 1 << 18
"""Below this many values (1 MiB of float32) copying a model's vector costs less than binding
the model to a fresh one, and :func:`release_state` copies."""


def saves_a_pass(vector: object) -> bool:
    """Whether handing a model's vector over (:func:`release_state`) or writing its first step
    from the start (:class:`raysim.training.first_step.FirstStepFromStart`) is worth its
    rebinding of the model: for a vector of at least :data:`RELEASE_MIN_VALUES` values on a
    CPU, where the copy they save is a pass over memory. On a GPU that copy is one short
    kernel, while the rebinding is Python per parameter and the first step one kernel per
    parameter (in a profile of the pfl loop on an H200, about 0.5 ms of a client's 10 ms;
    taking them away showed no difference beyond that card's noise)."""
    return isinstance(vector, torch.Tensor) and vector.device.type == "cpu" \
        and vector.numel() >= RELEASE_MIN_VALUES


def release_state(model: nn.Module) -> FlatWeights:
    """The model's state as :class:`FlatWeights` without a copy: the flat vector its float32
    state is a view of is handed over, and the model is bound to a fresh **uninitialised**
    vector; call :func:`set_weights` before the model is used again. For a model whose state
    cannot be bound to a flat vector, or a small one (:data:`RELEASE_MIN_VALUES`), a copy
    (:func:`flat_state`); also one on a GPU (:func:`saves_a_pass`)."""
    vector = bound_vector(model)
    if vector is None or not saves_a_pass(vector):
        return flat_state(model)
    state = FlatWeights(vector, model_layout(model), _extras(state_tensors(model)))
    bind_vector(model, torch.empty_like(vector))
    return state


def _extras(tensors: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Copies of the state entries that are not float32 (kept beside the flat vector)."""
    return {name: tensor.detach().cpu().numpy().copy() for name, tensor in tensors.items()
            if not is_flat_dtype(tensor.dtype)}


BindPlan = tuple[tuple[nn.Module, str, bool], ...]
"""(module, attribute, is a parameter) of every float32 state entry, in layout order."""


def _bind_plan(model: nn.Module) -> BindPlan | None:
    """Where each float32 state entry lives, when the entries can be views of one flat vector
    (distinct tensors with contiguous strides; not channels-last weights), else None. Cached
    on the model."""
    if "_raysim_bind_plan" in model.__dict__:
        return model.__dict__["_raysim_bind_plan"]  # type: ignore[no-any-return]
    tensors = state_tensors(model)
    plan: list[tuple[nn.Module, str, bool]] = []
    storages = set()
    for name, _ in model_layout(model):
        tensor = tensors[name]
        module_name, _, attribute = name.rpartition(".")
        module = model.get_submodule(module_name)
        if tensor.stride() != _contiguous_strides(tensor.shape) \
                or (tensor.numel() and tensor.data_ptr() in storages) \
                or getattr(module, attribute, None) is None:
            plan = []
            break
        storages.add(tensor.data_ptr())
        plan.append((module, attribute, attribute in module._parameters))
    bind_plan = tuple(plan) if plan else None
    model.__dict__["_raysim_bind_plan"] = bind_plan
    return bind_plan


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape`` (a channels-last weight with one
    channel counts as contiguous to ``is_contiguous`` but not here: its strides steer the
    convolution's memory format)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def bound_vector(model: nn.Module) -> torch.Tensor | None:
    """The flat vector the model's float32 state is a view of (bound on first use, holding the
    model's current values), or None for a model whose state cannot be bound."""
    plan = _bind_plan(model)
    if plan is None:
        return None
    vector: torch.Tensor | None = model.__dict__.get("_raysim_flat")
    module, attribute, _ = plan[0]
    if vector is None or getattr(module, attribute).data_ptr() != vector.data_ptr():
        with torch.no_grad():  # (re)bind: first use, or the model was moved or copied
            vector = torch.cat([getattr(m, a).detach().reshape(-1) for m, a, _ in plan])
        bind_vector(model, vector)
    return vector


def bind_vector(model: nn.Module, vector: torch.Tensor) -> None:
    """Make the model's float32 parameters and buffers views of ``vector`` (layout order);
    the state-tensor cache follows."""
    plan = _bind_plan(model)
    assert plan is not None
    layout = model_layout(model)
    tensors = dict(state_tensors(model))
    for (name, (start, stop, shape)), (module, attribute, is_parameter) in zip(
            _offsets(layout).items(), plan, strict=True):
        view = vector[start:stop].view(shape)
        if is_parameter:
            module._parameters[attribute].data = view  # type: ignore[union-attr]
        else:
            module._buffers[attribute] = view
        tensors[name] = view
    model.__dict__["_raysim_state_tensors"] = tensors
    model.__dict__["_raysim_flat"] = vector


def parameter_views(model: nn.Module
                    ) -> tuple[tuple[nn.Parameter, tuple[int, int]], ...] | None:
    """Each float32 state entry's parameter and its [first, stop) in the model's flat vector
    (layout order), when the state can be bound to one vector and every float32 entry is a
    parameter; None for a model with float32 buffers (e.g. BatchNorm's running statistics).
    Cached on the model."""
    if "_raysim_parameter_views" in model.__dict__:
        return model.__dict__["_raysim_parameter_views"]  # type: ignore[no-any-return]
    plan = _bind_plan(model)
    views = None if plan is None or not all(is_parameter for _, _, is_parameter in plan) \
        else tuple((module._parameters[attribute], (first, stop))
                   for (module, attribute, _), (first, stop, _) in zip(
                       plan, _offsets(model_layout(model)).values(), strict=True))
    model.__dict__["_raysim_parameter_views"] = views
    return views  # type: ignore[return-value]


def on_device(weights: Weights, device: torch.device) -> FlatWeights:
    """``weights`` as FlatWeights whose vector is on ``device`` (no copy when it already is):
    one host-to-device copy of a broadcast, shared by every client that starts from it."""
    if isinstance(weights, FlatWeights) and isinstance(weights.vector, torch.Tensor) \
            and weights.vector.device == device:
        return weights
    layout = layout_of(weights)
    if isinstance(weights, FlatWeights):
        vector = as_tensor(weights.vector)
        extras = weights.extras
    else:
        vector = torch.cat([as_tensor(weights[name]).reshape(-1) for name, _ in layout]) \
            if layout else torch.zeros(0)
        extras = {name: np.asarray(value) for name, value in weights.items()
                  if not is_flat_dtype(value.dtype)}
    return FlatWeights(vector.to(device), layout, extras)


def set_weights(model: nn.Module, weights: Weights) -> None:
    """Load weights into a model in place (copied onto the model's device; from a device
    FlatWeights without passing through the host, in one copy into the model's flat vector
    where the layouts agree)."""
    vector = bound_vector(model)
    if vector is not None and isinstance(weights, FlatWeights) \
            and weights.layout == model_layout(model):
        tensors = state_tensors(model)
        with torch.no_grad():
            vector.copy_(as_tensor(weights.vector))
            for name, value in weights.extras.items():
                tensors[name].copy_(as_tensor(value))
        return
    source = weights.tensors() if isinstance(weights, FlatWeights) else weights
    with torch.no_grad():
        for name, tensor in state_tensors(model).items():
            tensor.copy_(as_tensor(source[name]))


_SCALARS = (int, float, bool, np.int64, np.float64)


def payload_bytes(payload: Any) -> int:
    """Bytes a payload would take on the wire: array data, recursively; 8 bytes per scalar;
    an object's own ``wire_bytes`` where it says (e.g. a compressed update)."""
    if isinstance(payload, np.ndarray):
        return int(payload.nbytes)
    if isinstance(payload, FlatWeights):
        return payload.nbytes
    if isinstance(payload, torch.Tensor):
        return int(payload.numel() * payload.element_size())
    if isinstance(payload, Mapping):
        values = payload.values()
        if all(isinstance(value, np.ndarray) for value in values):
            return sum(value.nbytes for value in values)
        return sum(payload_bytes(value) for value in values)
    if isinstance(payload, (list, tuple)):
        if all(type(value) in _SCALARS for value in payload):
            return 8 * len(payload)
        return sum(payload_bytes(value) for value in payload)
    if payload is None:
        return 0
    wire_bytes = getattr(payload, "wire_bytes", None)
    return wire_bytes if isinstance(wire_bytes, int) else 8


class FlatWeights(Mapping):
    """A model's float32 state as one flat vector (a torch tensor on the worker's device, or a
    numpy array after crossing the object store) plus its layout; other entries in
    ``extras``. Read as a Weights mapping: the first numpy read of an entry copies the whole
    vector to the host once (:func:`to_host`); reductions and the trainers use ``vector``.

    Pickling (Ray's object store, checkpoints) sends the vector as host numpy, so a worker's
    partial or a relayed client state never carries a device tensor.
    """

    __slots__ = ("_host", "extras", "layout", "vector")

    def __init__(self, vector: torch.Tensor | np.ndarray, layout: Layout,
                 extras: Mapping[str, np.ndarray] | None = None):
        self.vector = vector
        self.layout = layout
        self.extras = dict(extras or {})
        self._host: np.ndarray | None = vector if isinstance(vector, np.ndarray) else None

    @property
    def host_vector(self) -> np.ndarray:
        """The vector as host numpy (copied from the device once, then cached)."""
        if self._host is None:
            assert isinstance(self.vector, torch.Tensor)
            self._host = to_host(self.vector)
        return self._host

    @property
    def nbytes(self) -> int:
        """Bytes of the state (vector and extras)."""
        vector = (self.vector.numel() * self.vector.element_size()
                  if isinstance(self.vector, torch.Tensor) else self.vector.nbytes)
        return int(vector) + sum(int(v.nbytes) for v in self.extras.values())

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every entry as a tensor: views of the vector (on its device) and the extras."""
        vector = as_tensor(self.vector)
        views = {name: vector[start:stop].view(shape)
                 for name, (start, stop, shape) in _offsets(self.layout).items()}
        return {**views, **{name: as_tensor(value) for name, value in self.extras.items()}}

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.extras:
            return self.extras[name]
        start, stop, shape = _offsets(self.layout)[name]
        return self.host_vector[start:stop].reshape(shape)

    def __iter__(self) -> Iterator[str]:
        yield from (name for name, _ in self.layout)
        yield from self.extras

    def __len__(self) -> int:
        return len(self.layout) + len(self.extras)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FlatWeights, (self.host_vector, self.layout, self.extras))


persistable(FlatWeights, name="raysim.FlatWeights",
            to_fields=lambda w: {"vector": w.host_vector, "layout": w.layout, "extras": w.extras},
            from_fields=lambda fields: FlatWeights(**fields))


@functools.lru_cache(maxsize=64)
def _offsets(layout: Layout) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    offsets, position = {}, 0
    for name, shape in layout:
        size = math.prod(shape)
        offsets[name] = (position, position + size, shape)
        position += size
    return offsets


def flat_tensor(weights: Weights, layout: Layout, device: torch.device) -> torch.Tensor:
    """The flat float32 vector of ``weights`` in ``layout`` order on ``device`` (no copy for
    FlatWeights already there)."""
    if isinstance(weights, FlatWeights) and weights.layout == layout:
        return as_tensor(weights.vector).to(device)
    return on_device({name: weights[name] for name, _ in layout}, device).vector  # type: ignore[return-value]


def host_tree(value: Any) -> Any:
    """``value`` with every torch tensor inside (dicts, lists, tuples) moved to the CPU, for
    client states that leave their worker (relayed, checkpointed, or kept off the device);
    FlatWeights become numpy-backed."""
    if isinstance(value, FlatWeights):
        if isinstance(value.vector, np.ndarray):
            return value
        return FlatWeights(value.host_vector, value.layout, value.extras)
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: host_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(host_tree(v) for v in value)
    return value
