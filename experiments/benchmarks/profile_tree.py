"""Seconds per call path in a py-spy profile (``py-spy record --format raw``, optionally gzipped).

Prints the call tree below the first frame that matches ``--below`` (a regular expression),
``--depth`` frames deep, every path that took at least ``--min-s`` seconds at ``--rate``
samples per second; with ``--modules``, instead the seconds spent importing each module (the
time under each ``<module>`` frame). Frames of Python's import machinery and Ray's method
wrappers are left out of the tree.

    python experiments/benchmarks/profile_tree.py PROFILE.raw.gz --below "ClientWorker.run_round"
    python experiments/benchmarks/profile_tree.py PROFILE.raw.gz --below "worker.py:78" --modules
"""

from __future__ import annotations

import argparse
import gzip
import re
from collections import Counter
from pathlib import Path

HIDDEN = re.compile(r"_bootstrap|_call_with_frames_removed|exec_module|_handle_fromlist|"
                    r"span_wrapper|actor_method_executor|auto_init|client_mode_hook|"
                    r"_wrapped_call_impl|_call_impl|_find_and_load|_load_unlocked")


def read_stacks(path: Path) -> list[tuple[list[str], int]]:
    """(frames outermost first, samples) per line of a raw py-spy profile."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as lines:
        stacks = []
        for line in lines:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack:
                stacks.append((stack.split(";"), int(count)))
        return stacks


def call_tree(stacks: list[tuple[list[str], int]], below: str, depth: int) -> Counter:
    """Samples per call path (tuples of frames, import machinery left out) below ``below``."""
    paths: Counter = Counter()
    for frames, count in stacks:
        first = next((i for i, frame in enumerate(frames) if re.search(below, frame)), None)
        if first is None:
            continue
        kept = [re.sub(r" \((.*/)?", " (", f) for f in frames[first:] if not HIDDEN.search(f)]
        for end in range(1, min(depth + 1, len(kept)) + 1):
            paths[tuple(kept[:end])] += count
    return paths


def module_imports(stacks: list[tuple[list[str], int]], below: str) -> Counter:
    """Samples under each module's import (``<module>`` frames) below ``below``."""
    modules: Counter = Counter()
    for frames, count in stacks:
        if not any(re.search(below, frame) for frame in frames):
            continue
        names = [re.sub(r"^<module> \((.*):\d+\)$", r"\1", f) for f in frames
                 if f.startswith("<module>")]
        for name in dict.fromkeys(names):
            modules[name] += count
    return modules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--below", default=".")
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--min-s", type=float, default=0.1)
    parser.add_argument("--rate", type=float, default=200.0, help="py-spy's -r")
    parser.add_argument("--modules", action="store_true")
    args = parser.parse_args()
    stacks = read_stacks(args.profile)
    if args.modules:
        for name, count in module_imports(stacks, args.below).most_common(25):
            print(f"{count / args.rate:7.2f} s  {name}")
        return
    for path, count in sorted(call_tree(stacks, args.below, args.depth).items()):
        if count / args.rate >= args.min_s:
            print(f"{count / args.rate:7.2f} s  {'  ' * (len(path) - 1)}{path[-1][:110]}")


if __name__ == "__main__":
    main()
