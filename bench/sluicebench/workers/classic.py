"""The five classic Python bulk-read strategies, each writing Parquet through pyarrow.

    python -m sluicebench.workers.classic STRATEGY --engine pg --url URL --table T --out DIR
        [--workers N] [--batch-rows N]

fetchall    one query, every row in memory, one Parquet file
stream      a server-side cursor (PostgreSQL: named cursor; MariaDB: unbuffered), written in
            batches as they arrive
pool        N threads sharing a connection pool, each reading id ranges of --batch-rows rows
            (one query per range) from a shared queue; one file per thread
asyncpg     N asyncpg connections in one event loop, each streaming one id range through a
            cursor (PostgreSQL only); one file per connection
multiproc   N processes, each with its own connection, each streaming one id range; one file
            per process

None of them shares a snapshot between connections: that is the consistency sluice adds.
Prints the number of rows written on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import queue
import threading
from pathlib import Path

from sluicebench.workers.arrowmap import PartWriter, mysql_schema, pg_schema

APP = "sluicebench-python"


# --- connections, for both engines -----------------------------------------------------------


def connect(engine: str, url: str):
    """A DB-API connection; PostgreSQL json/jsonb arrive as text, as Arrow wants them."""
    if engine == "pg":
        import psycopg
        from psycopg.types.string import TextLoader

        conn = psycopg.connect(url, application_name=APP)
        for t in ("json", "jsonb"):
            conn.adapters.register_loader(t, TextLoader)
        return conn
    from sluicebench.mariadb import connect as my_connect

    return my_connect(url)


def schema_of(engine: str, conn, table: str):
    """Arrow schema of the table."""
    if engine == "pg":
        s = pg_schema(conn, f"public.{table}")
        conn.rollback()  # leave no transaction open on a pooled connection
        return s
    return mysql_schema(conn, table)


def quote(engine: str, table: str) -> str:
    """The table's qualified, quoted name (names come from the lab, not from users)."""
    return f'public."{table}"' if engine == "pg" else f"`{table}`"


def id_bounds(engine: str, conn, table: str) -> tuple[int, int]:
    """min(id), max(id)."""
    cur = conn.cursor()
    cur.execute(f"SELECT min(id), max(id) FROM {quote(engine, table)}")
    lo, hi = cur.fetchone()
    cur.close()
    conn.commit()
    return int(lo or 0), int(hi or 0)


