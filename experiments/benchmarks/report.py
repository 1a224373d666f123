"""BENCHMARKS.md's tables and the README's headline table, rendered from the committed records
(``experiments/benchmarks/records/peers_*.jsonl``, written by ``peers.py`` and
``vs_flower.py --records``; ``speed_mechanisms_*.jsonl``, written by ``speed_mechanisms.py
--records``): one row per workload, device and round count, with raysim's best
configuration, each peer's best, the plain loop and the on-device reference, the ratios, the
commit, the date and the command that measured it.

    python experiments/benchmarks/report.py            # rewrite the tables in place
    python experiments/benchmarks/report.py --check    # exit 1 when a page differs from them

``tests/test_benchmarks_report.py`` runs the check.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import WORKLOADS as ALL_WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
RECORDS = Path(__file__).resolve().parent / "records"
PAGES = {"BENCHMARKS.md": ["benchmarks", "speed-mechanisms"], "README.md": ["benchmarks-headline"]}

WORKLOADS = {name: spec.description for name, spec in ALL_WORKLOADS.items()}
"""What each workload is (the records name them as ``workloads.py`` does)."""

SHORT = {name: spec.short for name, spec in ALL_WORKLOADS.items()}
"""The workloads' names in the README's short table."""

COMMANDS = {
    "CPU": "`python experiments/benchmarks/vs_flower.py --flower-python FLOWER_PY --pfl-python "
           "PFL_PY --workloads convnet32-150x8-pneumonia,mlp32-1000x4-synthetic --repeats 3 "
           "--records FILE`",
    "GPU": "`python experiments/benchmarks/peers.py --flower-python FLOWER_PY --pfl-python "
           "PFL_PY --workloads {workload} --rounds {rounds} --pfl-processes 1 2 4 --records "
           "FILE` (on the GPU machine: `bash experiments/benchmarks/device/peers_gpu.sh`)",
}

PEERS = {"flower": "Flower 1.41", "pfl": "pfl-research 0.6"}


def load_records() -> list[dict]:
    """Every record of the peer suites, in file order."""
    records = []
    for path in sorted(RECORDS.glob("peers_*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _cpu_rows(records: list[dict]) -> list[dict]:
    """Whole-process seconds (median over repeats, with the range) of each side."""
    groups: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    meta: dict[tuple, dict] = {}
    for record in records:
        if record.get("device") != "CPU" or "wall_s" not in record or record.get("error"):
            continue
        key = (record["workload"], record["commit"])
        side = "raysim" if record["side"] == "raysim" else record["side"]
        groups[key][side].append(record["wall_s"])
        meta[key] = record
    rows = []
    for key, sides in groups.items():
        median = {side: statistics.median(values) for side, values in sides.items()}
        spread = {side: f"{min(values):.1f}-{max(values):.1f}" for side, values in sides.items()}
        record = meta[key]
        cells = {side: f"{median[side]:.1f} s ({spread[side]}, n={len(sides[side])})"
                 for side in median}
        rows.append({"workload": key[0], "device": f"{record['cpus']} CPUs",
                     "measure": f"whole process of {ALL_WORKLOADS[key[0]].rounds} rounds (s), "
                                "lower is better",
                     "raysim": cells.get("raysim", "-"), "flower": cells.get("flower", "-"),
                     "pfl": cells.get("pfl", "-"),
                     "plain": "-", "reference": "-",
                     "vs_flower": _fmt(median["raysim"] / median["flower"]) + "x time"
                     if "flower" in median and "raysim" in median else "-",
                     "vs_pfl": _fmt(median["raysim"] / median["pfl"]) + "x time"
                     if "pfl" in median and "raysim" in median else "-",
                     "versions": record["versions"], "commit": record["commit"],
                     "date": record["date"], "command": COMMANDS["CPU"]})
    return rows


def _best(records: list[dict], prefix: str) -> dict | None:
    """The record of the highest steady rate among sides starting with ``prefix``."""
    found = [r for r in records if r["side"].startswith(prefix)
             and isinstance(r.get("rounds_per_s"), (int, float))]
    return max(found, key=lambda r: r["rounds_per_s"], default=None)


def _rate(record: dict | None, rounds: int, label: str = "") -> str:
    """A steady rate, with its configuration, its round count where it differs from the row's
    and its whole-process time."""
    if record is None:
        return "-"
    wall = f", {record['wall_s']:.1f} s whole" if record.get("wall_s") else ""
    over = f" over {record['rounds']} rounds" if record["rounds"] != rounds else ""
    return f"{record['rounds_per_s']:.2f}{label}{over}{wall}"


def _ratio(raysim: dict, peer: dict | None, digits: int) -> str:
    if peer is None:
        return "-"
    return _fmt(raysim["rounds_per_s"] / peer["rounds_per_s"], digits) + "x rate"


def _gpu_rows(records: list[dict]) -> list[dict]:
    """Steady rounds per second of each side (one measurement each)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        if record.get("device") == "CPU" or "rounds" not in record:
            continue
        if record["side"].startswith("raysim_3_seeds"):
            continue
        groups[(record["workload"], record["device"], record["rounds"],
                record["commit"])].append(record)
    rows = []
    for (workload, device, rounds, commit), found in sorted(groups.items()):
        raysim = _best(found, "raysim_")
        flower = _best(found, "flower")
        pfl = _best(found, "pfl_research")
        plain = _best(found, "plain_pytorch_loop")
        reference = _best(found, "on_device_vmap_reference")
        if flower is None and rounds <= 20:  # Flower measured over fewer rounds (slow on GPUs)
            flower = _best([r for r in records if r.get("device") == device
                            and r.get("workload") == workload and r.get("commit") == commit],
                           "flower")

        if raysim is None:
            continue

        rows.append({
            "workload": workload, "device": f"{device}, {found[0]['cpus']} CPUs",
            "measure": f"rounds/s over {rounds} rounds, higher is better",
            "raysim": _rate(raysim, rounds, f" ({raysim['side'].removeprefix('raysim_')})"),
            "flower": _rate(flower, rounds),
            "pfl": _rate(pfl, rounds, f" ({pfl['side'].split('_')[-1]})") if pfl else "-",
            "plain": _rate(plain, rounds), "reference": _rate(reference, rounds),
            "vs_flower": _ratio(raysim, flower, 1), "vs_pfl": _ratio(raysim, pfl, 2),
            "vs_reference": _fmt(raysim["rounds_per_s"] / reference["rounds_per_s"])
            if reference else "-",
            "versions": found[0]["versions"], "commit": commit, "date": found[0]["date"],
            "command": COMMANDS["GPU"].format(workload=workload, rounds=rounds)})
    return rows


