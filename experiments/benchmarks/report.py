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
PAGES = {"BENCHMARKS.md": ["benchmarks", "gpu-profile", "speed-mechanisms"],
         "README.md": ["benchmarks-headline"]}

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
    """Every record of the peer suites, in file order, each with the name of its file
    (``records_file``: one measurement, which may span calls and commits)."""
    records = []
    for path in sorted(RECORDS.glob("peers_*.jsonl")):
        records += [{**json.loads(line), "records_file": path.name}
                    for line in path.read_text().splitlines() if line.strip()]
    return records


def _measured(records: list[dict]) -> tuple[str, str]:
    """When the newest of ``records`` was measured (date, then time where recorded)."""
    return max((r["date"], r.get("measured_at", "")) for r in records)


def _newest(groups: dict[tuple, list[dict]]) -> dict[tuple, list[dict]]:
    """Of measurement groups keyed ``(*row key, records file)``, the newest per row key: a
    later measurement of the same row replaces an earlier one."""
    newest: dict[tuple, tuple] = {}
    for key, found in groups.items():
        when = _measured(found)
        if key[:-1] not in newest or when > newest[key[:-1]][0]:
            newest[key[:-1]] = (when, key)
    return {key: groups[key] for _, key in newest.values()}


def steady_rate(record: dict) -> float | None:
    """A side's steady rounds per second: for raysim records that split their rounds, one over
    the median round (the rounds after the first; a final evaluation is not a round's cost);
    else the rate as recorded."""
    split = record.get("round_split_ms")
    if split and split.get("round"):
        return 1e3 / split["round"]
    rate = record.get("rounds_per_s")
    return float(rate) if isinstance(rate, (int, float)) else None


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
                     "plain": "-", "reference": "-", "vs_reference": "-",
                     "vs_flower": _fmt(median["raysim"] / median["flower"]) + "x time"
                     if "flower" in median and "raysim" in median else "-",
                     "vs_pfl": _fmt(median["raysim"] / median["pfl"]) + "x time"
                     if "pfl" in median and "raysim" in median else "-",
                     "versions": record["versions"], "commit": record["commit"],
                     "date": record["date"], "command": COMMANDS["CPU"]})
    return rows


def _best(records: list[dict], prefix: str) -> dict | None:
    """The record of the highest steady rate among sides starting with ``prefix``."""
    found = [r for r in records if r["side"].startswith(prefix) and steady_rate(r) is not None
             and not r["side"].endswith("_profile")]
    return max(found, key=lambda r: steady_rate(r) or 0.0, default=None)


def _rate(record: dict | None, rounds: int, label: str = "") -> str:
    """A steady rate, with its configuration, its round count where it differs from the row's
    and its whole-process time."""
    if record is None:
        return "-"
    wall = f", {record['wall_s']:.1f} s whole" if record.get("wall_s") else ""
    over = f" over {record['rounds']} rounds" if record["rounds"] != rounds else ""
    spread = f" ({min(record['repeats']):.1f}-{max(record['repeats']):.1f})" \
        if record.get("repeats") else ""
    return f"{steady_rate(record):.2f}{spread}{label}{over}{wall}"


def _failed(records: list[dict], prefix: str) -> str:
    """A side that ran and gave no rate: why (e.g. it timed out), else "-"."""
    errors = [r for r in records if r["side"].startswith(prefix) and r.get("error")]
    if not errors:
        return "-"
    return "did not finish: " + errors[0]["error"].split(":")[0].split("\n")[0]


def _ratio(raysim: dict, peer: dict | None, digits: int) -> str:
    if peer is None:
        return "-"
    return _fmt((steady_rate(raysim) or 0.0) / (steady_rate(peer) or 1.0), digits) + "x rate"


