"""A file format for run state that cannot run code when it is read.

A checkpoint (the server state and every client's persistent state) is a tree of plain values
(None, bool, int, float, str), lists, tuples, dicts, numpy arrays and scalars, torch tensors
and a few registered state classes (dataclasses such as SCAFFOLD's server state, and
FlatWeights). It is written as an uncompressed ``.npz``: every array is its own member, read
back with ``numpy.load(allow_pickle=False)``, and the tree itself is JSON in the member
``header``, with each array referred to by its member name and each object by its registered
class name. Reading a file therefore decodes JSON and raw numbers only: no pickle, no import,
and a class is rebuilt only if raysim registered it with :func:`persistable` (an allow-list),
from its fields.

The header names the format (``FORMAT``) and its version; :func:`read_state` checks both (and
that the file is a zip archive at all) before it decodes anything else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np

FORMAT = "raysim-state"
"""The ``format`` entry of every state file's header."""

HEADER = "header"
"""The member holding the JSON header (the tree, with arrays by member name)."""

ZIP_MAGIC = b"PK\x03\x04"
"""The first bytes of a zip archive (every ``.npz``)."""


class StateFileError(ValueError):
    """A state file that is not one raysim wrote, of another version, or damaged."""


T = TypeVar("T")

_CLASSES: dict[str, tuple[type, Callable[[Any], dict[str, Any]], Callable[[dict[str, Any]], Any]]] = {}
"""Registered classes by name: (class, its fields as a dict, the object from such a dict)."""


def persistable(cls: type[T] | None = None, *, name: str | None = None,
                to_fields: Callable[[Any], dict[str, Any]] | None = None,
                from_fields: Callable[[dict[str, Any]], Any] | None = None) -> Any:
    """Register a class whose instances may be stored in a state file (a decorator; used bare
    on a dataclass, whose fields are stored and passed back to its constructor). Other classes
    pass ``to_fields`` and ``from_fields``. ``name`` (default ``module.QualName``) is what the
    file records; reading accepts registered names only."""

    def register(target: type[T]) -> type[T]:
        key = name or f"{target.__module__}.{target.__qualname__}"
        if to_fields is None and not dataclasses.is_dataclass(target):
            raise TypeError(f"{key} is not a dataclass: pass to_fields and from_fields")
        encode = to_fields or (lambda value: {f.name: getattr(value, f.name)
                                              for f in dataclasses.fields(value)})
        decode = from_fields or (lambda fields: target(**fields))
        _CLASSES[key] = (target, encode, decode)
        return target

    return register(cls) if cls is not None else register


def _class_key(value: Any) -> str | None:
    for key, (cls, _, _) in _CLASSES.items():
        if type(value) is cls:
            return key
    return None


