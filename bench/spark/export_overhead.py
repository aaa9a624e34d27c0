"""The distributed export's overhead (run by `bench/spark/run --export-overhead` under
`sluice-testkit run --pg`): the lab's narrow table exported to Parquet by `sluice export
--parallel N` and by `sluice.spark.export(…, parallel=N)` on `local[N]`, for N = 1, 2, 4, the
same chunk size, alternated; the Spark runs in a warm session (a small export first). Writes
the table into docs/spark/benchmarks.md's "Distributed export" section (appended)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sluicebench import datasets  # noqa: E402
from sluicebench.settings import parse_size  # noqa: E402

E = os.environ
URL = E["SLUICE_TEST_PG_URL"]
SLUICE = E["SLUICE_BENCH_SLUICE"]
DOC = Path(E["SLUICE_BENCH_DOC"])
ROUNDS = int(E.get("SLUICE_BENCH_ROUNDS", "2"))

SPARK = """
import json, os, shutil, sys, time
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
import sluice.spark
n, url, table, chunk, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
spark = (SparkSession.builder.master(f"local[{n}]").config("spark.ui.enabled", "false")
         .config("spark.driver.memory", "2g").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
sluice.spark.export(spark, url, to=out + "-warm", table="public.spark_warmup", parallel=n, chunk_size="256kB")
t = time.perf_counter()
r = sluice.spark.export(spark, url, to=out, table=table, parallel=n, chunk_size=chunk)
print(json.dumps({"wall": time.perf_counter() - t, "rows": r["rows"]}))
spark.stop()
"""


def cli(n: int, table: str, chunk: str, out: str) -> float:
    t = time.perf_counter()
    subprocess.run([SLUICE, "-q", "export", "--source", URL, "--table", table, "--to", out,
                    "--parallel", str(n), "--chunk-size", chunk], check=True)
    return time.perf_counter() - t


def spark(n: int, table: str, chunk: str, out: str) -> float:
    p = subprocess.run([sys.executable, "-c", SPARK, str(n), URL, table, chunk, out],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"spark export failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])["wall"]


def main() -> None:
    rows = parse_size(E.get("SLUICE_BENCH_NARROW", "2m"))
    with psycopg.connect(URL) as c:
        narrow = datasets.ensure(c, "narrow", rows)
        c.autocommit = True
        if not c.execute("SELECT to_regclass('public.spark_warmup')").fetchone()[0]:
            c.execute(f"CREATE TABLE public.spark_warmup AS SELECT * FROM public.{narrow.table} WHERE id <= 80000")
            c.execute("ALTER TABLE public.spark_warmup ADD PRIMARY KEY (id)")
    table = f"public.{narrow.table}"
    chunk = str(narrow.table_bytes // 8 + 1)
    walls: dict = {}
    for rnd in range(ROUNDS):
        for n in (1, 2, 4):
            for how in (("cli", "spark") if rnd % 2 == 0 else ("spark", "cli")):
                out = tempfile.mkdtemp(prefix="spark-export-")
                shutil.rmtree(out)
                wall = (cli if how == "cli" else spark)(n, table, chunk, out)
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(out + "-warm", ignore_errors=True)
                walls.setdefault((how, n), []).append(wall)
                print(json.dumps({"how": how, "n": n, "wall": round(wall, 2)}), flush=True)
    lines = [
        "",
        "## Distributed export: Spark's overhead",
        "",
        f"`{narrow.table}` ({narrow.rows:,} rows) to local Parquet in 8 chunks: `sluice export "
        "--parallel N` against `sluice.spark.export(…, parallel=N)` on `local[N]` (a warm "
        f"session: a small export first), median of {ROUNDS} alternated rounds, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, `{E.get('SLUICE_BENCH_COMMAND', '')}`. "
        "The two write the same parts (the distributed export's test checks it); the difference is "
        "Spark's scheduling, its Python workers and a session per task.",
        "",
        "| N | sluice export s | Spark export s | ratio |",
        "|---:|---:|---:|---:|",
    ]
    for n in (1, 2, 4):
        c_, s_ = statistics.median(walls[("cli", n)]), statistics.median(walls[("spark", n)])
        lines.append(f"| {n} | {c_:.2f} | {s_:.2f} | {s_ / c_:.2f}× |")
    lines.append("")
    with open(DOC, "a") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


main()
