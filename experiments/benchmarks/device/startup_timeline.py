"""The timeline of a cold ``raysim run`` of the pfl shape (issue #32, item 6): runs the command as
a new process, polls the process table every 50 ms and prints one JSON line per change of a
Ray process's title (the GCS, the raylet, a worker process starting, ``ray::IDLE`` once its
Python is up, then the actor method it runs), in seconds after the command, then the
manifest's start-up record. On a GPU the pfl shape with 4 x 0.25 GPU on a generated
50,000-image file; without one 2 workers on 100 clients. Run from the repository root:

    python3 experiments/benchmarks/device/startup_timeline.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fixtures import write_medmnist_npz
from gpu_startup import pfl_config

from raysim.engine.runner import startup_phases
from raysim.results.manifest import MANIFEST, read_manifest


def process_title(args: str) -> str | None:
    """A Ray process's title from its command line (None for other processes)."""
    if "ray::" in args:
        return args.split()[0][:40]
    for marker, title in (("raylet", "raylet"), ("gcs_server", "gcs"),
                          ("default_worker", "default_worker")):
        if marker in args:
            return title
    return None


def main() -> None:
    gpu = torch.cuda.is_available()
    scratch = Path(tempfile.mkdtemp())
    write_medmnist_npz(scratch / "data", "pathmnist", n_train=50_000 if gpu else 5_000,
                       n_test=200, channels=3, num_classes=9)
    config = pfl_config(scratch / "data", 3, gpu)
    if not gpu:
        config["partition"]["num_clients"] = 100
    (scratch / "config.yaml").write_text(yaml.safe_dump(config))
    started = time.time()
    command = subprocess.Popen(
        [sys.executable, "-m", "raysim.cli", "run", str(scratch / "config.yaml"), "--output",
         str(scratch / "out"), "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    titles: dict[int, str] = {}
    while command.poll() is None:
        table = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
        now = time.time() - started
        for line in table.splitlines():
            pid, _, args = line.strip().partition(" ")
            title = process_title(args)
            if title is not None and titles.get(int(pid)) != title:
                titles[int(pid)] = title
                print(json.dumps({"t": round(now, 2), "pid": int(pid), "title": title}))
        time.sleep(0.05)
    manifest = read_manifest(next((scratch / "out").rglob(MANIFEST)).parent)
    command_at = manifest["startup"]["command_at"]
    print(json.dumps({
        "phases": {k: round(v, 2) for k, v in (startup_phases(manifest) or {}).items()},
        "startup": {k: round(v - command_at, 2) for k, v in manifest["startup"].items()
                    if k.endswith("_at")},
        "workers_ready": round(manifest["workers_ready_at"] - command_at, 2),
        "first_dispatch": round(manifest["first_dispatch_at"] - command_at, 2),
        "command_started_after_t0": round(command_at - started, 2)}))
    assert command.stderr is not None
    print(command.stderr.read().decode()[-500:])


if __name__ == "__main__":
    main()
