"""Convert FedScale's device traces into a raysim system trace (``system.trace``).

FedScale ships two pickles (benchmark/dataset/data/device_info): ``client_device_capacity``,
{id: {"computation": ms per training sample, "communication": kbit/s}}, and
``client_behave_trace``, {id: {"active": [s, ...], "inactive": [s, ...], "finish_time": s,
...}}: the device is available from active[i] to inactive[i], the pattern repeating every
finish_time seconds. FedScale's computation times are for its own models; raysim needs a
speed in GFLOP/s, so a ``reference_gflop`` per training sample (3 x the forward FLOPs of the
model the measurements stand for) converts them: speed = reference_gflop / (ms / 1000).
FedScale's one bandwidth is used for both directions, as FedScale does.

    python -m raysim.system.fedscale client_device_capacity [client_behave_trace] \\
        --clients 20 --reference-gflop 0.6 --out sites.csv

Devices are taken in the order of their ids (the first ``clients``). Pickles execute code
when loaded: convert only files you trust (FedScale's own).
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path
from typing import Any

import pandas as pd


def fedscale_trace(capacity: dict[Any, dict[str, float]],
                   behaviour: dict[Any, dict[str, Any]] | None, clients: int,
                   reference_gflop: float) -> pd.DataFrame:
    """A raysim trace (one row per client, or per availability window with ``period_h``)
    from FedScale's capacity and (optionally) behaviour dictionaries."""
    ids = sorted(capacity)[:clients]
    if len(ids) < clients:
        raise ValueError(f"the capacity trace has {len(ids)} devices, fewer than {clients}")
    rows = []
    for client, device in enumerate(ids):
        entry = capacity[device]
        mbps = float(entry["communication"]) / 1000.0
        base = {"client": client, "fedscale_id": device,
                "speed_gflops": reference_gflop / (float(entry["computation"]) / 1000.0),
                "down_mbps": mbps, "up_mbps": mbps}
        trace = (behaviour or {}).get(device)
        if trace is None:
            rows.append(base)
            continue
        period = float(trace["finish_time"]) / 3600.0
        for start, end in zip(trace["active"], trace["inactive"], strict=False):
            rows.append({**base, "available_from_h": float(start) / 3600.0,
                         "available_to_h": float(end) / 3600.0, "period_h": period})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("capacity", type=Path, help="FedScale's client_device_capacity")
    parser.add_argument("behaviour", type=Path, nargs="?", help="client_behave_trace")
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--reference-gflop", type=float, required=True,
                        help="training GFLOPs per sample that FedScale's times refer to")
    parser.add_argument("--out", type=Path, required=True, help="CSV or Parquet to write")
    args = parser.parse_args(argv)
    capacity = pickle.loads(args.capacity.read_bytes())
    behaviour = pickle.loads(args.behaviour.read_bytes()) if args.behaviour else None
    table = fedscale_trace(capacity, behaviour, args.clients, args.reference_gflop)
    if args.out.suffix == ".parquet":
        table.to_parquet(args.out, index=False)
    else:
        table.to_csv(args.out, index=False)
    print(f"{args.out}: {args.clients} sites, {len(table)} rows")


if __name__ == "__main__":
    main()
