"""``spark.read.format("sluice")`` on a ``local[2]`` Spark (the standalone cluster's tests are
``test_spark_cluster.py``): reads equal the source, one snapshot across partitions under a
writer, every PostgreSQL type against the CLI's exports, MariaDB and Firebird per chunk, and
the refusals."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import textwrap
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
from conftest import cli_parquet, run_python, wait_for

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
    from test_types import pg_all_types

    cols = pg_all_types(pg)

    got = spark.read.format("sluice").option("source", pg.url).option("table", "all_types").load().toArrow().sort_by("id")
    parquet = cli_parquet(sluice_bin, pg.url, "all_types", tmp_path / "pq").sort_by("id")
    assert got.column_names == parquet.column_names
    text = spark_text_columns(got, parquet)
    # Spark has no type for these: they arrive as text, as the CSV export writes them.
    assert {dict(cols)[c] for c in text} >= {"uuid", "time"}, text
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


@pytest.fixture
def pushdown(spark):
    """The session with filter pushdown on for one test, then off again as Spark's default."""
    sluice.spark.register(spark, filter_pushdown=True)
    try:
        yield spark
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
        sluice.spark.register(spark)


def test_pushed_filters_are_read_at_the_source(pushdown, pg, my):
    from pyspark.sql.functions import col

    spark = pushdown
    # Row 4242 holds NaN in a numeric(10,2) column, which no export can write: a read that
    # reaches it fails. Filters that keep it out are proven to run at the source.
    pg.exec(
        "CREATE TABLE f (id bigint PRIMARY KEY, k int, amount numeric(10,2), note text);"
        "INSERT INTO f SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE g % 50 END,"
        " CASE WHEN g = 4242 THEN 'NaN'::numeric ELSE g / 100.0 END, 'n' || (g % 3)"
        " FROM generate_series(1, 5000) g; ANALYZE f"
    )
    read = lambda: spark.read.format("sluice").option("source", pg.url).option("table", "f").option("chunk_size", "64kB").load()  # noqa: E731
    with pytest.raises(Exception, match="NaN"):
        read().collect()
    df = read().filter(
        (col("id") > 1000) & (col("id") <= 3000) & col("k").isNotNull() & ~(col("k") == 5)
        & col("k").isin(1, 2, 5, 40) & (col("note") == "n1")  # text: Spark's, after the read
    )
    got = sorted(tuple(r) for r in df.select("id", "k", "amount", "note").collect())
    want = sorted(pg.rows(
        "SELECT id, k, amount, note FROM f WHERE id > 1000 AND id <= 3000 AND k IS NOT NULL"
        " AND NOT (k = 5) AND k IN (1, 2, 5, 40) AND note = 'n1'"
    ))
    assert got == want and len(want) > 10
    assert df.rdd.getNumPartitions() >= 4, "every chunk read, each with the filters"
    nulls = read().filter(col("k").isNull() & (col("id") < 100)).select("id").collect()
    assert sorted(r["id"] for r in nulls) == [7 * i for i in range(1, 15)]
    # A filter the source does not compute (text, a fraction) is Spark's alone: the NaN row is
    # read again and the read fails, as without pushdown.
    with pytest.raises(Exception, match="NaN"):
        read().filter(col("amount") < 1.5).collect()
    # MariaDB: the same filters in its SQL.
    my.exec("CREATE TABLE f (id int PRIMARY KEY, k int)")
    my.exec("INSERT INTO f SELECT seq, IF(seq % 7 = 0, NULL, seq % 50) FROM seq_1_to_3000")
    mdf = spark.read.format("sluice").option("source", my.url).option("table", "f").load()
    got = sorted(r["id"] for r in mdf.filter((col("id") >= 2990) | col("k").isNull()).filter(col("id") > 2980).collect())
    assert got == [i for i in range(2981, 3001) if i >= 2990 or i % 7 == 0]


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


