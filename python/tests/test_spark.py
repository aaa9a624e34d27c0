"""``spark.read.format("sluice")`` on a ``local[2]`` Spark (the standalone cluster's tests are
``test_spark_cluster.py``): reads equal the source, one snapshot across partitions under a
writer, every PostgreSQL type against the CLI's exports, MariaDB and Firebird per chunk, and
the refusals."""

from __future__ import annotations

import json
import random
import threading
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

import sluice
import sluice.spark
import sparkkit
from conftest import cli_parquet, wait_for

ACCOUNTS = 20_000
BALANCE = Decimal("100.00")


@pytest.fixture(scope="module")
def spark():
    yield from sparkkit.spark_for("local")


def accounts(pg) -> None:
    """`acct`: ACCOUNTS rows of BALANCE (the sum the writer keeps), padded over many pages."""
    pg.exec(
        "CREATE TABLE acct (id bigint PRIMARY KEY, bal numeric(12,2) NOT NULL, pad text);"
        f"INSERT INTO acct SELECT g, {BALANCE}, repeat('p', 200) FROM generate_series(1, {ACCOUNTS}) g;"
        "ANALYZE acct"
    )


class Rollback(Exception):
    """Ends a transfer's transaction without committing it (its second account is gone)."""


class Transfers(threading.Thread):
    """Moves money between accounts in transactions, and closes accounts (their balance moved
    to another, the row deleted) and opens new ones: the sum stays ACCOUNTS × BALANCE while
    rows change, move between pages and come and go."""

    def __init__(self, pg) -> None:
        super().__init__(daemon=True)
        self.conn = pg.connect()
        self.stop = threading.Event()
        self.commits = 0
        self.error = None
        self.next_id = ACCOUNTS + 1

    def run(self) -> None:
        rng = random.Random(7)
        try:
            while not self.stop.is_set():
                try:
                    self.step(rng)
                except Rollback:
                    continue
                self.commits += 1
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def step(self, rng: random.Random) -> None:
        with self.conn.transaction():
            a, b = rng.randint(1, self.next_id - 1), rng.randint(1, self.next_id - 1)
            if rng.random() < 0.2:
                # Close a: its balance to b (when both exist), then delete it; open one.
                row = self.conn.execute("SELECT bal FROM acct WHERE id = %s FOR UPDATE", (a,)).fetchone()
                if row and a != b and self.conn.execute("UPDATE acct SET bal = bal + %s WHERE id = %s", (row[0], b)).rowcount:
                    self.conn.execute("DELETE FROM acct WHERE id = %s", (a,))
                self.conn.execute("INSERT INTO acct VALUES (%s, 0, 'new')", (self.next_id,))
                self.next_id += 1
            else:
                amount = Decimal(rng.randint(1, 500)) / 100
                if self.conn.execute("UPDATE acct SET bal = bal - %s WHERE id = %s", (amount, a)).rowcount:
                    if not self.conn.execute("UPDATE acct SET bal = bal + %s, pad = repeat('q', 300) WHERE id = %s", (amount, b)).rowcount:
                        raise Rollback()

    def halt(self) -> None:
        self.stop.set()
        self.join(timeout=30)
        self.conn.close()
        assert self.error is None, self.error


def read_acct(spark, url: str, snap=None, chunk_size: str = "256kB"):
    r = spark.read.format("sluice").option("source", url).option("table", "public.acct").option("chunk_size", chunk_size)
    if snap is not None:
        r = r.option("snapshot", snap)
    return r.load()


def under_snapshot(pg, snapshot_id: str) -> set:
    """The rows of acct in a transaction that imports the snapshot (an oracle sluice did not
    produce)."""
    with pg.connect() as c:
        c.autocommit = False
        c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        c.execute(f"SET TRANSACTION SNAPSHOT '{snapshot_id}'")
        rows = set(c.execute("SELECT id, bal FROM acct").fetchall())
        c.rollback()
    return rows


