"""The Spark pass (run by bench/spark/run under `sluice-testkit run --pg`): the lab's narrow
and wide tables and a skewed-key copy of the narrow one, each read into `df.write.parquet` by
`spark.read.format("sluice")` and by Spark's JDBC source (`partitionColumn=id`, the table's
min/max as bounds, the PostgreSQL JDBC driver) at equal parallelism — the same number of
partitions on the same local[N] — alternated round by round, one process per case
(`one.py`). Writes results.json and the report (docs/spark/benchmarks.md)."""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sluicebench import datasets  # noqa: E402
from sluicebench.settings import parse_size  # noqa: E402

E = os.environ
URL = E["SLUICE_TEST_PG_URL"]
RESULTS = Path(E["SLUICE_BENCH_RESULTS"])
DOC = Path(E["SLUICE_BENCH_DOC"])
JAR = E["SLUICE_BENCH_JDBC_JAR"]
PARTS = int(E.get("SLUICE_BENCH_PARTITIONS", "8"))
ROUNDS = int(E.get("SLUICE_BENCH_ROUNDS", "2"))


def skewed(c: psycopg.Connection, narrow: str) -> str:
    """A copy of `narrow` whose ids are 90 % dense and 10 % spread a million times wider: the
    key a stride over min..max splits badly (most rows fall in the first partition)."""
    t = narrow.replace("narrow", "skew")
    c.autocommit = True
    if not c.execute("SELECT to_regclass(%s)", (f"public.{t}",)).fetchone()[0]:
        print(f"loading public.{t}", flush=True)
        c.execute(f"CREATE TABLE public.{t} AS SELECT * FROM public.{narrow}")
        c.execute(f"UPDATE public.{t} SET id = id * 1000000 WHERE id % 10 = 0")
        c.execute(f"ALTER TABLE public.{t} ADD PRIMARY KEY (id)")
        c.execute(f"VACUUM (FREEZE, ANALYZE) public.{t}")
    return t


def run_case(reader: str, table: str, sink: str) -> dict:
    out = tempfile.mkdtemp(prefix="spark-bench-")
    args = [sys.executable, str(Path(__file__).with_name("one.py")), reader, URL, f"public.{table}", str(PARTS), out]
    if reader == "jdbc":
        args.append(JAR)
    env = dict(os.environ, SLUICE_BENCH_SINK=sink, SLUICE_BENCH_WARMUP="public.spark_warmup")
    p = subprocess.run(args, capture_output=True, text=True, env=env)
    subprocess.run(["rm", "-rf", out])
    if p.returncode != 0:
        raise SystemExit(f"{reader} {table} {sink} failed:\n{p.stderr[-3000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    print(json.dumps(r), flush=True)
    return r


def main() -> None:
    narrow_rows = parse_size(E.get("SLUICE_BENCH_NARROW", "2m"))
    wide_rows = parse_size(E.get("SLUICE_BENCH_WIDE", "60k"))
    with psycopg.connect(URL) as c:
        narrow = datasets.ensure(c, "narrow", narrow_rows)
        wide = datasets.ensure(c, "wide", wide_rows)
        skew = skewed(c, narrow.table)
        if not c.execute("SELECT to_regclass('public.spark_warmup')").fetchone()[0]:
            c.execute(f"CREATE TABLE public.spark_warmup AS SELECT * FROM public.{narrow.table} WHERE id <= 80000")
            c.execute("ALTER TABLE public.spark_warmup ADD PRIMARY KEY (id)")
            c.execute("VACUUM ANALYZE public.spark_warmup")
        want = {narrow.table: narrow.rows, wide.table: wide.rows, skew: narrow.rows}
    runs = []
    for rnd in range(ROUNDS):
        for table, sink in [(t, s) for s in ("parquet", "noop") for t in want]:
            for reader in (("sluice", "jdbc") if rnd % 2 == 0 else ("jdbc", "sluice")):
                r = run_case(reader, table, sink)
                if r["rows"] != want[table]:
                    raise SystemExit(f"{reader} wrote {r['rows']} rows of {table}, not {want[table]}")
                runs.append(dict(r, round=rnd))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "results.json").write_text(json.dumps(runs, indent=1))
    report(runs, want)


def med(runs, reader, table, key, sink):
    return statistics.median(
        r[key] for r in runs
        if r["reader"] == reader and r["table"] == f"public.{table}" and r["sink"] == sink
    )


def report(runs, want) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Spark: `spark.read.format(\"sluice\")` against Spark's JDBC source",
        "",
        f"Measured {now} by `{E.get('SLUICE_BENCH_COMMAND', 'bench/spark/run')}` on this machine "
        f"({os.cpu_count()} cores, the PostgreSQL server on the same cores), PySpark "
        f"{E.get('SLUICE_BENCH_PYSPARK', '?')} `local[{E.get('SLUICE_BENCH_CORES', '2')}]`, "
        f"{PARTS} partitions for both readers, median of {ROUNDS} alternated rounds, one process "
        f"per case, in a warm session: before the measured read each process reads an 80,000-row "
        f"table with the same reader and partitions (starting Spark's Python workers, loading the "
        f"JDBC driver), as a running application has. Raw figures: `{RESULTS}/results.json`.",
        "",
        "Each case reads the whole table, with every column of every row materialised, into "
        "`df.write.mode(\"overwrite\").parquet(…)` (sink parquet) or Spark's `noop` sink "
        "(the read alone). JDBC: `spark.read.jdbc(…, column=\"id\", lowerBound=min(id), "
        f"upperBound=max(id)+1, numPartitions={PARTS})`, `fetchsize` 10000, the PostgreSQL "
        f"JDBC driver {Path(JAR).name}. sluice: `chunk_size` = table size / {PARTS}, so it "
        "plans as many chunks (key ranges: without a snapshot block each partition is its own "
        "transaction). Client CPU is the Spark process tree's (driver JVM, executors' Python "
        "workers) during the action; RSS is the largest process's peak.",
        "",
        "| table | sink | rows | sluice wall s | JDBC wall s | wall ratio | sluice CPU s | JDBC CPU s | sluice RSS MB | JDBC RSS MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for sink in ("parquet", "noop"):
        for t, rows in want.items():
            sw, jw = med(runs, "sluice", t, "wall", sink), med(runs, "jdbc", t, "wall", sink)
            lines.append(
                f"| {t} | {sink} | {rows:,} | {sw:.1f} | {jw:.1f} | **{sw / jw:.2f}×** | "
                f"{med(runs, 'sluice', t, 'cpu', sink):.1f} | {med(runs, 'jdbc', t, 'cpu', sink):.1f} | "
                f"{med(runs, 'sluice', t, 'rss_kb', sink) / 1024:.0f} | "
                f"{med(runs, 'jdbc', t, 'rss_kb', sink) / 1024:.0f} |"
            )
    lines += ["", "Goal (issue 30): ≤ 0.5× JDBC's wall at equal parallelism. What the figures say is in "
              "docs/spark/README.md.", ""]
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text("\n".join(lines))
    print("\n".join(lines))


main()
