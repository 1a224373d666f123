"""Ray's conventions for where to run: RAY_ADDRESS or engine.address joins that cluster
without passing local resources, `engine.address: local` forces a Ray of the invocation's own,
an address where no Ray GCS answers is one paragraph and exit 2 within the probe's bound, and
a `ray start` record counts only when its GCS answers (a dead cluster's record, or one whose
port another program took, is ignored with a notice)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from conftest import CLUSTER_TESTS, answer_ctrl_c

from raysim.engine.launch import cluster_probe
from raysim.engine.launch import local_ray as startup
from raysim.engine.launch.cluster_probe import accepts_connections
from raysim.engine.launch.watchdog import descendants
from raysim.errors import ConfigError

pytestmark = CLUSTER_TESTS

TINY = {"name": "tiny", "dataset": {"name": "breast-cancer"},
        "partition": {"scheme": "iid", "num_clients": 4}, "model": {"name": "mlp", "hidden": [8]},
        "algorithm": {"name": "fedavg"}, "training": {"rounds": 2}, "seeds": [0],
        "engine": {"num_workers": 2}}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _command(tmp_path: Path, *extra: str) -> list[str]:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    return [sys.executable, "-m", "raysim.cli", "run", str(config), "--no-progress", "--output",
            str(tmp_path / "out"), *extra]


def _raysim(tmp_path: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(_command(tmp_path, *extra), env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def stale_record():
    """Environments whose Ray directory holds a `ray start` record naming an address (removed
    after the test, as `ray stop` would)."""
    made: list[Path] = []

    def environment(address: str) -> dict[str, str]:
        ray_dir = Path(tempfile.mkdtemp(prefix="r-", dir=os.environ["RAY_TMPDIR"]))
        made.append(ray_dir)
        (ray_dir / "ray").mkdir()
        (ray_dir / "ray" / "ray_current_cluster").write_text(address)
        return {"RAY_TMPDIR": str(ray_dir), "RAY_ADDRESS": ""}

    yield environment
    for ray_dir in made:
        shutil.rmtree(ray_dir, ignore_errors=True)


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
    monkeypatch.setenv("RAYSIM_PROBE_SECONDS", "3")
    assert startup.cluster_to_join(None) is None  # nothing recorded: a local Ray
    record.write_text(f"127.0.0.1:{_free_port()}")  # a dead cluster's record
    notices: list[str] = []
    assert startup.cluster_to_join(None, notices) is None
    assert len(notices) == 1 and f"Ignored {record}" in notices[0]
    with pytest.raises(ConfigError, match="no running Ray cluster"):
        startup.cluster_to_join("auto")
    with socket.socket() as other:  # another program took the recorded port: not a cluster
        other.bind(("127.0.0.1", 0))
        other.listen()
        record.write_text(f"127.0.0.1:{other.getsockname()[1]}")
        began = time.monotonic()
        notices = []
        assert startup.cluster_to_join(None, notices) is None
        assert time.monotonic() - began < 3.0 + 5
        assert "does not answer" in notices[0]
        monkeypatch.setattr(startup, "gcs_answers", lambda address: True)  # a live GCS there
        assert startup.cluster_to_join(None)[0] == record.read_text()
        assert startup.cluster_to_join("auto")[0] == record.read_text()
        assert startup.cluster_to_join("local") is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert startup.cluster_to_join(None) == ("10.0.0.5:6379", "RAY_ADDRESS")
    assert startup.cluster_to_join("local") is None
    assert startup.cluster_to_join("10.0.0.6:6379") == ("10.0.0.6:6379", "engine.address")


def test_a_stale_record_on_a_port_another_program_holds_is_ignored(tmp_path, stale_record):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(64)
        address = f"127.0.0.1:{other.getsockname()[1]}"
        began = time.monotonic()
        quick = {"RAYSIM_PROBE_SECONDS": "3"}  # (the default 10 s, shortened for the suite)
        result = _raysim(tmp_path, {**stale_record(address), **quick})
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"names a Ray cluster at {address} that does not answer" in result.stderr
        assert list((tmp_path / "out").rglob("rounds/part-*.parquet"))
        assert time.monotonic() - began < 240
        joined = _raysim(tmp_path, {"RAY_ADDRESS": address, **quick})  # the user's: exit 2
        assert joined.returncode == 2, joined.stderr[-2000:]
        assert "Traceback" not in joined.stderr
        assert f"Cannot join the Ray cluster at {address} (from RAY_ADDRESS): something " \
            "listens there, but no Ray GCS answered (the probe waited 3 s" in joined.stderr
        assert "RAYSIM_PROBE_SECONDS" in joined.stderr


def _command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # (it ended meanwhile)
        return b""


def test_ctrl_c_during_start_up_says_no_run_had_started(tmp_path, stale_record):
    with socket.socket() as other:  # start-up probes the record for up to PROBE_SECONDS
        other.bind(("127.0.0.1", 0))
        other.listen(64)
        command = subprocess.Popen(
            _command(tmp_path), env={
                **os.environ, **stale_record(f"127.0.0.1:{other.getsockname()[1]}")},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=answer_ctrl_c)
        deadline = time.monotonic() + 60
        while not any(b"raysim-probe" in _command_line(pid) for pid in descendants(command.pid)):
            assert time.monotonic() < deadline and command.poll() is None, "no probe seen"
            time.sleep(0.1)
        command.send_signal(signal.SIGINT)
        _, err = command.communicate(timeout=60)
    assert command.returncode == 130, err[-2000:]
    assert "interrupted during start-up: no run had started" in err
    assert "every completed round is written" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_runs_join_the_cluster_ray_address_names_and_local_forces_their_own(tmp_path):
    port = _free_port()
    ray_dir = Path(tempfile.mkdtemp(prefix="h-", dir=os.environ["RAY_TMPDIR"]))
    head = subprocess.Popen(  # its sessions and record in a directory of its own
        ["ray", "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
         "--disable-usage-stats", "--block", f"--temp-dir={ray_dir / 'ray'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "RAY_AUTH_MODE": "token"})
    try:
        deadline = time.monotonic() + 120
        while not accepts_connections(f"127.0.0.1:{port}"):
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
        os.killpg(head.pid, signal.SIGINT)  # as Ctrl-C: it stops its processes in seconds
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(ray_dir, ignore_errors=True)  # its record and sessions (as `ray stop`)


def test_the_probes_bound_grows_with_the_load_and_yields_to_the_setting(monkeypatch):
    """A live cluster on a machine at load 33 answers slowly: the bound stretches with the load
    per CPU (capped), and RAYSIM_PROBE_SECONDS, which every probe paragraph names, wins."""
    monkeypatch.delenv("RAYSIM_PROBE_SECONDS", raising=False)
    monkeypatch.setattr(cluster_probe.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cluster_probe.os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    assert cluster_probe.probe_seconds() == cluster_probe.PROBE_SECONDS
    monkeypatch.setattr(cluster_probe.os, "getloadavg", lambda: (8.0, 1.0, 1.0))
    assert cluster_probe.probe_seconds() == 4 * cluster_probe.PROBE_SECONDS
    monkeypatch.setattr(cluster_probe.os, "getloadavg", lambda: (33.0, 1.0, 1.0))
    assert cluster_probe.probe_seconds() == cluster_probe.MOST_PROBE_SECONDS
    monkeypatch.setenv("RAYSIM_PROBE_SECONDS", "90")
    assert cluster_probe.probe_seconds() == 90.0
    assert "RAYSIM_PROBE_SECONDS" in cluster_probe.probe_hint()