def _gpu_rows(records: list[dict]) -> list[dict]:
    """Steady rounds per second of each side (one measurement each)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        if record.get("device") == "CPU" or "rounds" not in record:
            continue
        if record["side"].startswith("raysim_3_seeds"):
            continue
        groups[(record["workload"], record["device"], record["rounds"],
                record["records_file"])].append(record)
    rows = []
    for (workload, device, rounds, _), found in sorted(_newest(groups).items()):
        commit = " + ".join(dict.fromkeys(r["commit"] for r in found))  # in measured order
        raysim = _best(found, "raysim_")
        flower = _best(found, "flower")
        pfl = _best(found, "pfl_research")
        plain = _best(found, "plain_pytorch_loop")
        reference = _best(found, "on_device_vmap_reference")
        if flower is None and rounds <= 20:  # Flower measured over fewer rounds (slow on GPUs)
            flower = _best([r for r in records if r.get("device") == device
                            and r.get("workload") == workload
                            and r["records_file"] == found[0]["records_file"]], "flower")

        if raysim is None:
            continue

        rows.append({
            "workload": workload, "device": f"{device}, {found[0]['cpus']} CPUs",
            "measure": f"rounds/s over {rounds} rounds, higher is better",
            "raysim": _rate(raysim, rounds, f" ({raysim['side'].removeprefix('raysim_')})"),
            "flower": _rate(flower, rounds) if flower else _failed(found, "flower"),
            "pfl": _rate(pfl, rounds, f" ({pfl['side'].split('_')[-1]})") if pfl
            else _failed(found, "pfl_research"),
            "plain": _rate(plain, rounds), "reference": _rate(reference, rounds),
            "vs_flower": _ratio(raysim, flower, 1), "vs_pfl": _ratio(raysim, pfl, 2),
            "vs_reference": _fmt((steady_rate(raysim) or 0.0) / (steady_rate(reference) or 1.0))
            if reference else "-",
            "versions": found[0]["versions"], "commit": commit, "date": found[0]["date"],
            "command": COMMANDS["GPU"].format(workload=workload, rounds=rounds)})
    return rows


def _versions(versions: dict) -> str:
    return ", ".join(f"{name} {version}" for name, version in versions.items())


def render_full(records: list[dict]) -> str:
    """BENCHMARKS.md's table block."""
    head = ("| workload | device | measure | raysim | Flower | pfl-research | plain loop | "
            "on-device reference | raysim vs Flower | raysim vs pfl-research | raysim vs "
            "reference | versions | commit, date | command |\n| --- | --- | --- | --- | --- | "
            "--- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
    lines = []
    for row in [*_cpu_rows(records), *_gpu_rows(records)]:
        lines.append(f"| {WORKLOADS[row['workload']]} | {row['device']} | "
                     f"{row['measure']} | {row['raysim']} | {row['flower']} | {row['pfl']} | "
                     f"{row['plain']} | {row['reference']} | {row['vs_flower']} | "
                     f"{row['vs_pfl']} | {row['vs_reference']} | {_versions(row['versions'])} | "
                     f"{row['commit']}, {row['date']} | {row['command']} |")
    seed_groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        if record["side"].startswith("raysim_3_seeds"):
            seed_groups[(record["device"], record["records_file"])].append(record)
    seeds = [r for found in _newest(seed_groups).values() for r in found]
    seed_lines = [f"| {r['side'].removeprefix('raysim_3_seeds_merge_')} | {r['device']} | "
                  f"{', '.join(f'{v:.2f}' for v in r['rounds_per_s'])} | {r['wall_s']:.2f} s | "
                  f"{r['commit']}, {r['date']} |" for r in seeds]
    seeds_table = ("\n\nThree seeds of the pfl shape on one card, 4 x 0.25 GPU each, 20 rounds "
                   "(`engine.merge_seeds`; `peers.py --workloads --seeds-check`):\n\n"
                   "| merge_seeds | device | rounds/s of each seed | whole process | "
                   "commit, date |\n| --- | --- | --- | --- | --- |\n" + "\n".join(seed_lines)
                   if seeds else "")
    return head + "\n".join(lines) + seeds_table


def render_profile(records: list[dict]) -> str:
    """BENCHMARKS.md's table of where a GPU round goes: raysim with 4 x 0.25 GPU, its rounds
    split from its results (medians) and its driver and workers sampled by py-spy."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        if record.get("device") != "CPU" and "rounds" in record:
            groups[(record["workload"], record["device"], record["records_file"])].append(record)
    lines = []
    for (workload, device, _), found in sorted(_newest(groups).items()):
        timed = [r for r in found if r["side"] == "raysim_vectorized_4x0.25gpu"
                 and r.get("round_split_ms") and r["rounds"] == 20]
        profile = next((r for r in found if r["side"].endswith("_profile")), None)
        if not timed:
            continue
        split = timed[0]["round_split_ms"]
        cells = [f"{split['round']:.1f}", f"{split['dispatch_to_replies']:.1f}",
                 f"{split['worker_local_updates']:.1f}", f"{split['aggregate']:.1f}"]
        for role in ("driver", "worker"):
            sampled = (profile or {}).get("profile", {}).get(role)
            cells.append("-" if sampled is None else
                         f"{sampled['busy_share']:.0%} busy; " + "; ".join(
                             f"{_function(name)} {share:.0%}"
                             for name, share in sampled["top_under_raysim"][:3]))
        commits = timed[0]["commit"]
        if profile and profile["commit"] != commits:
            commits += f" (py-spy: {profile['commit']})"
        lines.append(f"| {SHORT[workload]} | {device} | " + " | ".join(cells) + f" | {commits} |")
    head = ("| workload | device | round (ms) | dispatch to last reply (ms) | a worker's local "
            "updates (ms) | aggregation (ms) | driver (py-spy: busy share; most samples "
            "under) | each worker (py-spy) | commit |\n| --- | --- | --- | --- | --- | --- | "
            "--- | --- | --- |\n")
    return head + "\n".join(lines)


def _function(frame: str) -> str:
    """``name (path:line)`` as ``name`` (``file.py``:line)."""
    match = re.fullmatch(r"(.+) \((?:.*/)?([^/]+):(\d+)\)", frame)
    return f"`{match.group(1)}` ({match.group(2)}:{match.group(3)})" if match else frame


MECHANISMS = {
    "first_step": ("a client's first SGD step written from its start into its own weights "
                   "(`raysim/training/first_step.py`)",
                   "ms per client, per-client loop, MLP of 1.08 M parameters, 1 step"),
    "prestart": ("a local Ray prestarts only the worker processes the first runs use "
                 "(`raysim/engine/launch/local_ray.py`)",
                 "`raysim run experiments/quickstart.yaml`, the machine reporting 16 CPUs"),
    "head_services": ("a local Ray starts without the head processes raysim never uses "
                      "(`raysim/engine/launch/local_ray.py`)",
                      "seconds from a new process to three engine actors answering"),
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
            "gpu-profile": render_profile(records),
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