def _versions(versions: dict) -> str:
    return ", ".join(f"{name} {version}" for name, version in versions.items())


def render_full(records: list[dict]) -> str:
    """BENCHMARKS.md's table block."""
    head = ("| workload | device | measure | raysim | Flower | pfl-research | plain loop | "
            "on-device reference | raysim vs Flower | raysim vs pfl-research | versions | "
            "commit, date | command |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | "
            "--- | --- | --- | --- |\n")
    lines = []
    for row in [*_cpu_rows(records), *_gpu_rows(records)]:
        lines.append(f"| {WORKLOADS[row['workload']]} | {row['device']} | "
                     f"{row['measure']} | {row['raysim']} | {row['flower']} | {row['pfl']} | "
                     f"{row['plain']} | {row['reference']} | {row['vs_flower']} | "
                     f"{row['vs_pfl']} | {_versions(row['versions'])} | {row['commit']}, "
                     f"{row['date']} | {row['command']} |")
    seeds = [r for r in records if r["side"].startswith("raysim_3_seeds")]
    seed_lines = [f"| {r['side'].removeprefix('raysim_3_seeds_merge_')} | {r['device']} | "
                  f"{', '.join(f'{v:.2f}' for v in r['rounds_per_s'])} | {r['wall_s']:.2f} s | "
                  f"{r['commit']}, {r['date']} |" for r in seeds]
    seeds_table = ("\n\nThree seeds of the pfl shape on one card, 4 x 0.25 GPU each, 20 rounds "
                   "(`engine.merge_seeds`; `peers.py --workloads --seeds-check`):\n\n"
                   "| merge_seeds | device | rounds/s of each seed | whole process | "
                   "commit, date |\n| --- | --- | --- | --- | --- |\n" + "\n".join(seed_lines)
                   if seeds else "")
    return head + "\n".join(lines) + seeds_table