def snapshot_read_under_writer(spark, pg) -> None:
    """The consistency check both Spark deployments run."""
    accounts(pg)
    writer = Transfers(pg)
    writer.start()
    try:
        wait_for(lambda: writer.commits > 50, "the writer's first commits")
        with sluice.spark.snapshot(spark, pg.url, tables="public.acct") as snap:
            before = writer.commits
            df = read_acct(spark, pg.url, snap)
            assert df.rdd.getNumPartitions() >= 4
            assert df.schema["id"].metadata["sluice.consistency"] == "snapshot"
            got = {(r["id"], r["bal"]) for r in df.select("id", "bal").collect()}
            oracle = under_snapshot(pg, snap.id)
            during = writer.commits - before
    finally:
        writer.halt()
    assert during > 0, "the writer committed nothing while Spark read: the test proved nothing"
    assert got == oracle
    assert sum(b for _, b in got) == ACCOUNTS * BALANCE
    # The source has moved on since: the read was the snapshot's, not the present's.
    assert set(pg.rows("SELECT id, bal FROM acct")) != got
    report = snap.report
    assert report["snapshot_held_seconds"] > 0
    assert report["harm"]["peak_connections"] >= 1


def test_snapshot_is_one_point_in_time_under_a_writer(spark, pg):
    snapshot_read_under_writer(spark, pg)


def test_read_without_snapshot_equals_source_and_says_per_chunk(spark, pg):
    accounts(pg)
    df = read_acct(spark, pg.url)
    assert df.rdd.getNumPartitions() >= 4
    assert df.schema["bal"].metadata["sluice.consistency"] == "chunk"
    got = sorted((r["id"], r["bal"], r["pad"]) for r in df.collect())
    assert got == sorted(pg.rows("SELECT id, bal, pad FROM acct"))
    # load(path) names the table; options are case-insensitive, as Spark's are.
    df2 = spark.read.format("sluice").option("SOURCE", pg.url).option("Chunk_Size", "1MB").load("acct")
    assert df2.count() == ACCOUNTS


def spark_text_columns(got: pa.Table, parquet: pa.Table) -> list:
    return [
        n for n in parquet.column_names
        if pa.types.is_string(got.schema.field(n).type) and not pa.types.is_string(parquet.schema.field(n).type)
        and not pa.types.is_large_string(parquet.schema.field(n).type)
    ]


