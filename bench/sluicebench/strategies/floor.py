"""The floor: the database's own client dumping the table to /dev/null.

PostgreSQL: psql's `\\copy … TO '/dev/null'` runs `COPY … TO STDOUT` and writes what arrives
to the file, then prints `COPY <rows>`, which is the row check. Binary and text formats.
`floor-copy-binary-pN` runs N such copies at once, each over 1/N of the heap pages
(workers/floorpar.py): the floor for N connections, next to sluice with N workers.
MariaDB: `mariadb --quick` (rows streamed, not buffered) in batch mode, piped to `wc -l` to
count them (batch mode escapes newlines inside values, so one line is one row).
"""

from __future__ import annotations

import os
import subprocess

from sluicebench.mariadb import cli_args
from sluicebench.strategies.base import Context, Invocation, Strategy, last_int, python_env

# Connection counts of the parallel floor (`floor-copy-binary-pN`).
PARALLEL = (2, 4, 8, 16)


def _psql(fmt: str):
    def build(ctx: Context) -> Invocation:
        opts = " (FORMAT binary)" if fmt == "binary" else ""
        cmd = f"\\copy public.{ctx.dataset.table} TO '/dev/null'{opts}"
        return Invocation(
            argv=[psql_program(), "-X", "-v", "ON_ERROR_STOP=1", ctx.url, "-c", cmd],
            rows_from_stdout=last_int(r"COPY (\d+)"),
        )

    return build


def psql_program() -> str:
    """The psql the floors run: $SLUICE_BENCH_PSQL (a server's own bin/psql), else `psql`."""
    return os.environ.get("SLUICE_BENCH_PSQL") or "psql"


def _psql_parallel(workers: int):
    def build(ctx: Context) -> Invocation:
        pages = subprocess.run(
            [psql_program(), "-X", "-At", ctx.url, "-c",
             f"SELECT relpages FROM pg_class WHERE oid = 'public.{ctx.dataset.table}'::regclass"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        return Invocation(
            argv=[
                ctx.tools.python, "-m", "sluicebench.workers.floorpar",
                "--psql", psql_program(), "--url", ctx.url,
                "--table", f"public.{ctx.dataset.table}",
                "--pages", pages, "--workers", str(workers),
            ],
            env=python_env(),
            rows_from_stdout=last_int(r"COPY (\d+)"),
        )

    return build


def _psql_csv(ctx: Context) -> Invocation:
    """psql writing a real CSV file with a header: what a user does without a tool, and the
    natural peer of sluice's CSV output (one connection, one file, checked like sluice's)."""
    ctx.out.mkdir(parents=True, exist_ok=True)  # psql does not create directories
    path = ctx.out / f"{ctx.dataset.table}.csv"
    cmd = f"\\copy public.{ctx.dataset.table} TO '{path}' (FORMAT csv, HEADER)"
    return Invocation(argv=[psql_program(), "-X", "-v", "ON_ERROR_STOP=1", ctx.url, "-c", cmd])


def _mariadb(ctx: Context) -> Invocation:
    # The client's arguments are passed as the script's positional parameters: no quoting.
    script = 'mariadb "$@" | wc -l'
    return Invocation(
        argv=[
            "bash",
            "-o",
            "pipefail",
            "-c",
            script,
            "floor",
            *cli_args(ctx.url),
            "--quick",
            "--batch",
            "--skip-column-names",
            "--execute",
            f"SELECT * FROM {ctx.dataset.table}",
        ],
        rows_from_stdout=last_int(r"(\d+)"),
    )


def strategies(engine: str) -> list[Strategy]:
    """The floor rows for `engine`."""
    if engine == "pg":
        return [
            Strategy(
                "floor-copy-binary",
                "floor",
                engine,
                1,
                "psql \\copy … (FORMAT binary) to /dev/null",
                _psql("binary"),
                writes_files=False,
            ),
            *(
                Strategy(
                    f"floor-copy-binary-p{n}",
                    "floor",
                    engine,
                    n,
                    f"{n} × psql \\copy … (FORMAT binary) over 1/{n} of the pages each, to /dev/null",
                    _psql_parallel(n),
                    writes_files=False,
                )
                for n in PARALLEL
            ),
            Strategy(
                "floor-copy-text",
                "floor",
                engine,
                1,
                "psql \\copy … (text) to /dev/null",
                _psql("text"),
                writes_files=False,
            ),
            Strategy(
                "psql-csv-file",
                "psql",
                engine,
                1,
                "psql \\copy … (FORMAT csv, HEADER) to a CSV file",
                _psql_csv,
            ),
        ]
    return [
        Strategy(
            "floor-mariadb-quick",
            "floor",
            engine,
            1,
            "mariadb --quick --batch to a pipe (wc -l)",
            _mariadb,
            writes_files=False,
        ),
    ]
