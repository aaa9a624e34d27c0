"""ConnectorX: a partitioned read into one Arrow table, then pyarrow writes it as Parquet.

    python -m sluicebench.workers.cx --url URL --table T --out DIR --partitions N

ConnectorX's documented fast path: `read_sql(..., return_type="arrow", partition_on="id",
partition_num=N)` splits the id range into N queries run on N connections (PostgreSQL's
binary COPY protocol), and returns the whole result in memory; the table is then written
with the same Parquet settings as sluice's defaults (zstd level 1). Prints the row count.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import connectorx as cx
import pyarrow.parquet as pq

from sluicebench.workers.arrowmap import PARQUET_OPTIONS


def main() -> None:
    p = argparse.ArgumentParser(prog="sluicebench.workers.cx")
    p.add_argument("--url", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--partitions", type=int, default=2)
    a = p.parse_args()
    url = a.url.replace("postgres://", "postgresql://", 1)
    kwargs = {"partition_on": "id", "partition_num": a.partitions} if a.partitions > 1 else {}
    table = cx.read_sql(url, f"SELECT * FROM {a.table}", return_type="arrow", **kwargs)
    a.out.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, a.out / "part-0.parquet", **PARQUET_OPTIONS)
    print(table.num_rows)


if __name__ == "__main__":
    main()
