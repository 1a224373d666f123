"""The final models of a run (``evaluation.keep_models``): after the last round the server
state and every client's state are written to ``final_models.npz`` in the run directory, a
state file like a checkpoint's, which :func:`read_final_models` reads back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raysim.errors import ConfigError
from raysim.rounds.round_loop import RoundCallback, RoundLoop, RoundOutcome
from raysim.state_codec import StateFileError, read_state, save_state

FINAL_MODELS_FILE = Path("final_models.npz")
_KIND = "final-models"
_FORMAT = 1


@dataclass
class FinalModels:
    """The states after a run's last round."""

    seed: int
    rounds: int
    server_state: Any
    client_states: dict[int, Any]


class KeepFinalModels(RoundCallback):
    """After the last of ``rounds`` rounds (workers idle), gather every client state and
    write :class:`FinalModels` to the run directory."""

    def __init__(self, rounds: int, run_dir: Path, seed: int):
        self.rounds, self.run_dir, self.seed = rounds, Path(run_dir), seed

    def needs_idle_workers(self, outcome: RoundOutcome) -> bool:
        return not outcome.replay and outcome.round + 1 >= self.rounds

    def with_idle_workers(self, loop: RoundLoop, outcome: RoundOutcome) -> None:
        client_states = loop.workers.snapshot_states() if loop.progress.stateful else {}
        final = FinalModels(self.seed, outcome.round + 1, outcome.state, client_states)
        save_state(self.run_dir / FINAL_MODELS_FILE, dict(final.__dict__), _KIND, _FORMAT)


def read_final_models(run_dir: str | Path) -> FinalModels:
    """The final models a run kept (``evaluation.keep_models: true``); one paragraph when it
    kept none or the file is damaged."""
    path = Path(run_dir) / FINAL_MODELS_FILE
    if not path.is_file():
        raise ConfigError(
            f"No final models in {run_dir}: {FINAL_MODELS_FILE} is written only by runs with "
            "evaluation.keep_models: true that completed. Rerun with `--set "
            "evaluation.keep_models=true`.")
    try:
        return FinalModels(**read_state(path, _KIND, _FORMAT))
    except (StateFileError, TypeError) as error:
        raise ConfigError(f"The final models in {path} cannot be read ({error}); rerun the "
                          "run with evaluation.keep_models: true.") from None
