"""One measured Spark read (run by bench/spark/measure.py, one process per case so no case
warms another's JVM): read TABLE with READER ("sluice" or "jdbc") on local[CORES] in
PARTITIONS partitions and write it with df.write.parquet to OUT. Prints one JSON line: the
action's wall seconds, the client CPU seconds the Spark process tree spent in the action
(driver JVM, Python workers; read from /proc before and after), the peak RSS of the largest
process of the tree, the partitions and rows.

    python one.py READER URL TABLE PARTITIONS OUT [JDBC_JAR]
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import psycopg

TICK = os.sysconf("SC_CLK_TCK")
# "parquet" (default): df.write.parquet; "noop": Spark's noop sink, which materialises every
# column of every row and writes nothing — the read alone.
SINK = os.environ.get("SLUICE_BENCH_SINK", "parquet")


def tree(root: int) -> list:
    """Pids of `root` and every descendant."""
    children: dict = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parts = f.read().rsplit(")", 1)[1].split()
                children.setdefault(int(parts[1]), []).append(int(d))
            except (OSError, IndexError):
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu(root: int) -> float:
    """CPU seconds of the tree: each live process's own time and its waited-for children's."""
    total = 0
    for p in tree(root):
        try:
            with open(f"/proc/{p}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in parts[11:15])  # utime stime cutime cstime
        except (OSError, IndexError):
            pass
    return total / TICK


def rss(root: int) -> int:
    """Largest resident set in the tree, KiB."""
    best = 0
    for p in tree(root):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        best = max(best, int(line.split()[1]))
        except OSError:
            pass
    return best


def frame(spark, reader: str, url: str, table: str, partitions: int):
    """The DataFrame of `table` read by `reader` in `partitions` partitions."""
    if reader == "sluice":
        with psycopg.connect(url) as c:
            (nbytes,) = c.execute("SELECT pg_table_size(%s::regclass)", (table,)).fetchone()
        # As many chunks as the JDBC read has partitions: equal parallelism.
        chunk = max(1 << 16, nbytes // partitions + 1)
        return (spark.read.format("sluice").option("source", url).option("table", table)
                .option("chunk_size", str(chunk)).load())
    with psycopg.connect(url) as c:
        lo, hi = c.execute(f"SELECT min(id), max(id) FROM {table}").fetchone()
    user = url.split("//", 1)[1].split("@", 1)[0]
    hostdb = url.split("@", 1)[1]
    return spark.read.jdbc(
        f"jdbc:postgresql://{hostdb}", table, column="id", lowerBound=lo, upperBound=hi + 1,
        numPartitions=partitions,
        properties={"user": user, "driver": "org.postgresql.Driver", "fetchsize": "10000"},
    )


def main() -> None:
    reader, url, table, partitions, out = sys.argv[1:6]
    jar = sys.argv[6] if len(sys.argv) > 6 else None
    partitions = int(partitions)
    cores = int(os.environ.get("SLUICE_BENCH_CORES", "2"))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(f"local[{cores}]").config("spark.ui.enabled", "false")
         .config("spark.driver.memory", "4g").config("spark.sql.session.timeZone", "UTC"))
    if jar:
        b = b.config("spark.jars", jar)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if reader == "sluice":
        import sluice.spark

        sluice.spark.register(spark)
    # A Spark application reads more than once: the warm-up read of a small table (same
    # reader, same partitions) starts the Python workers and loads the JDBC driver, so the
    # measured read is the one a running application pays for.
    warmup = os.environ.get("SLUICE_BENCH_WARMUP")
    if warmup:
        frame(spark, reader, url, warmup, partitions).write.format("noop").mode("overwrite").save()
    df = frame(spark, reader, url, table, partitions)
    me = os.getpid()
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], rss(me))

    threading.Thread(target=watch, daemon=True).start()
    c0, t0 = cpu(me), time.perf_counter()
    if SINK == "noop":
        df.write.format("noop").mode("overwrite").save()
    else:
        df.write.mode("overwrite").parquet(out)
    wall, used = time.perf_counter() - t0, cpu(me) - c0
    done.set()
    rows = df.count() if SINK == "noop" else spark.read.parquet(out).count()
    print(json.dumps({"reader": reader, "table": table, "sink": SINK, "partitions": df.rdd.getNumPartitions(),
                      "wall": round(wall, 2), "cpu": round(used, 2), "rss_kb": peak[0], "rows": rows}))
    spark.stop()


main()
