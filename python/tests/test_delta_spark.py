"""A Delta table that `sluice stream --format delta` keeps current, read by Apache Spark with
Delta Lake's own reader (`io.delta:delta-spark`, from Maven Central): a reader sluice's
libraries did not write, on the JVM engine most users read Delta tables with. The table must
equal the source table after the snapshot and after a batch of updates, deletes, inserts and a
key update, and its history must show the stream's merges."""

from __future__ import annotations

import subprocess
from decimal import Decimal

from conftest import Pg
from sparkkit import session, spark_home

# Delta Lake's Spark package for the Spark 4.1 the tests install.
DELTA_SPARK = "io.delta:delta-spark_2.13:4.1.0"

SOURCE = "SELECT id, v, n, (extract(epoch FROM ts) * 1000000)::bigint FROM doc ORDER BY id"


def stream(sluice_bin: str, url: str, out) -> None:
    subprocess.run(
        [sluice_bin, "-q", "stream", "--source", url, "--table", "public.doc", "--to", str(out),
         "--format", "delta", "--until-current", "--batch-seconds", "0.2"],
        check=True,
    )


def test_spark_reads_the_streamed_table_as_the_source(pg: Pg, sluice_bin: str, tmp_path) -> None:
    pg.exec(
        "CREATE TABLE doc (id bigint PRIMARY KEY, v text, n numeric(12,2), ts timestamptz);"
        "INSERT INTO doc SELECT g, 'v' || g, g / 4.0, timestamptz '2026-01-01 00:00:00+00'"
        " + g * interval '1 minute' FROM generate_series(1, 500) g"
    )
    stream(sluice_bin, pg.url, tmp_path)
    spark_home()
    spark = session("local[2]", {
        "spark.jars.packages": DELTA_SPARK,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    })
    try:
        table = str(tmp_path / "public.doc")

        def read() -> list:
            df = spark.read.format("delta").load(table)
            df.createOrReplaceTempView("t")
            rows = spark.sql("SELECT id, v, n, unix_micros(ts) FROM t ORDER BY id").collect()
            return [tuple(r) for r in rows]

        assert read() == [tuple(r) for r in pg.rows(SOURCE)]
        pg.exec(
            "UPDATE doc SET v = NULL, n = n + 1 WHERE id <= 50;"
            "DELETE FROM doc WHERE id BETWEEN 100 AND 149;"
            "INSERT INTO doc VALUES (1000, 'new', 1.25, now());"
            "UPDATE doc SET id = 2000 WHERE id = 300"
        )
        stream(sluice_bin, pg.url, tmp_path)
        got = read()
        assert got == [tuple(r) for r in pg.rows(SOURCE)]
        assert len(got) == 451 and got[0][1] is None and got[0][2] == Decimal("1.25")
        history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
        operations = [h["operation"] for h in history]
        assert operations[0] == "MERGE" and operations[-1] == "CREATE TABLE", operations
    finally:
        spark.stop()
