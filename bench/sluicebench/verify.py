"""Checking an export: the right number of rows, every id once (by the sum of ids).

Reads the data files a strategy wrote with pyarrow, independently of the tool that wrote
them: Parquet row counts from the footers plus the `id` column, CSV through pyarrow's
streaming reader (quoted newlines allowed). Files under `_sluice/` and manifests are not data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq


@dataclass
class Output:
    """What a strategy left on disk."""

    files: int
    bytes: int
    rows: int
    id_sum: int


def data_files(root: Path) -> list[Path]:
    """Parquet and CSV files under root, excluding bookkeeping (sluice's, a Delta table's log)."""
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix in (".parquet", ".csv")
        and "_sluice" not in p.parts
        and "_delta_log" not in p.parts
        and not p.name.startswith(".")
    )


def _id_sum(column) -> int:
    s = pc.sum(column).as_py()
    return int(s or 0)


def inspect(root: Path) -> Output:
    """Count rows and sum ids of every data file under root."""
    files = data_files(root)
    rows = ids = size = 0
    for f in files:
        size += f.stat().st_size
        if f.suffix == ".parquet":
            pf = pq.ParquetFile(f)
            rows += pf.metadata.num_rows
            for batch in pf.iter_batches(columns=["id"], batch_size=1 << 20):
                ids += _id_sum(batch.column(0))
        else:
            reader = pacsv.open_csv(
                f,
                parse_options=pacsv.ParseOptions(newlines_in_values=True),
                convert_options=pacsv.ConvertOptions(include_columns=["id"]),
                read_options=pacsv.ReadOptions(block_size=16 << 20),
            )
            for batch in reader:
                rows += batch.num_rows
                ids += _id_sum(batch.column(0))
    return Output(files=len(files), bytes=size, rows=rows, id_sum=ids)
