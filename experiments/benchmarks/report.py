"""BENCHMARKS.md's tables and the README's headline table, rendered from the committed records
(``experiments/benchmarks/records/peers_*.jsonl``, written by ``peers.py --records``;
``speed_mechanisms_*.jsonl``, written by ``speed_mechanisms.py --records``;
``cluster_bytes_*.jsonl``, written by ``cluster_bytes.py --records``; ``speed_*.jsonl``,
``worker_priority_*.jsonl`` and ``client_scale_*.jsonl``, written by those scripts): one row per workload,
device and round count, with raysim's best
configuration, each peer's best, the plain loop and the on-device reference, the ratios, the
commit, the date and the command that measured it.

    python experiments/benchmarks/report.py            # rewrite the tables in place
    python experiments/benchmarks/report.py --check    # exit 1 when a page differs from them

``tests/test_benchmarks_report.py`` runs the check.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import EQUAL_THREADS
from workloads import WORKLOADS as ALL_WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
RECORDS = Path(__file__).resolve().parent / "records"
PAGES = {"BENCHMARKS.md": ["benchmarks", "gpu-profile", "speed-mechanisms", "cluster-bytes",
                          "task-rounds", "worker-priority", "client-scale",
                          "speed-cpu", "startup"],
         "README.md": ["benchmarks-headline"]}

WORKLOADS = {name: spec.description for name, spec in ALL_WORKLOADS.items()}
"""What each workload is (the records name them as ``workloads.py`` does)."""

SHORT = {name: spec.short for name, spec in ALL_WORKLOADS.items()}
"""The workloads' names in the README's short table."""

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


def _measurements(records: list[dict]) -> dict[tuple, list[dict]]:
    """Each row's (workload, device, rounds) records: every side's newest measurement (a side
    measured again replaces its earlier figures; the row's other sides keep theirs)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        if "rounds" not in record or record["side"].startswith("raysim_3_seeds") \
                or record["side"].endswith("_profile"):
            continue
        groups[(record["workload"], record["device"], record["rounds"], record["side"],
                record["records_file"])].append(record)
    rows: dict[tuple, list[dict]] = defaultdict(list)
    for (*row, _side, _file), found in _newest(groups).items():
        rows[tuple(row)] += found
    return {row: sorted(found, key=lambda r: (r["date"], r.get("measured_at", "")))
            for row, found in rows.items()}


@dataclass(frozen=True)
class Side:
    """One side's measurements in a row: its configuration and its runs."""

    name: str
    runs: list[dict]

    def values(self, measure: str) -> list[float]:
        return [v for v in (steady_rate(r) if measure == "rate" else r.get("wall_s")
                            for r in self.runs if not r.get("error")) if v is not None]

    def median(self, measure: str) -> float | None:
        found = self.values(measure)
        return statistics.median(found) if found else None

    def cell(self, measure: str, label: bool, whole: bool) -> str:
        """The median with its range over repeats, the configuration where ``label``, and
        (for a rate measured once) the whole-process seconds; why it failed when it did."""
        found = self.values(measure)
        if not found:
            error = next((r["error"] for r in self.runs if r.get("error")), "")
            return "did not finish: " + error.split(":")[0].split("\n")[0] if error else "-"
        spread = self.runs[0].get("repeats") if len(found) == 1 else found
        unit = " s" if measure == "wall" else ""
        cell = f"{statistics.median(found):.{1 if measure == 'wall' else 2}f}{unit}"
        if spread and len(spread) > 1:
            digits = 1 if measure == "wall" else 2
            cell += f" ({min(spread):.{digits}f}-{max(spread):.{digits}f}, n={len(spread)})"
        if label:
            cell += f" ({self.label()})"
        wall = self.runs[0].get("wall_s")
        if whole and len(found) == 1 and wall:
            cell += f", {wall:.1f} s whole"
        return cell


    def label(self) -> str:
        """The side's configuration: raysim's engine, pfl-research's processes, and the
        threads per process where its records say."""
        threads = self.runs[0].get("threads")
        name = self.name.removeprefix("raysim_")
        if name.startswith("pfl_research_"):
            name = name.removeprefix("pfl_research_")
            return name + (f" x {threads} thread{'s' * (threads != 1)}" if threads else "")
        if name.startswith(("plain_pytorch_loop", "on_device_vmap_reference")):
            return f"{threads} thread{'s' * (threads != 1)}" if threads else name
        return name


def _thread_budgets(found: list[dict]) -> list[tuple[str, list[dict]]]:
    """A row's records per thread budget: where they record threads (CPU rows), the sides at
    one thread per process, then every side (each at its best); else all of them as one."""
    if not any("threads" in r for r in found):
        return [("", found)]
    equal = [r for r in found if r.get("threads") == EQUAL_THREADS]
    return [(", every side 1 thread per process", equal),
            (", each side at its best thread count", found)]


def _best(found: list[dict], prefix: str, measure: str) -> Side | None:
    """Of the sides starting with ``prefix``, the one with the best median (highest rate,
    lowest whole-process time); a side that only failed when none measured."""
    sides = [Side(name, [r for r in found if r["side"] == name])
             for name in dict.fromkeys(r["side"] for r in found if r["side"].startswith(prefix))]
    measured = [side for side in sides if side.median(measure) is not None]
    if not measured:
        return sides[0] if sides else None
    sign = 1 if measure == "rate" else -1
    return max(measured, key=lambda side: sign * (side.median(measure) or 0.0))


def _ratio(raysim: Side, peer: Side | None, measure: str, digits: int) -> str:
    ours, theirs = raysim.median(measure), peer.median(measure) if peer else None
    if ours is None or theirs is None:
        return "-"
    return _fmt(ours / theirs, digits) + ("x rate" if measure == "rate" else "x time")


def _rows(records: list[dict]) -> list[dict]:
    """Per (workload, device, rounds): a row of whole-process seconds where raysim and a
    peer ran repeatedly (the median and range over repeats), and a row of steady rounds per
    second."""
    rows = []
    for (workload, device, rounds), found in sorted(
            _measurements(records).items(), key=lambda item: (item[0][1] != "CPU", item[0])):
        repeats = max((r.get("repeat", 0) for r in found if r["side"].startswith("raysim_")),
                      default=0) + 1
        peers_repeated = any(r.get("repeat", 0) > 0 for r in found
                             if r["side"].startswith(("flower", "pfl_research")))
        repeated = repeats > 1
        commit = " + ".join(dict.fromkeys(r["commit"] for r in found))  # in measured order
        versions: dict = {}
        for record in found:
            versions.update(record["versions"])
        on = f"{found[0]['cpus']} CPUs" if device == "CPU" else f"{device}, {found[0]['cpus']} CPUs"
        suffix = "" if device == "CPU" else \
            " (on the GPU machine: `bash experiments/benchmarks/device/peers_gpu.sh`)"
        command = (f"`python experiments/benchmarks/peers.py --flower-python FLOWER_PY "
                   f"--pfl-python PFL_PY --workloads {workload} --rounds {rounds}"
                   + (f" --repeats {repeats}" if repeated else "") + " --records FILE`" + suffix)
        measures = (["wall"] if repeated and peers_repeated else []) + ["rate"]
        for (budget, sides), measure in itertools.product(_thread_budgets(found), measures):
            raysim = _best(sides, "raysim_", measure)
            if raysim is None:
                continue
            flower, pfl = _best(sides, "flower", measure), _best(sides, "pfl_research", measure)
            plain = _best(sides, "plain_pytorch_loop", measure)
            reference = _best(sides, "on_device_vmap_reference", measure)
            whole = "wall" not in measures  # (a side run once shows its whole process)
            label = device != "CPU" or budget.startswith(", each")
            rows.append({
                "workload": workload, "device": on, "on_gpu": device != "CPU",
                "equal_threads": not budget.startswith(", each"),
                "measure": (f"whole process of {rounds} rounds (s), lower is better"
                            if measure == "wall" else
                            f"rounds/s over {rounds} rounds, higher is better") + budget,
                "raysim": raysim.cell(measure, label, whole),
                "flower": flower.cell(measure, False, whole) if flower else "-",
                "pfl": pfl.cell(measure, label, whole) if pfl else "-",
                "plain": plain.cell(measure, label and device == "CPU", False) if plain else "-",
                "reference": reference.cell(measure, label and device == "CPU", False)
                if reference else "-",
                "vs_flower": _ratio(raysim, flower, measure, 1 if measure == "rate" else 2),
                "vs_pfl": _ratio(raysim, pfl, measure, 2),
                "vs_reference": _fmt((raysim.median(measure) or 0.0)
                                     / (reference.median(measure) or 1.0))
                if reference and reference.median(measure) else "-",
                "versions": versions, "commit": commit, "date": found[-1]["date"],
                "command": command})
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
    for row in _rows(records):
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
    splits: dict[tuple, list[dict]] = defaultdict(list)
    profiles: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        if record.get("device") == "CPU" or "rounds" not in record:
            continue
        key = (record["workload"], record["device"], record["records_file"])
        if record["side"].endswith("_profile"):
            profiles[key].append(record)
        elif record["side"] == "raysim_vectorized_4x0.25gpu" and record.get("round_split_ms") \
                and record["rounds"] == 20:
            splits[key].append(record)
    newest_profile = {key[:-1]: found[0] for key, found in _newest(profiles).items()}
    lines = []
    for (workload, device, _), timed in sorted(_newest(splits).items()):
        profile = newest_profile.get((workload, device))
        cells = [f"{statistics.median(r['round_split_ms'][part] for r in timed):.1f}"
                 for part in ("round", "dispatch_to_replies", "worker_local_updates",
                              "aggregate")]
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
    "compiled_step": ("the vectorised path's step compiled with torch.compile "
                      "(`engine.compile_step: always`, `raysim/training/compiled_step.py`)",
                      "ms per round, one worker's vectorised updates of 50 clients x 4 steps, "
                      "MLP 32, one thread"),
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
        elif r["mechanism"] == "compiled_step":
            on = f"{r['on']:.2f} (after {r['compile_s']:.1f} s compiling its shapes)"
            off = f"{r['off']:.2f}"
        else:
            on, off = f"{r['on']:.2f}", f"{r['off']:.2f}"
        command = (f"`python experiments/benchmarks/speed_mechanisms.py --only {r['mechanism']} "
                   f"--repeats {r['repeats']}`")
        lines.append(f"| {what} | {measure} | {on} | {off} | {r['ratio_mean']:.2f} (t = "
                     f"{r['ratio_t']:.2f}, {r['repeats']} pairs) | {r['device']} | "
                     f"{r['commit']} | {command} |")
    return head + "\n".join(lines)


def load_task_records() -> list[dict]:
    """Every summary record of ``task_rounds.py``, in file order."""
    return [record for path in sorted(RECORDS.glob("task_rounds_*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()
            for record in [json.loads(line)] if record.get("side") == "summary"]


def render_task_rounds(records: list[dict]) -> str:
    """BENCHMARKS.md's task rounds: raysim's client runtime (per-client loop, vectorised)
    against a plain PyTorch loop, the newest summary per workload and device."""
    head = ("| workload | device | threads | load at start | plain PyTorch loop | raysim, "
            "per-client loop | raysim, vectorised | loop / plain (mean of pairs, t, p) | "
            "vectorised / plain | commit, date | command |\n| --- | --- | --- | --- | --- | --- "
            "| --- | --- | --- | --- | --- |\n")
    newest = {(r["workload"], r["device"]): r  # (file order within a date)
              for r in sorted(records, key=lambda record: record["date"])}
    lines = []
    for (workload, device), r in newest.items():
        pairs = r["raysim_loop_over_plain_n"]
        on = "" if device.startswith("cpu-") else " --device cuda"
        lines.append(
            f"| {r.get('description', workload)} | {device} | {r['threads'] or '-'} | "
            f"{r['load_at_start']} | "
            f"{r['plain_pytorch_loop_median_rounds_per_s']:.2f} rounds/s | "
            f"{r['raysim_loop_median_rounds_per_s']:.2f} rounds/s | "
            f"{r['raysim_vectorized_median_rounds_per_s']:.2f} rounds/s | "
            f"{_ratio_cell(r, 'raysim_loop', pairs)}, {pairs} pairs) | "
            f"{_ratio_cell(r, 'raysim_vectorized', pairs)}) | {r['commit']}, {r['date']} | "
            f"`python experiments/benchmarks/task_rounds.py --workloads {workload}{on} "
            f"--rounds {r['rounds']} --repeats {pairs}` |")
    return head + "\n".join(lines)


def _ratio_cell(record: dict, side: str, pairs: int) -> str:
    """``mean (t = T, p = P`` of a side's mean ratio over alternated pairs: the two-sided p of
    its one-sample t against 1 on ``pairs - 1`` degrees of freedom (left open for what
    follows)."""
    from scipy import stats

    t = record[f"{side}_over_plain_ratio_t"]
    p = 2 * stats.t.sf(abs(t), pairs - 1) if pairs > 1 else float("nan")
    return f"{record[f'{side}_over_plain_ratio_mean']:.2f} (t = {t:.2f}, p = {p:.2g}"


def load_cluster_records() -> list[dict]:
    """Every record of ``cluster_bytes.py``, in file order, newest file last."""
    paths = sorted(RECORDS.glob("cluster_bytes_*.jsonl"))
    return [{**json.loads(line), "device": path.stem.split("_")[2]} for path in paths
            for line in path.read_text().splitlines() if line.strip()]


def _per_round(rounds: list[dict], key: str) -> tuple[float, float, int]:
    """(counted, expected, rounds) of ``key`` bytes averaged over the rounds that moved it
    (FedDC aggregates every 2nd round and relays in the others)."""
    moved = [r for r in rounds if r.get(key, 0) > 0.01 * r["expected"].get(key, 0)
             and r["expected"].get(key, 0) > 0]
    if not moved:
        return 0.0, 0.0, 0
    return (statistics.fmean(r[key] for r in moved),
            statistics.fmean(r["expected"][key] for r in moved), len(moved))


def _mb(value: float) -> str:
    return f"{value / 2**20:.2f}"


def render_cluster_bytes(records: list[dict]) -> str:
    """BENCHMARKS.md's table of what a round moves between nodes, counted against the
    arithmetic."""
    head = ("| run | nodes x workers | model MB | out of the driver's node: broadcast, counted "
            "(expected) | into it: partials, counted (expected) | partials one per worker "
            "would send | between worker nodes: relays, counted (expected) | Flower: server "
            "link | ring all-reduce: per node | device | commit | command |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
    lines = []
    for r in records:
        rounds = r["rounds"]
        out = _per_round(rounds, "broadcast_out_bytes")
        into = _per_round(rounds, "partial_in_bytes")
        local = _per_round(rounds, "partial_local_bytes")
        relays = [(x["relay_between_bytes"], x["expected"]["relay_between_bytes_random_permutation"])
                  for x in rounds if "relay_between_bytes" in x]
        relay = (f"{_mb(statistics.fmean(a for a, _ in relays))} "
                 f"({_mb(statistics.fmean(b for _, b in relays))})" if relays else "none")
        flower = statistics.fmean(x["expected"]["flower_server_bytes"] for x in rounds)
        ring = into[1] and statistics.fmean(
            x["expected"]["allreduce_per_node_bytes"] for x in rounds
            if x["expected"]["allreduce_per_node_bytes"])
        command = f"`{r['command']} --only {r['method']}-{r['model']}`"
        lines.append(
            f"| {r['method']}, {r['model']}, {r['clients']} clients | {r['nodes']} x "
            f"{r['workers_per_node']} | {r['model_bytes'] / 2**20:.2f} | {_mb(out[0])} "
            f"({_mb(out[1])}) | {_mb(into[0])} ({_mb(into[1])}) | {_mb(local[0])} | {relay} | "
            f"{_mb(flower)} | {_mb(ring) if ring else 'none'} | {r['device']} | {r['commit']} | "
            f"{command} |")
    return head + "\n".join(lines)


def load_suite_records(suite: str) -> list[dict]:
    """Every record of the records files ``<suite>_*.jsonl``, in file order."""
    return [json.loads(line) for path in sorted(RECORDS.glob(f"{suite}_*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]


AUTOGROUPS = {"1": "on (the machine's setting)", "0": "off (set for the runs)",
              "absent": "none (kernel without them)"}


def render_priority(records: list[dict]) -> str:
    """BENCHMARKS.md's worker-priority table: a run's workers at niceness 0 against Ray's
    default 15, quiet and beside busy processes (the newest summary per condition)."""
    head = ("| workload | condition | session autogroups | load at start | workers seen at | "
            "whole process at 0 (s) | at 15 (s) | 15 / 0 (mean of pairs, t) | device | commit, "
            "date | command |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
            "|\n")
    newest = {(r["condition"], r["autogroup"], r["busy_processes"], r["device"]): r
              for r in records if r.get("side") == "summary"}
    lines = []
    for (condition, group, _, device), summary in newest.items():
        runs = [r for r in records if r.get("condition") == condition
                and r.get("autogroup") == group
                and r["commit"] == summary["commit"] and r.get("side") != "summary"
                and r.get("measured_at") == summary.get("measured_at")]
        loads = [r["load_at_start"] for r in runs]
        seen = {n: sorted({v for r in runs if r["worker_niceness"] == n
                           for v in r["seen_niceness"]}) for n in ("0", "15")}
        walls = summary["wall_s"]
        busy = summary["busy_processes"]
        what = (f"beside {busy} busy process{'es' * (busy != 1)} at niceness 0"
                if summary["busy_processes"] else "quiet")
        lines.append(
            f"| {WORKLOADS[summary['workload']]}, {summary['rounds']} rounds, 2 workers x 1 CPU "
            f"| {what} | {AUTOGROUPS.get(group, group)} | {min(loads):.1f}-{max(loads):.1f} | "
            f"{'/'.join(map(str, seen['0']))} and {'/'.join(map(str, seen['15']))} | "
            f"{statistics.median(walls['0']):.1f} ({min(walls['0']):.1f}-{max(walls['0']):.1f}) | "
            f"{statistics.median(walls['15']):.1f} ({min(walls['15']):.1f}-"
            f"{max(walls['15']):.1f}) | {summary['wall_15_over_0_ratio_mean']:.2f} (t = "
            f"{summary['wall_15_over_0_ratio_t']:.2f}, {summary['pairs']} pairs) | {device} | "
            f"{summary['commit']}, {summary['date']} | `python experiments/benchmarks/"
            f"worker_priority.py --workload {summary['workload']} --repeats "
            f"{summary['pairs']} --conditions {condition}"
            + (f" --load {summary['busy_processes']}" if summary["busy_processes"] else "")
            + (" --autogroup off" if group == "0" else "") + "` |")
    return head + "\n".join(lines)


def render_client_scale(records: list[dict]) -> str:
    """BENCHMARKS.md's cost growth with clients: raysim and pfl-research per client count and
    round count (medians over repeats; the newest commit's records)."""
    head = ("| clients | rounds | whole process (s): raysim / pfl-research | steady s per round: "
            "raysim / pfl-research | start-up, first round and exit (s): raysim / pfl-research "
            "| peak memory of the process tree (MB, PSS): raysim / pfl-research | device, load "
            "| commit, date |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
    if not records:
        return head.rstrip("\n")
    newest = max((r["date"], r["measured_at"], r["commit"]) for r in records)[2]
    found = [r for r in records if r["commit"] == newest]
    cells: dict[tuple[int, int, str], dict[str, list[dict]]] = defaultdict(
        lambda: defaultdict(list))
    for r in found:  # a run of raysim from another checkout (before a change) gets its own row
        cells[(r["clients"], r["rounds"], r.get("raysim_commit", ""))][r["side"]].append(r)

    def median(runs: list[dict], key: str, digits: int) -> str:
        values = [r[key] for r in runs if r.get(key) is not None and not r.get("error")]
        if not values:
            error = next((r["error"] for r in runs if r.get("error")), "")
            return "did not finish: " + error.split(":")[0] if error else "-"
        return f"{statistics.median(values):.{digits}f}"

    lines = []
    for (clients, rounds, other), sides in sorted(cells.items()):
        ours, theirs = sides.get("raysim", []), sides.get("pfl_research", [])
        pairs = [f"{median(ours, key, digits)} / {median(theirs, key, digits)}"
                 for key, digits in (("wall_s", 1), ("steady_s_per_round", 4),
                                     ("startup_s", 1), ("peak_memory_mb", 0))]
        sample = (ours or theirs)[0]
        label = f"{clients:,}" + (f" (raysim at {other})" if other else "")
        lines.append(f"| {label} | {rounds} | {' | '.join(pairs)} | {sample['device']}, "
                     f"load {sample['load_at_start']:.1f} | {sample['commit']}, "
                     f"{sample['date']} |")
    return head + "\n".join(lines)


def _best_side(medians: dict, side: str) -> str:
    """The fastest of ``side``'s thread counts in a speed summary's medians."""
    options = [k for k, v in medians.items() if not isinstance(v, dict)
               and (k == side or (k.startswith(f"{side}_") and k.endswith("threads")))]
    return max(options, key=lambda k: medians[k]) if options else side


def _threads_of(side: str) -> str:
    """``<side>_<n>threads`` as "n threads" (a side without the suffix: one thread)."""
    match = re.search(r"_(\d+)threads$", side)
    return f"{match.group(1)} threads" if match else f"{EQUAL_THREADS} thread"


def _over(medians: dict, label: str, other: str) -> str:
    """A speed summary's ratio of ``label`` over ``other`` with its t, or "-"."""
    found = medians.get(f"{label}_over_{other}")
    return "-" if not found else f"{found['ratio_mean']:.2f} (t = {found['ratio_t']:.2f})"


def render_speed(records: list[dict]) -> str:
    """BENCHMARKS.md's table of ``speed.py`` on CPUs: per workload (its newest summary), each
    raysim configuration's rate against the plain loop and the on-device reference at one
    thread and at their best thread count (mean of the per-repeat ratios and its t), where a
    round's time goes, and the workers' py-spy samples."""
    head = ("| workload | device | raysim configuration | rounds/s (median) | plain loop at 1 "
            "thread / at its best | raysim / plain loop at 1 thread (t) | at its best (t) | "
            "raysim / reference at 1 thread (t) | at its best (t) | a round (ms): whole, "
            "dispatch to last reply, a worker's local updates, aggregation | workers (py-spy: "
            "busy share; most samples under) | commit, date | command |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
    found = [r for r in records if r.get("suite") == "speed" and not str(
        r.get("device", "")).startswith("NVIDIA")]
    newest = {(r["workload"], r["device"]): r for r in found if r["side"] == "summary"}
    lines = []
    for (workload, device), summary in sorted(newest.items()):
        medians = summary["medians"]
        runs = [r for r in found if r["workload"] == workload and r["device"] == device
                and r["commit"] == summary["commit"] and "repeat" in r]
        profile = next((r["profile"] for r in found if r["workload"] == workload
                        and r["commit"] == summary["commit"]
                        and r["side"].endswith("_profile")), {})

        plain = _best_side(medians, "plain_pytorch_loop")
        reference = _best_side(medians, "on_device_vmap_reference")
        for label in [k for k in medians if k.startswith("raysim_") and "_over_" not in k
                      and not isinstance(medians[k], dict)]:
            splits = [r["round_split_ms"] for r in runs if r["side"] == label
                      and r.get("round_split_ms")]
            split = ", ".join(f"{statistics.median(s[part] for s in splits):.0f}" for part in
                              ("round", "dispatch_to_replies", "worker_local_updates",
                               "aggregate")) if splits else "-"
            sampled = profile.get("worker") if label == "raysim_2x1cpu" else None
            workers = "-" if sampled is None else f"{sampled['busy_share']:.0%} busy; " + \
                "; ".join(f"{_function(name)} {share:.0%}"
                          for name, share in sampled["top_under_raysim"][:5])
            lines.append(
                f"| {WORKLOADS[workload]} | {device} | {label.removeprefix('raysim_')} | "
                f"{medians[label]:.2f} | {medians['plain_pytorch_loop']:.2f} / "
                f"{medians[plain]:.2f} ({_threads_of(plain)}) | "
                f"{_over(medians, label, 'plain_pytorch_loop')} | "
                f"{_over(medians, label, plain)} | "
                f"{_over(medians, label, 'on_device_vmap_reference')} | "
                f"{_over(medians, label, reference)} | "
                f"{split} | {workers} | {summary['commit']}, {summary['date']} | `python "
                f"experiments/benchmarks/speed.py --workloads {workload} --repeats "
                f"{summary['repeats']} --profile STACKS` |")
    return head + "\n".join(lines)


def _spread(values: list[float], digits: int = 1) -> str:
    """``median (min-max)`` of ``values``, or "-" when there are none."""
    if not values:
        return "-"
    return (f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-"
            f"{max(values):.{digits}f})")


STARTUP_PHASES = ("imports", "data", "ray", "workers", "first_round")
"""The start-up phases of ``startup.py``'s records, in the order a command passes them."""


def render_startup(peer_records: list[dict], startup_records: list[dict]) -> str:
    """BENCHMARKS.md's start-up tables: per workload on CPUs, each whole-process side of the
    newest peers run that recorded the machine's busy CPU seconds (median and range of wall
    and CPU seconds, and the cores they kept busy); then per ``startup.py`` label (its newest
    run of this checkout), the command's seconds, its phases and the machine's CPU seconds."""
    head = ("| workload | side | whole process (s, median and range) | machine busy CPU-s "
            "(median and range) | cores kept busy | / pfl-research 2 proc (mean of alternated "
            "pairs, t, p) | device | commit, date | command |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
    with_cpu = [r for r in peer_records if r.get("machine_cpu_s") is not None
                and r.get("device") == "CPU"]
    lines = []
    for workload in sorted({r["workload"] for r in with_cpu}):
        mine = [r for r in with_cpu if r["workload"] == workload]
        newest = max((r["date"], r["measured_at"], r["commit"]) for r in mine)
        found = [r for r in mine if (r["date"], r["measured_at"], r["commit"]) == newest]
        sides: dict[str, list[dict]] = defaultdict(list)
        for r in found:
            sides[r["side"]].append(r)
        sample = found[0]
        command = (f"`python experiments/benchmarks/peers.py --flower-python FLOWER_PY "
                   f"--pfl-python PFL_PY --workloads {workload} --rounds {sample['rounds']} "
                   f"--repeats {max(len(v) for v in sides.values())}`")
        for side, runs in sorted(sides.items(), key=lambda kv: statistics.median(
                r["wall_s"] for r in kv[1])):
            walls = [r["wall_s"] for r in runs if not r.get("error")]
            cpus = [r["machine_cpu_s"] for r in runs if not r.get("error")]
            busy = (f"{statistics.median(c / w for c, w in zip(cpus, walls, strict=True)):.2f}"
                    if walls else "-")
            against = _against_pairs(runs, sides.get("pfl_research_2proc", []))
            lines.append(f"| {WORKLOADS.get(workload, workload)}, {sample['rounds']} rounds | "
                         f"{side} | {_spread(walls)} | {_spread(cpus)} | {busy} | {against} | "
                         f"{sample['cpus']} CPUs | {sample['commit']}, {sample['date']} | "
                         f"{command} |")
    phases_head = ("| configuration | command (s) | imports | data | Ray | workers | first "
                   "round dispatched | machine busy CPU-s | load at start | device | commit, "
                   "date | command |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | "
                   "--- | --- | --- |\n")
    mine = [r for r in startup_records if r.get("tree", "this") == "this"]
    phase_lines = []
    for label in sorted({r["label"] for r in mine}):
        runs = [r for r in mine if r["label"] == label]
        newest = max((r["date"], r["measured_at"], r["commit"]) for r in runs)
        runs = [r for r in runs if (r["date"], r["measured_at"], r["commit"]) == newest]
        sample = runs[0]
        workload, _, engine = label.partition(" ")
        chosen = (f"--workload {workload} --engines {engine}" if engine
                  else f"--config experiments/{label}.yaml")
        cells = [_spread([r[key] for r in runs]) for key in ("command_s", *STARTUP_PHASES,
                                                              "machine_cpu_s")]
        loads = [r["load_at_start"] for r in runs]
        cores = re.fullmatch(r"cpu-(\d+)cores", sample["device"])
        device = f"{cores.group(1)} CPUs" if cores else sample["device"]
        phase_lines.append(
            f"| {label} | {' | '.join(cells)} | {min(loads):.1f}-{max(loads):.1f} | "
            f"{device} | {sample['commit']}, {sample['date']} | `python experiments/"
            f"benchmarks/startup.py {chosen} --repeats {len(runs)}` |")
    return (head + "\n".join(lines) + "\n\n" + phases_head + "\n".join(phase_lines)).rstrip("\n")


def _against_pairs(runs: list[dict], reference: list[dict]) -> str:
    """A raysim side's whole-process seconds over a reference side's, paired by repeat (the
    sides alternate within a repeat): the mean ratio, its t against 1 and the two-sided p."""
    from scipy import stats

    theirs = {r["repeat"]: r["wall_s"] for r in reference
              if "repeat" in r and not r.get("error")}
    pairs = [(theirs[r["repeat"]], r["wall_s"]) for r in runs
             if r.get("repeat") in theirs and not r.get("error")]
    if not runs[0]["side"].startswith("raysim") or len(pairs) < 2:
        return "-"
    ratios = [ours / reference_s for reference_s, ours in pairs]
    test = stats.ttest_1samp(ratios, 1.0)
    return (f"{statistics.fmean(ratios):.2f} (t = {test.statistic:.2f}, p = {test.pvalue:.2f}, "
            f"{len(pairs)} pairs)")


def render_headline(records: list[dict]) -> str:
    """The README's short table: the CPU rows and the GPU rows of 20 rounds."""
    head = ("| workload | device | raysim | Flower 1.41 | pfl-research 0.6 | raysim vs Flower | "
            "raysim vs pfl-research |\n| --- | --- | --- | --- | --- | --- | --- |\n")
    rows = [row for row in _rows(records) if row["equal_threads"] and (
        row["measure"].startswith("whole process")
        or (row["on_gpu"] and row["measure"].startswith("rounds/s over 20 ")))]
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
            "speed-mechanisms": render_mechanisms(load_mechanism_records()),
            "cluster-bytes": render_cluster_bytes(load_cluster_records()),
            "task-rounds": render_task_rounds(load_task_records()),
            "worker-priority": render_priority(load_suite_records("worker_priority")),
            "client-scale": render_client_scale(load_suite_records("client_scale")),
            "speed-cpu": render_speed(load_suite_records("speed")),
            "startup": render_startup(load_records(), load_suite_records("startup"))}


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
