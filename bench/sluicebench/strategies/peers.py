"""Peers installed from their registries: rivet (crates.io), ConnectorX and DuckDB (PyPI).

Each runs in the mode its documentation recommends for speed ("steelmanned"), at 1, 2 and 4
workers so every sluice row has a peer row with the same parallelism.

rivet: `mode: chunked` on the integer primary key with `parallel: N` (its documented fast
path for large tables), `tuning.profile: fast` (no throttle, 64 MB adaptive batches), Parquet
zstd level 1 like sluice's default. Its chunk size is its default of 100 000 rows, raised so
that there are at most about 8 chunks per worker (fewer, larger queries; rivet's own sizing
guide for 10 M rows is 100 000 rows at parallel 4). State goes to a SQLite file beside the
config in a scratch directory, so every run starts clean.

ConnectorX: see workers/cx.py. DuckDB (its postgres/mysql scanner, `COPY … TO` Parquet with
N threads): see workers/duck.py.
"""

from __future__ import annotations

import json
import math

from sluicebench.strategies.base import Context, Invocation, Strategy, python_env

WORKERS = (1, 2, 4)


def rivet_config(ctx: Context, workers: int) -> dict:
    """The rivet YAML (as a dict; JSON is valid YAML) for one export of the dataset."""
    rows = ctx.dataset.rows
    chunk_size = max(100_000, math.ceil(rows / (8 * workers)))
    source_type = "postgres" if ctx.engine == "pg" else "mysql"
    url = ctx.url.replace("postgres://", "postgresql://", 1)
    table = f"public.{ctx.dataset.table}" if ctx.engine == "pg" else ctx.dataset.table
    return {
        "source": {
            "type": source_type,
            "url": url,
            "tls": {"mode": "disable"},
            "tuning": {"profile": "fast"},
        },
        "exports": [
            {
                "name": ctx.dataset.table,
                "table": table,
                "mode": "chunked",
                "chunk_column": "id",
                "chunk_size": chunk_size,
                "parallel": workers,
                "format": "parquet",
                "compression": "zstd",
                "compression_level": 1,
                "destination": {"type": "local", "path": str(ctx.out)},
            }
        ],
    }


def _rivet(workers: int):
    def build(ctx: Context) -> Invocation:
        if not ctx.tools.rivet:
            raise RuntimeError("rivet is not installed")
        config = ctx.work / "rivet.yaml"
        config.write_text(json.dumps(rivet_config(ctx, workers), indent=2))
        return Invocation(argv=[ctx.tools.rivet, "run", "--config", str(config)], cwd=ctx.work)

    return build


def _cx(workers: int):
    def build(ctx: Context) -> Invocation:
        table = f"public.{ctx.dataset.table}" if ctx.engine == "pg" else ctx.dataset.table
        return Invocation(
            argv=[
                ctx.tools.python,
                "-m",
                "sluicebench.workers.cx",
                "--url",
                ctx.url,
                "--table",
                table,
                "--out",
                str(ctx.out),
                "--partitions",
                str(workers),
            ],
            env=python_env(),
        )

    return build


def _duck(workers: int):
    def build(ctx: Context) -> Invocation:
        table = f"public.{ctx.dataset.table}" if ctx.engine == "pg" else ctx.dataset.table
        return Invocation(
            argv=[ctx.tools.python, "-m", "sluicebench.workers.duck", "--url", ctx.url,
                  "--table", table, "--out", str(ctx.out), "--threads", str(workers)],
            env=python_env(),
        )

    return build


def strategies(engine: str) -> list[Strategy]:
    """rivet, ConnectorX and DuckDB rows for `engine`."""
    out = []
    for n in WORKERS:
        out.append(
            Strategy(
                f"rivet-p{n}",
                "rivet",
                engine,
                n,
                f"rivet chunked on id, parallel {n}, profile fast",
                _rivet(n),
            )
        )
    for n in WORKERS:
        about = (
            f"ConnectorX to Arrow, {n} partitions on id, pyarrow Parquet"
            if n > 1
            else "ConnectorX to Arrow, one query, pyarrow Parquet"
        )
        out.append(Strategy(f"connectorx-p{n}", "connectorx", engine, n, about, _cx(n)))
    for n in WORKERS:
        about = f"DuckDB {'postgres' if engine == 'pg' else 'mysql'} scanner, {n} threads, COPY TO Parquet"
        out.append(Strategy(f"duckdb-p{n}", "duckdb", engine, n, about, _duck(n)))
    return out
