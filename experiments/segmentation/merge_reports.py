"""Join two ``raysim report --csv`` directories of one study: the rows of NEW replace OLD's
rows of the same experiment in every CSV both hold (``per_seed.csv``, ``summary.csv``, the
``per_client_*.csv`` tables), so that a study rerun in part (new columns, or old ones with a
new measurement) renders as one table. Per-client columns are matched by client number (the
architectures in their names come from whichever runs were heterogeneous); a per-client row
of a fine-tuned model (``model`` = ``fine-tuned``) is the experiment ``<experiment>+ft``.

    python experiments/segmentation/merge_reports.py OLD_DIR NEW_DIR --out OUT_DIR
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

_CLIENT = re.compile(r"^client (\d+)")


def merged(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """OLD's rows of experiments NEW does not hold, then NEW's, in OLD's column names."""
    new = _fine_tuned_as_experiments(new)
    old = _fine_tuned_as_experiments(old)
    clients = {int(m.group(1)): c for c in old.columns if (m := _CLIENT.match(c))}
    new = new.rename(columns={c: clients.get(int(m.group(1)), c)
                              for c in new.columns if (m := _CLIENT.match(c))})
    kept = old[~old["experiment"].isin(set(new["experiment"]))]
    return pd.concat([kept, new], ignore_index=True)


def _fine_tuned_as_experiments(table: pd.DataFrame) -> pd.DataFrame:
    if "model" not in table:
        return table
    table = table.copy()
    tuned = table["model"] == "fine-tuned"
    table.loc[tuned, "experiment"] = table.loc[tuned, "experiment"] + "+ft"
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = sorted({p.name for p in args.new.glob("*.csv")} & {p.name for p in args.old.glob("*.csv")})
    for name in names:
        if name.startswith("own_share_"):
            continue  # derived: seed_table.py makes them again from per_seed.csv
        old, new = pd.read_csv(args.old / name), pd.read_csv(args.new / name)
        if "experiment" not in old or "experiment" not in new:
            continue
        merged(old, new).to_csv(args.out / name, index=False)
        print(f"{args.out / name}: {len(new)} rows from {args.new}, the rest from {args.old}")


if __name__ == "__main__":
    main()
