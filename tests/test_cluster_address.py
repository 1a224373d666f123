"""Ray's conventions for where to run (issue #37, item 1): RAY_ADDRESS or engine.address joins
that cluster without passing local resources, `engine.address: local` forces a Ray of the
invocation's own, an unreachable address is one paragraph and exit 2, and a stale record of a
dead `ray start` cluster is ignored."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from raysim.engine import startup
from raysim.errors import ConfigError

TINY = {"name": "tiny", "dataset": {"name": "breast-cancer"},
        "partition": {"scheme": "iid", "num_clients": 4}, "model": {"name": "mlp", "hidden": [8]},
        "algorithm": {"name": "fedavg"}, "training": {"rounds": 2}, "seeds": [0],
        "engine": {"num_workers": 2}}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _raysim(tmp_path: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    return subprocess.run([sys.executable, "-m", "raysim.cli", "run", str(config), "--no-progress",
                           "--output", str(tmp_path / "out"), *extra],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


def test_an_unreachable_address_is_one_paragraph_and_exit_2(tmp_path):
    result = _raysim(tmp_path, {"RAY_ADDRESS": "127.0.0.1:1"})
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "Cannot join the Ray cluster at 127.0.0.1:1 (from RAY_ADDRESS)" in result.stderr
    assert "engine.address=local" in result.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.parquet"))


def test_address_resolution_follows_rays_conventions(tmp_path, monkeypatch):
    record = tmp_path / "ray_current_cluster"
    monkeypatch.setattr(startup, "RAY_CURRENT_CLUSTER", record)
    monkeypatch.setattr(startup, "running_cluster", lambda: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert startup.cluster_to_join(None) is None  # nothing recorded: a local Ray
    record.write_text(f"127.0.0.1:{_free_port()}")  # a dead cluster's record
    assert startup.cluster_to_join(None) is None
    with pytest.raises(ConfigError, match="no running Ray cluster"):
        startup.cluster_to_join("auto")
    with socket.socket() as live:  # something answers at the recorded address
        live.bind(("127.0.0.1", 0))
        live.listen()
        address = f"127.0.0.1:{live.getsockname()[1]}"
        record.write_text(address)
        assert startup.cluster_to_join(None)[0] == address
        assert startup.cluster_to_join("auto")[0] == address
        assert startup.cluster_to_join("local") is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert startup.cluster_to_join(None) == ("10.0.0.5:6379", "RAY_ADDRESS")
    assert startup.cluster_to_join("local") is None
    assert startup.cluster_to_join("10.0.0.6:6379") == ("10.0.0.6:6379", "engine.address")


def test_runs_join_the_cluster_ray_address_names_and_local_forces_their_own(tmp_path):
    port = _free_port()
    head = subprocess.Popen(
        ["ray", "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
         "--disable-usage-stats", "--block"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "RAY_AUTH_MODE": "token"})
    try:
        deadline = time.monotonic() + 120
        while not startup._answers(f"127.0.0.1:{port}"):
            assert time.monotonic() < deadline and head.poll() is None, "ray start failed"
            time.sleep(0.5)
        time.sleep(2)  # the raylet registers after the GCS answers
        joined = _raysim(tmp_path, {"RAY_ADDRESS": f"127.0.0.1:{port}"})
        assert joined.returncode == 0, joined.stderr[-3000:]
        assert f"Joined the Ray cluster at 127.0.0.1:{port} (RAY_ADDRESS)" in joined.stdout + \
            joined.stderr
        assert list((tmp_path / "out").rglob("rounds/part-*.parquet"))
        own = _raysim(tmp_path, {"RAY_ADDRESS": f"127.0.0.1:{port}"}, "--set",
                      "engine.address=local")
        assert own.returncode == 0, own.stderr[-3000:]
        assert "Joined the Ray cluster" not in own.stdout + own.stderr
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
