"""The five classic Python bulk-read strategies (programs in workers/classic.py)."""

from __future__ import annotations

from sluicebench.strategies.base import Context, Invocation, Strategy, python_env

# name → (program strategy, workers, about, engines)
CLASSICS = [
    ("py-fetchall", "fetchall", 1, "one query, fetchall(), one Parquet file", ("pg", "mariadb")),
    ("py-stream", "stream", 1, "server-side cursor, fetchmany batches", ("pg", "mariadb")),
    ("py-pool-p2", "pool", 2, "2 threads, connection pool, id ranges", ("pg", "mariadb")),
    ("py-asyncpg-p2", "asyncpg", 2, "asyncpg, 2 connections, cursor per id range", ("pg",)),
    (
        "py-multiproc-p2",
        "multiproc",
        2,
        "2 processes, id ranges, server-side cursors",
        ("pg", "mariadb"),
    ),
]


def _build(program: str, workers: int):
    def build(ctx: Context) -> Invocation:
        return Invocation(
            argv=[
                ctx.tools.python,
                "-m",
                "sluicebench.workers.classic",
                program,
                "--engine",
                ctx.engine,
                "--url",
                ctx.url,
                "--table",
                ctx.dataset.table,
                "--out",
                str(ctx.out),
                "--workers",
                str(workers),
                "--batch-rows",
                str(ctx.batch_rows),
            ],
            env=python_env(),
        )

    return build


def strategies(engine: str) -> list[Strategy]:
    """Classic rows for `engine`."""
    return [
        Strategy(name, "python", engine, workers, about, _build(program, workers))
        for name, program, workers, about, engines in CLASSICS
        if engine in engines
    ]
