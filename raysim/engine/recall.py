"""What a resume takes from a run root's record of its first command (``invocation.json``), and
what it never takes from it.

A results directory is something a lab shares and keeps for years, so whatever it names is data,
not an instruction: a resume recalls the options that choose *which* runs to continue and on
what data (``--variant``, ``--set``, ``--data-root``; a sweep's ``--grid`` and ``--seeds``),
prints them, and never imports, connects or logs to what the directory names:

- plug-ins are never recalled: the modules the record names must be the ones the user names
  again with ``--plugin`` (compared as names, before anything is imported), else the resume is
  refused with one paragraph;
- recalled ``--set`` overrides of ``engine.address`` (a cluster to connect to) and of the
  ``logging`` section (TensorBoard directories, MLflow tracking URIs) are dropped, with a line
  saying so: the user gives them again to use them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raysim.errors import ConfigError

NEVER_RECALLED = ("engine.address", "logging.")
"""Dotted keys (a trailing dot: a whole section) that a recalled ``--set`` may not set: where
a run connects and where it logs."""


@dataclass
class Recalled:
    """The options a resume takes from the record, and the overrides it left out."""

    options: dict[str, Any] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)

    def lines(self, root: str) -> list[str]:
        """What the resume says it recalled and left out, one line each."""
        said = []
        if self.options:
            shown = "; ".join(f"{_flag(name)} {_shown(value)}"
                              for name, value in self.options.items())
            said.append(f"resume: recalled from {root}'s first command: {shown}")
        if self.dropped:
            said.append(f"resume: not recalled (a results directory never chooses where a run "
                        f"connects or logs; give them again to use them): "
                        f"{', '.join('--set ' + item for item in self.dropped)}")
        return said


def recall(names: Sequence[str], given: Mapping[str, Any], stored: Mapping[str, Any],
           root: str) -> Recalled:
    """The options among ``names`` that the user did not give again (``given``) and the record
    (``stored``) holds. Raises :class:`ConfigError` when the record names plug-ins other than
    the ones the user names, before any of them is imported."""
    check_plugins(given.get("plugins") or [], stored.get("plugins") or [], root)
    recalled = Recalled()
    for name in names:
        if name == "plugins" or given.get(name) or not stored.get(name):
            continue
        value = stored[name]
        if name == "overrides":
            dropped = [item for item in value if _never_recalled(item)]
            recalled.dropped += dropped
            value = [item for item in value if item not in dropped]
            if not value:
                continue
        recalled.options[name] = value
    return recalled


def check_plugins(given: Sequence[str], recorded: Sequence[str], root: str) -> None:
    """Refuse a resume whose plug-ins (``--plugin``) differ from the ones the run root's first
    command named: a resume imports only modules the user names."""
    if not isinstance(recorded, list) or not all(isinstance(n, str) for n in recorded):
        raise ConfigError(
            f"Cannot resume {root}: its invocation.json records plug-ins as {recorded!r}, not "
            "a list of module names. Resume with the config and --plugin options of the "
            "original run; nothing was imported or written.")
    if set(given) != set(recorded):
        named = " ".join(f"--plugin {name}" for name in recorded) or "no --plugin"
        raise ConfigError(
            f"Cannot resume {root}: its first command was given {named}, and this one "
            f"{' '.join(f'--plugin {name}' for name in given) or 'no --plugin'}. A resume "
            "imports only the plug-ins you name, never those a results directory names: if "
            f"you trust those modules, resume with {named}; nothing was imported or written.")


def _never_recalled(override: Any) -> bool:
    key = str(override).split("=", 1)[0].strip()
    return any(key == prefix.rstrip(".") or (prefix.endswith(".") and key.startswith(prefix))
               for prefix in NEVER_RECALLED)


def _flag(name: str) -> str:
    return {"variants": "--variant", "overrides": "--set", "data_root": "--data-root",
            "grid": "--grid", "seeds": "--seeds"}.get(name, f"--{name}")


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


__all__ = ["NEVER_RECALLED", "Recalled", "check_plugins", "recall"]
