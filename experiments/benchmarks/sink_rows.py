"""What the results sink costs a round's driver for its row tables (``ParquetSink.add``: the
``rounds`` row and the ``communication`` rows of every round), buffered and converted at the
flush: ``--rounds`` rounds of a 26-column rounds row and two communication rows, then one flush.
Prints one JSON line: microseconds per round spent in ``add`` (on the round's critical path) and
in all (``add`` plus the flush, per round).

    python experiments/benchmarks/sink_rows.py [--rounds 2000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from raysim.results.sink import ParquetSink


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    row = {f"metric_{i}": float(i) for i in range(24)} | {"round": 0, "name": "x"}
    with tempfile.TemporaryDirectory() as directory:
        sink = ParquetSink(directory, flush_seconds=1e9)
        started = time.perf_counter()
        for round_ in range(args.rounds):
            sink.add("rounds", [dict(row, round=round_)])
            sink.add("communication", [{"round": round_, "direction": "down", "bytes": 10},
                                       {"round": round_, "direction": "up", "bytes": 5}])
        added = time.perf_counter()
        sink.flush()
        flushed = time.perf_counter()
    print(json.dumps({"rounds": args.rounds,
                      "add_us_per_round": round(1e6 * (added - started) / args.rounds, 1),
                      "total_us_per_round": round(1e6 * (flushed - started) / args.rounds, 1)}))


if __name__ == "__main__":
    main()
