"""Reads into Python memory: the Python package (`sluice-py-p{1,2,4}`,
`sluice.read_arrow` to a pyarrow.Table) next to ConnectorX returning Arrow
(`connectorx-arrow-p{1,2,4}`) and pandas (`pandas-read-sql`). Nothing is written: rows and the
process's memory growth come from the worker's JSON line (workers/pyread.py), which the lab
keeps as the run's tool report.

The sluice package is the native module of the lab's release build assembled with the
Python files (bench/run sets SLUICE_BENCH_PYTHON_PKG); without it the sluice rows fail with
the reason.
"""

from __future__ import annotations

import os

from sluicebench.strategies.base import Context, Invocation, Strategy, last_int, python_env

WORKERS = (1, 2, 4)


def _build(lib: str, workers: int):
    def build(ctx: Context) -> Invocation:
        env = python_env()
        if lib == "sluice":
            pkg = os.environ.get("SLUICE_BENCH_PYTHON_PKG")
            if not pkg:
                raise RuntimeError("the sluice Python package was not assembled (SLUICE_BENCH_PYTHON_PKG)")
            env["PYTHONPATH"] = pkg + ":" + env["PYTHONPATH"]
        table = f"public.{ctx.dataset.table}" if ctx.engine == "pg" else ctx.dataset.table
        return Invocation(
            argv=[
                ctx.tools.python,
                "-m",
                "sluicebench.workers.pyread",
                lib,
                "--engine",
                ctx.engine,
                "--url",
                ctx.url,
                "--table",
                table,
                "--workers",
                str(workers),
            ],
            env=env,
            rows_from_stdout=last_int(r'"rows": (\d+)'),
        )

    return build


def strategies(engine: str) -> list[Strategy]:
    """The in-memory reads for `engine`."""
    out = []
    for n in WORKERS:
        out.append(
            Strategy(
                f"sluice-py-p{n}",
                "sluice-py",
                engine,
                n,
                f"sluice.read_arrow to a pyarrow.Table, parallel {n}",
                _build("sluice", n),
                writes_files=False,
            )
        )
    for n in WORKERS:
        out.append(
            Strategy(
                f"connectorx-arrow-p{n}",
                "connectorx",
                engine,
                n,
                f"connectorx.read_sql to Arrow, {n} partition(s) on id, nothing written",
                _build("connectorx", n),
                writes_files=False,
            )
        )
    out.append(
        Strategy(
            "pandas-read-sql",
            "python",
            engine,
            1,
            "pandas.read_sql on one connection, to a DataFrame, nothing written",
            _build("pandas", 1),
            writes_files=False,
        )
    )
    return out