MECHANISMS = {
    "first_step": ("a client's first SGD step written from its start into its own weights "
                   "(`raysim/training/first_step.py`)",
                   "ms per client, per-client loop, MLP of 1.08 M parameters, 1 step"),
    "prestart": ("a local Ray prestarts only the worker processes the first runs use "
                 "(`raysim/engine/launch/local_ray.py`)",
                 "`raysim run experiments/quickstart.yaml`, the machine reporting 16 CPUs"),
}
"""What each speed-mechanism record measures (``speed_mechanisms.py``)."""


def load_mechanism_records() -> list[dict]:
    """Every record of ``speed_mechanisms.py``, in file order."""
    return [json.loads(line) for path in sorted(RECORDS.glob("speed_mechanisms_*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]


def render_mechanisms(records: list[dict]) -> str:
    """BENCHMARKS.md's table of speed mechanisms, each off against on."""
    head = ("| mechanism | measure | on | off | off / on (mean of pairs, t) | device | commit |"
            " command |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
    lines = []
    for r in records:
        what, measure = MECHANISMS[r["mechanism"]]
        if r["mechanism"] == "prestart":
            on = f"first round {r['on_first_round_s']:.1f} s, command {r['on_command_s']:.1f} s"
            off = f"first round {r['off_first_round_s']:.1f} s, command {r['off_command_s']:.1f} s"
        else:
            on, off = f"{r['on']:.2f}", f"{r['off']:.2f}"
        command = (f"`python experiments/benchmarks/speed_mechanisms.py --only {r['mechanism']} "
                   f"--repeats {r['repeats']}`")
        lines.append(f"| {what} | {measure} | {on} | {off} | {r['ratio_mean']:.2f} (t = "
                     f"{r['ratio_t']:.2f}, {r['repeats']} pairs) | {r['device']} | "
                     f"{r['commit']} | {command} |")
    return head + "\n".join(lines)


def render_headline(records: list[dict]) -> str:
    """The README's short table: the CPU rows and the GPU rows of 20 rounds."""
    head = ("| workload | device | raysim | Flower 1.41 | pfl-research 0.6 | raysim vs Flower | "
            "raysim vs pfl-research |\n| --- | --- | --- | --- | --- | --- | --- |\n")
    rows = [*_cpu_rows(records), *[r for r in _gpu_rows(records)
                                   if r["measure"].startswith("rounds/s over 20 ")]]
    lines = [f"| {SHORT[row['workload']]} ({row['measure'].split(',')[0]}) | {row['device']} | "
             f"{_short(row['raysim'])} | {_short(row['flower'])} | "
             f"{_short(row['pfl'])} | {row['vs_flower']} | "
             f"{row['vs_pfl']} |" for row in rows]
    return head + "\n".join(lines)


def _short(cell: str) -> str:
    """A cell without its configuration, spread and whole-process time."""
    return re.sub(r" \([^)]*\)", "", cell).split(",")[0]


def rendered_page(text: str, marker: str, block: str) -> str:
    """``text`` with the block between ``<!-- marker: start -->`` and its end replaced."""
    start, end = f"<!-- {marker}: start -->", f"<!-- {marker}: end -->"
    before, rest = text.split(start, 1)
    return f"{before}{start}\n{block}\n{end}{rest.split(end, 1)[1]}"


def rendered_blocks() -> dict[str, str]:
    """Every page block by its marker, rendered from the committed records."""
    records = load_records()
    return {"benchmarks": render_full(records), "benchmarks-headline": render_headline(records),
            "speed-mechanisms": render_mechanisms(load_mechanism_records())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a page differs from its rendering")
    args = parser.parse_args()
    blocks = rendered_blocks()
    stale = []
    for page, markers in PAGES.items():
        path = ROOT / page
        text = path.read_text()
        new = text
        for marker in markers:
            new = rendered_page(new, marker, blocks[marker])
        if new != text:
            stale.append(page)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"{', '.join(stale)} differ from the records; run "
              "`python experiments/benchmarks/report.py`", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
