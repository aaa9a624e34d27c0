"""A read into Arrow (or pandas) in this process, with its memory growth: the Python
package's lab rows and their peers.

    python -m sluicebench.workers.pyread LIB --engine pg|mariadb --url URL --table T --workers N

LIB is `sluice` (`sluice.read_arrow(url, table=T, parallel=N)`), `connectorx`
(`connectorx.read_sql(url, "SELECT * FROM T", return_type="arrow", partition_on="id",
partition_num=N)`, its documented fast path) or `pandas` (`pandas.read_sql` on one psycopg or
PyMySQL connection, the classic way). Each returns the whole table in memory and writes
nothing. Prints one JSON line: rows, the returned table's bytes, the read's wall seconds, and
how far the process's peak RSS rose above its RSS before the read (the kernel's peak mark is
reset after the imports, so the interpreter, pyarrow and the library are not counted).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import warnings


def status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    p = argparse.ArgumentParser(prog="sluicebench.workers.pyread")
    p.add_argument("lib", choices=["sluice", "connectorx", "pandas"])
    p.add_argument("--engine", choices=["pg", "mariadb"], default="pg")
    p.add_argument("--url", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args()

    import pyarrow  # noqa: F401  (counted in the baseline, as for every library)

    if a.lib == "sluice":
        import sluice

        def read():
            t = sluice.read_arrow(a.url, table=a.table, parallel=a.workers)
            return t.num_rows, t.nbytes

    elif a.lib == "connectorx":
        import connectorx as cx

        url = a.url.replace("postgres://", "postgresql://", 1)
        kwargs = {"partition_on": "id", "partition_num": a.workers} if a.workers > 1 else {}

        def read():
            t = cx.read_sql(url, f"SELECT * FROM {a.table}", return_type="arrow", **kwargs)
            return t.num_rows, t.nbytes

    else:
        import pandas as pd

        warnings.simplefilter("ignore")  # pandas warns about DBAPI connections other than sqlite
        if a.engine == "pg":
            import psycopg

            conn = psycopg.connect(a.url.replace("postgres://", "postgresql://", 1))
        else:
            from sluicebench import mariadb

            conn = mariadb.connect(a.url)

        def read():
            df = pd.read_sql(f"SELECT * FROM {a.table}", conn)
            return len(df), int(df.memory_usage(deep=True).sum())

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    start = time.perf_counter()
    rows, nbytes = read()
    wall = time.perf_counter() - start
    growth = status("VmHWM") - before
    print(json.dumps({"rows": rows, "result_bytes": nbytes, "read_seconds": wall, "rss_growth_bytes": growth}))


if __name__ == "__main__":
    main()
