"""File what ``peers_gpu.sh`` brought back from a GPU machine where the pages read it, then
re-render BENCHMARKS.md:

- ``peers_gpu.jsonl`` -> ``records/peers_<device>_<commit>.jsonl``
- ``task_rounds_gpu.jsonl`` -> ``records/task_rounds_<device>_<commit>.jsonl``
- ``estimates.tar`` (one ``<config>_gpu.csv`` per paper-scale config) ->
  ``docs/results/estimates/<config>_gpu.csv``

``<device>`` and ``<commit>`` are read from the records (the GPU's name as a slug, the commit
the measurement ran at). A file already there is appended to, not replaced, for the records;
an estimate replaces its CSV. What was filed is printed; nothing is filed twice.

    python experiments/benchmarks/device/unpack.py FOLDER   # FOLDER: the run's files_at
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from harness import device_slug  # noqa: E402

RECORDS = HERE.parent / "records"
REPOSITORY = HERE.parents[2]
ESTIMATES = REPOSITORY / "docs" / "results" / "estimates"


def _shown(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it."""
    return str(path.relative_to(REPOSITORY)) if path.is_relative_to(REPOSITORY) else str(path)


def file_records(source: Path, suite: str) -> Path | None:
    """Append ``source``'s JSON lines to the suite's record file of their device and commit
    (lines already there are skipped); returns that file."""
    if not source.is_file():
        return None
    lines = [line for line in source.read_text().splitlines() if line.strip()]
    if not lines:
        return None
    first = json.loads(lines[0])
    target = RECORDS / f"{suite}_{device_slug(first['device'])}_{first['commit']}.jsonl"
    known = set(target.read_text().splitlines()) if target.exists() else set()
    new = [line for line in lines if line not in known]
    with target.open("a") as out:
        out.writelines(line + "\n" for line in new)
    print(f"{source.name}: {len(new)} new records -> {_shown(target)}")
    return target


def file_estimates(archive: Path) -> list[Path]:
    """Every ``*_gpu.csv`` of the archive into ``docs/results/estimates/``."""
    if not archive.is_file():
        return []
    filed = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if not (member.isfile() and name.endswith("_gpu.csv")):
                continue
            extracted = tar.extractfile(member)
            assert extracted is not None
            target = ESTIMATES / name
            target.write_bytes(extracted.read())
            filed.append(target)
            print(f"{archive.name}: {name} -> {_shown(target)}")
    return filed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    if not args.folder.is_dir():
        sys.exit(f"unpack.py: no folder at {args.folder}; pass the folder the GPU run's files "
                 "came back to (its files_at).")
    file_records(args.folder / "peers_gpu.jsonl", "peers")
    file_records(args.folder / "task_rounds_gpu.jsonl", "task_rounds")
    file_estimates(args.folder / "estimates.tar")
    subprocess.run([sys.executable, str(HERE.parent / "report.py")], check=True)


if __name__ == "__main__":
    main()
