"""An Iceberg table that `sluice.export(format="iceberg")` makes, read by Apache Spark with
Apache Iceberg's own Java runtime (`org.apache.iceberg:iceberg-spark-runtime`, from Maven
Central) through Iceberg's JDBC catalog on the SQLite file sluice registered the table in: a
reader and a catalog client sluice's libraries did not write, on the engine most users read
Iceberg tables with. The table must equal the source table, with the key as identifier field
and the export's snapshot position in the snapshot's summary."""

from __future__ import annotations

from decimal import Decimal

import sluice
from conftest import Pg
from sparkkit import session, spark_home

# Iceberg's Spark runtime for the Spark 4.1 the tests install, and the SQLite JDBC driver.
PACKAGES = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0,org.xerial:sqlite-jdbc:3.50.3.0"

SOURCE = (
    "SELECT id, v, n, (extract(epoch FROM ts) * 1000000)::bigint, tags, u::text, small"
    " FROM doc ORDER BY id"
)


def test_spark_reads_the_exported_table_as_the_source(pg: Pg, tmp_path) -> None:
    pg.exec(
        "CREATE TABLE doc (id bigint PRIMARY KEY, v text, n numeric(12,2), ts timestamptz,"
        " tags int[], u uuid, small smallint);"
        "INSERT INTO doc SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE 'v' || g END, g / 4.0,"
        " timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute', ARRAY[g, g + 1],"
        " md5(g::text)::uuid, (g % 100)::smallint FROM generate_series(1, 3000) g"
    )
    report = sluice.export(
        pg.url, table="public.doc", to=tmp_path, format="iceberg", namespace="lake",
        parallel=2, chunk_size="64KB",
    )
    assert report["datasets"][0]["rows"] == 3000
    spark_home()
    spark = session("local[2]", {
        "spark.jars.packages": PACKAGES,
        "spark.sql.extensions":
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.sql.catalog.sluice": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.sluice.type": "jdbc",
        "spark.sql.catalog.sluice.uri": f"jdbc:sqlite:{tmp_path / 'catalog.db'}",
        "spark.sql.catalog.sluice.warehouse": f"file://{tmp_path}",
    })
    try:
        rows = spark.sql(
            "SELECT id, v, n, unix_micros(ts), tags, u, small FROM sluice.lake.doc ORDER BY id"
        ).collect()
        got = [tuple(list(c) if isinstance(c, list) else c for c in r) for r in rows]
        want = [tuple(r) for r in pg.rows(SOURCE)]
        assert got == want
        assert got[6][1] is None and got[0][2] == Decimal("0.25")
        files = spark.sql("SELECT count(*) FROM sluice.lake.doc.files").collect()[0][0]
        assert files >= 2, files
        summary = spark.sql(
            "SELECT summary FROM sluice.lake.doc.snapshots"
        ).collect()
        assert len(summary) == 1
        assert summary[0]["summary"]["sluice.source.position"]
        assert summary[0]["summary"]["sluice.consistency"] == "snapshot"
    finally:
        spark.stop()
