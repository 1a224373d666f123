"""A results directory kept for years and copied between machines: a part damaged after it
was written (a flipped bit, a truncated copy) is caught when read, never returned as numbers,
and reported as one paragraph naming the file and how to recover."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from raysim.cli import main
from raysim.errors import RaysimError
from raysim.results import load
from raysim.results.manifest import write_manifest
from raysim.results.sink import ParquetSink


def _run(tmp_path, rounds: int = 20):
    run_dir = tmp_path / "results" / "demo-20260101-100000" / "seed_0"
    run_dir.mkdir(parents=True)
    write_manifest(run_dir, {"name": "demo", "algorithm": "fedavg", "seed": 0,
                             "status": "completed", "config": {"name": "demo"}})
    sink = ParquetSink(run_dir)
    values = np.random.default_rng(0).random(rounds)
    sink.add("rounds", [{"round": r, "accuracy": float(v), "macro_f1": float(v) / 2}
                        for r, v in enumerate(values)])
    sink.flush()
    return run_dir, run_dir / "rounds" / "part-000000.parquet"


def _flip_in_column(part, column: str) -> None:
    """Flip one bit in the middle of ``column``'s first data page."""
    chunk = pq.ParquetFile(part).metadata.row_group(0).column(
        pq.ParquetFile(part).schema_arrow.get_field_index(column))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(part.read_bytes())
    data[start + chunk.total_compressed_size // 2] ^= 0x10
    part.write_bytes(bytes(data))


def test_parts_carry_page_checksums_and_a_flipped_bit_is_caught(tmp_path):
    run_dir, part = _run(tmp_path)
    reference = load(run_dir)
    _flip_in_column(part, "macro_f1")
    assert pq.read_table(part).num_rows == 20  # without the check the flip reads as numbers
    with pytest.raises(RaysimError) as error:
        load(run_dir)
    message = str(error.value)
    assert str(part) in message and "damaged" in message and "--resume" in message
    assert "\n" not in message
    assert len(reference) == 20


@pytest.mark.parametrize("damage", ["flipped bit", "truncated", "empty"])
def test_report_on_a_damaged_part_is_one_paragraph_and_exit_2(tmp_path, capsys, damage):
    run_dir, part = _run(tmp_path)
    if damage == "flipped bit":
        _flip_in_column(part, "accuracy")
    elif damage == "truncated":
        part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    else:
        part.write_bytes(b"")
    code = main(["report", str(run_dir.parent)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.count("error:") == 1, err
    assert str(part) in err and "damaged" in err