FEATURES = """
CREATE TABLE parent (id bigint PRIMARY KEY, name text);
CREATE TABLE child (id bigint PRIMARY KEY, parent_id bigint NOT NULL REFERENCES parent (id) ON DELETE CASCADE, v int);
CREATE TABLE part (id bigint, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k);
CREATE TABLE part_0 PARTITION OF part FOR VALUES FROM (0) TO (50);
CREATE TABLE part_1 PARTITION OF part FOR VALUES FROM (50) TO (100);
CREATE TABLE gen (id bigint PRIMARY KEY, a int, b int GENERATED ALWAYS AS (a * 2) STORED, big text);
CREATE TABLE keyless (a int, b text);
INSERT INTO parent SELECT g, 'p' || g FROM generate_series(1, 2000) g;
INSERT INTO child SELECT g, (g - 1) / 3 + 1, g FROM generate_series(1, 6000) g;
INSERT INTO part SELECT g, g % 100, repeat('v', 100) FROM generate_series(1, 20000) g;
INSERT INTO gen (id, a, big) SELECT g, g, repeat(md5(g::text), 700) FROM generate_series(1, 200) g;
INSERT INTO keyless SELECT g % 500, repeat('k', 150) FROM generate_series(1, 20000) g;
ANALYZE;
"""
FEATURE_TABLES = ["public.parent", "public.child", "public.part", "public.gen", "public.keyless"]


class FeatureWriter(Transfers):
    """Cascaded deletes, rows moved between partitions, generated columns and large values
    rewritten, rows of a table without a key inserted and deleted."""

    def step(self, rng: random.Random) -> None:
        with self.conn.transaction():
            p = rng.randint(1, 2000)
            self.conn.execute("DELETE FROM parent WHERE id = %s", (p,))  # its children cascade
            self.conn.execute("INSERT INTO parent VALUES (%s, 'again') ON CONFLICT DO NOTHING", (p,))
            self.conn.execute("UPDATE part SET k = (k + 50) %% 100 WHERE id = %s", (rng.randint(1, 20000),))
            self.conn.execute("UPDATE gen SET a = a + 1, big = big || 'x' WHERE id = %s", (rng.randint(1, 200),))
            self.conn.execute("DELETE FROM keyless WHERE ctid = (SELECT ctid FROM keyless WHERE a = %s LIMIT 1)", (rng.randint(0, 499),))
            self.conn.execute("INSERT INTO keyless VALUES (%s, 'new')", (rng.randint(0, 499),))


READ_FEATURES = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    import psycopg, sparkkit, sluice.spark
    url, tables = {url!r}, {tables!r}
    spark = sparkkit.session("local[2,4]")
    out = {{}}
    with sluice.spark.snapshot(spark, url, tables=tables) as snap:
        for t in tables:
            df = (spark.read.format("sluice").option("source", url).option("table", t)
                  .option("chunk_size", "64kB").option("snapshot", snap).load())
            got = sorted(repr(tuple(r)) for r in df.collect())
            with psycopg.connect(url) as c:
                c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                c.execute(f"SET TRANSACTION SNAPSHOT '{{snap.id}}'")
                want = sorted(repr(tuple(r)) for r in c.execute(f"SELECT * FROM {{t}}").fetchall())
                c.rollback()
            out[t] = [len(got), len(want), got == want, df.rdd.getNumPartitions()]
    print(json.dumps(out))
    spark.stop()
    """
)


def test_schema_features_under_a_writer_and_a_killed_task(pg, tmp_path):
    pg.exec(FEATURES)
    writer = FeatureWriter(pg)
    writer.start()
    try:
        wait_for(lambda: writer.commits > 20, "the writer's first commits")
        before = writer.commits
        # Every Python worker's first batch waits; the first to get there is killed mid-chunk
        # (as a lost executor leaves it), the rest let go; Spark reads that chunk again.
        fp = tmp_path / "fp"
        fp.mkdir()
        code = READ_FEATURES.format(tests=str(Path(__file__).parent), url=pg.url, tables=FEATURE_TABLES)
        p = run_python(code, env={"SLUICE_FAILPOINTS": "export.after_batch=wait@1", "SLUICE_FAILPOINT_DIR": str(fp)})
        reached = fp / "export.after_batch.reached"
        wait_for(lambda: reached.exists() and reached.read_text(), "a task at its first batch", timeout=120)
        os.kill(int(reached.read_text()), signal.SIGKILL)
        (fp / "export.after_batch.release").touch()
        stdout, stderr = p.communicate(timeout=300)
        during = writer.commits - before
    finally:
        writer.halt()
    assert p.returncode == 0, stderr[-3000:]
    got = json.loads(stdout.strip().splitlines()[-1])
    assert during > 0, "the writer committed nothing during the reads"
    for t in FEATURE_TABLES:
        n, want, same, parts = got[t]
        assert same and n == want > 0, f"{t}: Spark read {n} rows, the snapshot holds {want}"
    assert got["public.part"][3] >= 2 and got["public.keyless"][3] >= 2
