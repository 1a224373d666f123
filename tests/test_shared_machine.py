"""On a machine shared with other users: raysim's per-user state in the temporary folder (the
CPU-slot locks, the warm cluster's record) cannot be redirected by someone who planted a link
or a directory there before raysim ran."""

from __future__ import annotations

import json
import os
import stat

import pytest
from conftest import CLUSTER_TESTS

from raysim.engine.launch import cpu_slots, private_state, warm_cluster
from raysim.engine.launch.cpu_slots import CpuSlots
from raysim.errors import RaysimError

pytestmark = CLUSTER_TESTS


def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_left_intact(tmp_path):
    victim = tmp_path / "thesis.tex"
    victim.write_text("three years of work")
    slots = tmp_path / "slots"
    slots.mkdir(mode=0o700)
    (slots / "cpu-0.lock").symlink_to(victim)
    with pytest.raises(RaysimError, match="it is a symbolic link") as error:
        CpuSlots(2, slots).acquire(1, timeout=0)
    assert "\n" not in str(error.value) and "RAYSIM_CPU_SLOTS" in str(error.value)
    assert victim.read_text() == "three years of work"


def test_slot_directories_are_created_owner_only_and_locks_still_exclude(tmp_path):
    slots_dir = tmp_path / "fresh" / "slots"
    first, second = CpuSlots(2, slots_dir), CpuSlots(2, slots_dir)
    assert first.acquire(2) == 2
    assert stat.S_IMODE(slots_dir.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in slots_dir.iterdir())
    with pytest.raises(TimeoutError):
        second.acquire(1, timeout=0, notify=lambda line: None)
    first.release()
    assert second.acquire(1) == 2
    second.release()


def test_a_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    slots_dir = tmp_path / "slots"
    slots_dir.mkdir(mode=0o700)
    monkeypatch.setattr(private_state.os, "getuid", lambda: os.stat(tmp_path).st_uid + 1)
    with pytest.raises(RaysimError, match="owned by another user"):
        CpuSlots(2, slots_dir).acquire(1, timeout=0)


def test_a_directory_of_ours_open_to_others_is_closed(tmp_path):
    slots_dir = tmp_path / "slots"
    slots_dir.mkdir()
    os.chmod(slots_dir, 0o777)
    CpuSlots(1, slots_dir).acquire(1)
    assert stat.S_IMODE(slots_dir.stat().st_mode) == 0o700


def test_a_cluster_record_planted_as_a_link_or_in_a_link_is_never_trusted(tmp_path, monkeypatch):
    """A record naming another process and directory would make `raysim cluster stop` signal
    that process group and delete that directory: a record reached through a link is
    refused, one in a directory planted as a link too."""
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps({"address": "10.0.0.1:6379", "pid": os.getpid(),
                                   "pid_started": 0, "cpus": 1, "gpus": None, "started_at": 0,
                                   "log": "x", "ray_directory": str(tmp_path / "keep")}))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "cluster.json").symlink_to(planted)
    monkeypatch.setenv("RAYSIM_CLUSTER_DIR", str(state))
    with pytest.raises(RaysimError, match="symbolic link"):
        warm_cluster.running_cluster()
    linked = tmp_path / "linked"
    linked.symlink_to(state)
    monkeypatch.setenv("RAYSIM_CLUSTER_DIR", str(linked))
    with pytest.raises(RaysimError, match="symbolic link"):
        warm_cluster.running_cluster()
    monkeypatch.setenv("RAYSIM_CLUSTER_DIR", str(tmp_path / "absent"))
    assert warm_cluster.running_cluster() is None
    assert not (tmp_path / "absent").exists()  # reading creates nothing


def test_the_record_is_written_owner_only(tmp_path, monkeypatch):
    state = tmp_path / "state"
    monkeypatch.setenv("RAYSIM_CLUSTER_DIR", str(state))
    private_state.private_directory(state, "RAYSIM_CLUSTER_DIR")
    private_state.write_private_text(state / "cluster.json", "{}", "RAYSIM_CLUSTER_DIR")
    assert stat.S_IMODE((state / "cluster.json").stat().st_mode) == 0o600
    assert [p.name for p in state.iterdir()] == ["cluster.json"]  # no temporary file left


def test_the_default_slot_directory_is_per_user(monkeypatch):
    monkeypatch.delenv("RAYSIM_CPU_SLOTS", raising=False)
    assert cpu_slots.default_directory().name == f"raysim-cpu-slots-{os.getuid()}"


LOCAL_RAY_PROBE = """
import json, os, sys
from pathlib import Path
import ray
import raysim.engine  # Ray's settings, as the raysim command has them
from raysim.configuration.experiment import load_config
from raysim.engine.launch.local_ray import ensure_ray, stop_local_ray
from raysim.engine.launch.watchdog import descendants

def listening_addresses(pids):
    sockets = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                sockets.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in sockets:  # LISTEN
                found.add(fields[1].split(":")[0])
    return sorted(found)

config = load_config(sys.argv[1])
ensure_ray(config)
children = list(descendants(os.getpid()))
names = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in children}
ray_processes = [pid for pid, name in names.items() if name in ("gcs_server", "raylet")]
print(json.dumps({"gcs": ray.get_runtime_context().gcs_address,
                  "listening": listening_addresses(children),
                  "ray_names": sorted(names[pid] for pid in ray_processes),
                  "ray_groups": sorted({os.getpgid(pid) for pid in ray_processes}),
                  "own_group": os.getpgid(0)}))
stop_local_ray()
"""

LOOPBACK = ("0100007F", "0000000000000000FFFF00000100007F")
"""127.0.0.1 as /proc/net/tcp and tcp6 write it."""


def test_a_local_ray_listens_on_loopback_only_and_outside_raysims_process_group(tmp_path):
    """A Ray of raysim's own serves no other machine: its ports are on the loopback interface
    only; and a signal to raysim's process group (a scheduler's SIGTERM) does not reach its
    GCS and raylet, which raysim needs to stop at a round boundary."""
    import subprocess
    import sys
    from pathlib import Path

    quickstart = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"
    probe = subprocess.run([sys.executable, "-c", LOCAL_RAY_PROBE, str(quickstart)],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path,
                           env={**os.environ, "RAYSIM_CPU_SLOTS": "off"})  # never waits
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["gcs"].startswith("127.0.0.1:")
    assert found["ray_names"] == ["gcs_server", "raylet"]
    assert found["listening"] and set(found["listening"]) <= set(LOOPBACK)
    assert found["own_group"] not in found["ray_groups"]


def test_a_waiting_invocation_names_the_processes_holding_the_cpus_and_the_opt_out(
        tmp_path, monkeypatch):
    slots_dir = tmp_path / "slots"
    holder = CpuSlots(2, slots_dir)
    assert holder.acquire(2) == 2
    assert cpu_slots.holders(slots_dir) == {os.getpid(): 2}
    lines: list[str] = []
    with pytest.raises(TimeoutError):
        CpuSlots(2, slots_dir).acquire(1, timeout=0, notify=lines.append)
    assert f"pid {os.getpid()} (" in lines[0] and "holds 2 of its CPUs" in lines[0]
    assert "RAYSIM_CPU_SLOTS=off" in lines[0]
    monkeypatch.setenv("RAYSIM_CPU_SLOTS", "off")
    assert CpuSlots(2).acquire(2, timeout=0) == 2  # opted out: every CPU, no wait
    holder.release()
