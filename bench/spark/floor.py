"""The floor of PySpark's Python Data Source API on this machine: a data source with no
database, whose read() yields in-memory Arrow batches of narrow-like rows (id, quantity,
account text, price, timestamp; 8 partitions of 250,000 rows in batches of 50,000), written
to Spark's noop sink twice in one session — the first time with the Python workers' start,
then warm. What any reader on this API pays before it reads a byte (docs/spark/README.md).

    ~/.cache/sluice/python-venv/bin/python bench/spark/floor.py
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

ROWS, BATCH, PARTS = 250_000, 50_000, 8


class Floor(DataSource):
    @classmethod
    def name(cls) -> str:
        return "floor"

    def schema(self) -> str:
        return "id long, quantity int, account string, price double, created_at timestamp"

    def reader(self, schema):
        return Reader()


class Reader(DataSourceReader):
    def partitions(self):
        return [InputPartition(i) for i in range(PARTS)]

    def read(self, partition):
        for lo in range(0, ROWS, BATCH):
            ids = np.arange(lo, lo + BATCH, dtype=np.int64)
            yield pa.RecordBatch.from_arrays(
                [pa.array(ids), pa.array((ids % 100).astype(np.int32)),
                 pa.array([f"acct-{i % 9973:06d}" for i in ids]), pa.array(ids * 0.5),
                 pa.array(ids * 1_000_000, type=pa.timestamp("us", tz="UTC"))],
                names=["id", "quantity", "account", "price", "created_at"],
            )


def main() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(Floor)
    df = spark.read.format("floor").load()
    for label in ("cold", "warm"):
        t = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        print(f"{label}: {time.perf_counter() - t:.2f} s for {ROWS * PARTS:,} rows")
    t = time.perf_counter()
    sum(b.num_rows for b in Reader().read(None))
    print(f"making one partition's batches in Python alone: {time.perf_counter() - t:.2f} s")
    spark.stop()


main()
