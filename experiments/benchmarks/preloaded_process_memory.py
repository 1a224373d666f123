"""The memory of one idle worker process of a raysim Ray: what each process that a
local Ray starts ahead of time holds once it has imported torch and the engine (Ray's preload).
Starts a local Ray with raysim's raylet settings and the number of CPUs given, waits until its
prestarted processes have finished importing, and prints one JSON line with each idle
process's resident, proportional and private memory (``/proc/<pid>/smaps_rollup``, Linux).

    python experiments/benchmarks/preloaded_process_memory.py [--cpus 2] [--wait 15]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time


def idle_processes() -> list[int]:
    """Process ids of Ray's idle worker processes on this machine."""
    table = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in table.splitlines() if "ray::IDLE" in line]


def memory_kib(pid: int) -> dict[str, int]:
    """Rss, Pss and private (Private_Clean + Private_Dirty) memory of a process, KiB."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup.readlines()[1:]:
            name, _, value = line.partition(":")
            fields[name] = int(value.split()[0])
    return {"rss_kib": fields["Rss"], "pss_kib": fields["Pss"],
            "private_kib": fields["Private_Clean"] + fields["Private_Dirty"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--wait", type=float, default=15.0,
                        help="seconds to let the prestarted processes import")
    args = parser.parse_args()
    from raysim.engine.cluster import raylet_environment

    os.environ.update(raylet_environment())
    import ray

    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    time.sleep(args.wait)
    processes = {pid: memory_kib(pid) for pid in idle_processes()}
    ray.shutdown()
    print(json.dumps({"cpus": args.cpus, "processes": len(processes),
                      "each": list(processes.values())}), flush=True)


if __name__ == "__main__":
    main()