def test_every_postgres_type_equals_the_exports(spark, pg, sluice_bin, tmp_path):
    from test_types import PG_TYPES

    pg.exec("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy'); CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
    cols = [(f"c{i}", ty) for i, (ty, _) in enumerate(PG_TYPES)]
    pg.exec(f"CREATE TABLE all_types (id int PRIMARY KEY, {', '.join(f'{n} {t}' for n, t in cols)})")
    for row in range(5):
        values = ", ".join(f"({vals[row]})::{ty}" for ty, vals in PG_TYPES)
        pg.exec(f"INSERT INTO all_types VALUES ({row + 1}, {values})")
    pg.exec("INSERT INTO all_types (id) VALUES (6)")

    got = spark.read.format("sluice").option("source", pg.url).option("table", "all_types").load().toArrow().sort_by("id")
    parquet = cli_parquet(sluice_bin, pg.url, "all_types", tmp_path / "pq").sort_by("id")
    assert got.column_names == parquet.column_names
    text = spark_text_columns(got, parquet)
    # Spark has no type for these: they arrive as text, as the CSV export writes them.
    assert {dict(cols)[c] for c in text} >= {"uuid", "time"}, text
    import subprocess

    subprocess.run([sluice_bin, "-q", "export", "--source", pg.url, "--table", "all_types", "--to", str(tmp_path / "csv"), "--format", "csv"], check=True)
    csv_file = next((tmp_path / "csv").glob("*/*.csv*"))
    csv = pcsv.read_csv(
        csv_file,
        convert_options=pcsv.ConvertOptions(
            column_types={n: pa.string() for n in parquet.column_names},
            strings_can_be_null=True,
            null_values=[""],
            quoted_strings_can_be_null=False,
        ),
    )
    csv = csv.set_column(0, "id", csv.column("id").cast(pa.int32())).sort_by("id")
    for name in parquet.column_names:
        g = got.column(name)
        if name in text:
            assert g.to_pylist() == csv.column(name).to_pylist(), name
            continue
        w = parquet.column(name)
        try:
            w = w.cast(g.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            pytest.fail(f"{name} ({dict(cols).get(name)}): Spark gave {g.type}, the export {w.type}: {e}")
        if pa.types.is_floating(g.type):
            np.testing.assert_array_equal(  # NaN equals NaN
                g.to_numpy(zero_copy_only=False), w.to_numpy(zero_copy_only=False), err_msg=name
            )
        else:
            assert g.combine_chunks().equals(w.combine_chunks()), f"{name} ({dict(cols).get(name)}): {g} != {w}"


def test_mariadb_reads_per_chunk_and_refuses_a_shared_snapshot(spark, my):
    my.exec("CREATE TABLE t (id int PRIMARY KEY, v varchar(20), d decimal(10,2), ts datetime(6))")
    my.exec("INSERT INTO t SELECT seq, CONCAT('v', seq), seq / 100, '2024-01-01 00:00:00' + INTERVAL seq SECOND FROM seq_1_to_5000")
    my.exec("ANALYZE TABLE t")  # the planner sizes chunks from the table's statistics
    df = spark.read.format("sluice").option("source", my.url).option("table", "t").option("chunk_by", "key").option("chunk_size", "32kB").load()
    assert df.schema["id"].metadata["sluice.consistency"] == "chunk"
    assert df.rdd.getNumPartitions() >= 2
    rows = sorted((r["id"], r["v"], r["d"]) for r in df.collect())
    assert rows == [(i, f"v{i}", Decimal(i) / 100) for i in range(1, 5001)]
    with pytest.raises(sluice.ConfigError, match="cannot share one snapshot between sessions"):
        sluice.spark.snapshot(spark, my.url, tables="t")


def test_firebird_reads(spark, fb):
    fb.exec("CREATE TABLE T (ID INTEGER NOT NULL PRIMARY KEY, V VARCHAR(20), D DECIMAL(10,2))")
    fb.exec("INSERT INTO T SELECT FIRST 3000 ROW_NUMBER() OVER (), 'v', 1.25 FROM RDB$TYPES a, RDB$TYPES b")
    df = spark.read.format("sluice").option("source", fb.url).option("table", "T").load()
    assert df.count() == 3000
    assert df.agg({"D": "sum"}).collect()[0][0] == Decimal("3750.00")


def test_refusals_name_the_problem(spark, pg):
    accounts(pg)
    pg.exec("CREATE TABLE other (id int PRIMARY KEY)")
    with sluice.spark.snapshot(spark, pg.url, tables="public.acct") as snap:
        # A table the snapshot's holder does not protect.
        with pytest.raises(Exception, match="does not hold it"):
            spark.read.format("sluice").option("source", pg.url).option("table", "other").option("snapshot", snap).load()
        # consistency=snapshot without a shared snapshot would be a promise nothing keeps.
        with pytest.raises(Exception, match="needs one shared snapshot"):
            spark.read.format("sluice").option("source", pg.url).option("table", "acct").option("consistency", "snapshot").load()
        df = read_acct(spark, pg.url, snap)
    # The snapshot ended with the block: a read started later cannot join it.
    with pytest.raises(Exception, match="invalid snapshot identifier"):
        df.count()
    # An unknown option is named; so is a file-export option.
    with pytest.raises(Exception, match="chunk_sise"):
        spark.read.format("sluice").option("source", pg.url).option("table", "acct").option("chunk_sise", "1MB").load()
    with pytest.raises(Exception, match="for sluice.export"):
        spark.read.format("sluice").option("source", pg.url).option("table", "acct").option("to", "/tmp/x").load()
    # A database nobody listens on: sluice's message (where, why), not only a Java stack.
    bad = "postgres://someone:s3cr3t-pw@127.0.0.1:9/x"
    with pytest.raises(Exception) as e:
        spark.read.format("sluice").option("source", bad).option("table", "acct").load()
    assert "127.0.0.1:9" in str(e.value)
    assert "s3cr3t-pw" not in str(e.value)
    # A snapshot and consistency="chunk" contradict each other.
    with sluice.spark.snapshot(spark, pg.url, tables="public.acct") as snap:
        with pytest.raises(Exception, match="contradict"):
            spark.read.format("sluice").option("source", pg.url).option("table", "acct").option("snapshot", snap).option("consistency", "chunk").load()