def ranges(lo: int, hi: int, n: int) -> list[tuple[int, int]]:
    """n contiguous half-open id ranges covering [lo, hi]."""
    step = max(1, (hi - lo + n) // n)
    return [(a, min(a + step, hi + 1)) for a in range(lo, hi + 1, step)]


def stream_range(
    engine: str, url: str, table: str, lo: int | None, hi: int | None, path: Path, batch_rows: int
) -> int:
    """Stream one id range (or the whole table) through a server-side cursor into one file."""
    conn = connect(engine, url)
    schema = schema_of(engine, conn, table)
    where = "" if lo is None else f" WHERE id >= {int(lo)} AND id < {int(hi)}"
    sql = f"SELECT * FROM {quote(engine, table)}{where}"
    writer = PartWriter(path, schema)
    total = 0
    if engine == "pg":
        with conn.transaction(), conn.cursor(name="sluicebench") as cur:
            cur.itersize = batch_rows
            cur.execute(sql)
            while rows := cur.fetchmany(batch_rows):
                writer.write_rows(rows)
                total += len(rows)
    else:
        import pymysql.cursors

        with conn.cursor(pymysql.cursors.SSCursor) as cur:
            cur.execute(sql)
            while rows := cur.fetchmany(batch_rows):
                writer.write_rows(rows)
                total += len(rows)
    writer.close()
    conn.close()
    return total


# --- the strategies --------------------------------------------------------------------------


def fetchall(a: argparse.Namespace) -> int:
    conn = connect(a.engine, a.url)
    schema = schema_of(a.engine, conn, a.table)
    cur = conn.cursor()
    cur.execute(f"SELECT * FROM {quote(a.engine, a.table)}")
    rows = cur.fetchall()
    writer = PartWriter(a.out / "part-0.parquet", schema)
    writer.write_rows(rows)
    writer.close()
    conn.close()
    return len(rows)


def stream(a: argparse.Namespace) -> int:
    return stream_range(
        a.engine, a.url, a.table, None, None, a.out / "part-0.parquet", a.batch_rows
    )


def pool(a: argparse.Namespace) -> int:
    conns: queue.Queue = queue.Queue()
    for _ in range(a.workers):
        conns.put(connect(a.engine, a.url))
    first = conns.get()
    schema = schema_of(a.engine, first, a.table)
    lo, hi = id_bounds(a.engine, first, a.table)
    conns.put(first)
    work: queue.Queue = queue.Queue()
    for r in ranges(lo, hi, max(1, (hi - lo + a.batch_rows) // a.batch_rows)):
        work.put(r)
    totals = [0] * a.workers

    def worker(i: int) -> None:
        writer = PartWriter(a.out / f"part-{i}.parquet", schema)
        while True:
            try:
                r_lo, r_hi = work.get_nowait()
            except queue.Empty:
                break
            conn = conns.get()  # borrow
            try:
                cur = conn.cursor()
                cur.execute(
                    f"SELECT * FROM {quote(a.engine, a.table)} WHERE id >= %s AND id < %s",
                    (r_lo, r_hi),
                )
                rows = cur.fetchall()
                cur.close()
                conn.commit()
            finally:
                conns.put(conn)  # return
            writer.write_rows(rows)
            totals[i] += len(rows)
        writer.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while not conns.empty():
        conns.get().close()
    return sum(totals)


def asyncpg_fanout(a: argparse.Namespace) -> int:
    if a.engine != "pg":
        raise SystemExit("asyncpg reads PostgreSQL only")
    import asyncpg

    conn = connect(a.engine, a.url)
    schema = schema_of(a.engine, conn, a.table)
    lo, hi = id_bounds(a.engine, conn, a.table)
    conn.close()

    async def one(i: int, r_lo: int, r_hi: int) -> int:
        c = await asyncpg.connect(a.url, server_settings={"application_name": APP})
        writer = PartWriter(a.out / f"part-{i}.parquet", schema)
        total = 0
        async with c.transaction():
            cur = await c.cursor(
                f"SELECT * FROM {quote(a.engine, a.table)} WHERE id >= $1 AND id < $2", r_lo, r_hi
            )
            while rows := await cur.fetch(a.batch_rows):
                writer.write_rows(rows)
                total += len(rows)
        writer.close()
        await c.close()
        return total

    async def main() -> int:
        parts = ranges(lo, hi, a.workers)
        return sum(await asyncio.gather(*(one(i, *r) for i, r in enumerate(parts))))

    return asyncio.run(main())


def _mp_part(job: tuple) -> int:
    engine, url, table, lo, hi, path, batch_rows = job
    return stream_range(engine, url, table, lo, hi, Path(path), batch_rows)


def multiproc(a: argparse.Namespace) -> int:
    conn = connect(a.engine, a.url)
    lo, hi = id_bounds(a.engine, conn, a.table)
    conn.close()
    jobs = [
        (a.engine, a.url, a.table, r_lo, r_hi, str(a.out / f"part-{i}.parquet"), a.batch_rows)
        for i, (r_lo, r_hi) in enumerate(ranges(lo, hi, a.workers))
    ]
    with multiprocessing.get_context("fork").Pool(a.workers) as p:
        return sum(p.map(_mp_part, jobs))


STRATEGIES = {
    "fetchall": fetchall,
    "stream": stream,
    "pool": pool,
    "asyncpg": asyncpg_fanout,
    "multiproc": multiproc,
}


def main() -> None:
    p = argparse.ArgumentParser(prog="sluicebench.workers.classic")
    p.add_argument("strategy", choices=sorted(STRATEGIES))
    p.add_argument("--engine", choices=["pg", "mariadb"], default="pg")
    p.add_argument("--url", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-rows", type=int, default=50_000)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    print(STRATEGIES[a.strategy](a))


if __name__ == "__main__":
    main()
