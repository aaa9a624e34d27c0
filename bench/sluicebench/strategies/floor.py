"""The floor: the database's own client dumping the table to /dev/null.

PostgreSQL: psql's `\\copy … TO '/dev/null'` runs `COPY … TO STDOUT` and writes what arrives
to the file, then prints `COPY <rows>`, which is the row check. Binary and text formats.
MariaDB: `mariadb --quick` (rows streamed, not buffered) in batch mode, piped to `wc -l` to
count them (batch mode escapes newlines inside values, so one line is one row).
"""

from __future__ import annotations

from sluicebench.mariadb import cli_args
from sluicebench.strategies.base import Context, Invocation, Strategy, last_int


def _psql(fmt: str):
    def build(ctx: Context) -> Invocation:
        opts = " (FORMAT binary)" if fmt == "binary" else ""
        cmd = f"\\copy public.{ctx.dataset.table} TO '/dev/null'{opts}"
        return Invocation(
            argv=["psql", "-X", "-v", "ON_ERROR_STOP=1", ctx.url, "-c", cmd],
            rows_from_stdout=last_int(r"COPY (\d+)"),
        )

    return build


def _psql_csv(ctx: Context) -> Invocation:
    """psql writing a real CSV file with a header: what a user does without a tool, and the
    natural peer of sluice's CSV output (one connection, one file, checked like sluice's)."""
    ctx.out.mkdir(parents=True, exist_ok=True)  # psql does not create directories
    path = ctx.out / f"{ctx.dataset.table}.csv"
    cmd = f"\\copy public.{ctx.dataset.table} TO '{path}' (FORMAT csv, HEADER)"
    return Invocation(argv=["psql", "-X", "-v", "ON_ERROR_STOP=1", ctx.url, "-c", cmd])


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