class _Encoder:
    """Turns a tree into JSON-able values, collecting its arrays."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def array(self, value: np.ndarray) -> str:
        if value.dtype.hasobject:
            raise TypeError("an object array cannot be stored in a state file")
        member = f"a{len(self.arrays)}"
        self.arrays[member] = value
        return member

    def encode(self, value: Any) -> Any:
        if value is None or type(value) in (bool, int, str):
            return value
        if type(value) is float:
            return value if np.isfinite(value) else {"float": repr(value)}
        if isinstance(value, np.ndarray):
            return {"array": self.array(value)}
        if isinstance(value, np.generic):
            return {"scalar": self.array(np.asarray(value))}
        if type(value).__module__.startswith("torch") and type(value).__name__ == "Tensor":
            return self.tensor(value)
        if type(value) is list:
            return [self.encode(item) for item in value]
        if type(value) is tuple:
            return {"tuple": [self.encode(item) for item in value]}
        if type(value) is dict:
            return {"dict": [[self.encode(k), self.encode(v)] for k, v in value.items()]}
        key = _class_key(value)
        if key is None:
            raise TypeError(
                f"a {type(value).__module__}.{type(value).__qualname__} cannot be stored in a "
                "state file: register its class with raysim.state_codec.persistable")
        fields = _CLASSES[key][1](value)
        return {"object": key, "fields": {k: self.encode(v) for k, v in fields.items()}}

    def tensor(self, value: Any) -> Any:
        import torch

        host = value.detach().cpu()
        if host.dtype == torch.bfloat16:  # numpy has no bfloat16: store its bits
            return {"tensor": self.array(host.view(torch.int16).numpy()), "bfloat16": True}
        return {"tensor": self.array(host.numpy())}


class _Decoder:
    """Rebuilds a tree from its JSON values and the archive's arrays."""

    def __init__(self, archive: Any, path: Path):
        self.archive = archive
        self.path = path

    def array(self, member: Any) -> np.ndarray:
        if not isinstance(member, str) or member == HEADER or member not in self.archive.files:
            raise StateFileError(f"its header names a missing array {member!r}")
        return self.archive[member]

    def decode(self, value: Any) -> Any:
        if value is None or type(value) in (bool, int, float, str):
            return value
        if type(value) is list:
            return [self.decode(item) for item in value]
        if type(value) is not dict or len(value) == 0:
            raise StateFileError(f"its header holds an unknown entry {str(value)[:80]!r}")
        if "float" in value:
            return float(value["float"])
        if "array" in value:
            return self.array(value["array"])
        if "scalar" in value:
            return self.array(value["scalar"])[()]
        if "tensor" in value:
            import torch

            tensor = torch.from_numpy(self.array(value["tensor"]))
            return tensor.view(torch.bfloat16) if value.get("bfloat16") else tensor
        if "tuple" in value:
            return tuple(self.decode(item) for item in value["tuple"])
        if "dict" in value:
            return {self.decode(k): self.decode(v) for k, v in value["dict"]}
        if "object" in value:
            key = value["object"]
            if key not in _CLASSES:
                raise StateFileError(f"it names a class raysim does not store, {key!r}")
            fields = {k: self.decode(v) for k, v in value.get("fields", {}).items()}
            return _CLASSES[key][2](fields)
        raise StateFileError(f"its header holds an unknown entry {str(value)[:80]!r}")


def write_state(file: IO[bytes], tree: Any, kind: str, version: int) -> None:
    """Write ``tree`` (the state of a ``kind`` file at ``version``) to the open binary
    ``file``; raises TypeError, naming the type, for a value the format cannot hold."""
    encoder = _Encoder()
    body = encoder.encode(tree)
    header = json.dumps({"format": FORMAT, "kind": kind, "version": version, "tree": body})
    members = {"header": np.frombuffer(header.encode(), dtype=np.uint8), **encoder.arrays}
    np.savez(file, **members)  # type: ignore[arg-type]  # (numpy's stub types ``allow_pickle``)


def save_state(path: Path, tree: Any, kind: str, version: int) -> Path:
    """Write ``tree`` to ``path`` atomically (a temporary file beside it, then a rename)."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    try:
        with open(temporary, "wb") as file:
            write_state(file, tree, kind, version)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        # a read-only or forbidden directory must not hide the error that brought us here
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise
    return path


def read_header(path: Path) -> dict[str, Any]:
    """The header of a state file (format, kind, version and the undecoded tree); raises
    StateFileError when the file is no raysim state file or cannot be read as one."""
    path = Path(path)
    with open(path, "rb") as file:
        if file.read(4) != ZIP_MAGIC:
            raise StateFileError("it is not a raysim state file (no zip archive)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            if HEADER not in archive.files:
                raise StateFileError("it is not a raysim state file (no header)")
            header = json.loads(archive[HEADER].tobytes().decode())
    except (zipfile.BadZipFile, ValueError, OSError, UnicodeDecodeError, EOFError) as error:
        if isinstance(error, StateFileError):
            raise
        raise StateFileError(f"it is damaged ({error})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise StateFileError("it is not a raysim state file (another format)")
    return header


def read_state(path: Path, kind: str, version: int) -> Any:
    """The tree stored in the ``kind`` file at ``path``; raises StateFileError (with the
    reason, not the path) when it is another kind or version, or is damaged."""
    header = read_header(path)
    if header.get("kind") != kind or header.get("version") != version:
        raise StateFileError(
            f"it holds a {header.get('kind')!r} state of version {header.get('version')!r}, "
            f"not a {kind!r} state of version {version}")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return _Decoder(archive, path).decode(header.get("tree"))
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, TypeError) as error:
        if isinstance(error, StateFileError):
            raise
        raise StateFileError(f"it is damaged ({error})") from None


__all__ = ["FORMAT", "StateFileError", "persistable", "read_header", "read_state",
           "save_state", "write_state"]
