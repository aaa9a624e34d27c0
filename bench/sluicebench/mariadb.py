"""MariaDB (and MySQL) support: connections, the client's flags, and copying datasets over.

The datasets are generated in PostgreSQL only; MariaDB receives the same rows through
`COPY … TO` (text format: tab-separated, backslash escapes, `\\N` for NULL — the format
`LOAD DATA` reads by default), so both engines serve byte-identical data.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the stand-alone lab runs without psycopg
    import psycopg

from sluicebench.datasets import Dataset

# PostgreSQL column type → MariaDB column type, for the two datasets.
TYPES = {
    "bigint": "BIGINT",
    "integer": "INT",
    "smallint": "SMALLINT",
    "double precision": "DOUBLE",
    "timestamp with time zone": "DATETIME(6)",
    "timestamp without time zone": "DATETIME(6)",
    "boolean": "BOOLEAN",
    "text": "LONGTEXT",
    "jsonb": "JSON",
    "date": "DATE",
}


def _parts(url: str) -> dict:
    u = urlsplit(url)
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": unquote(u.username or "root"),
        "password": unquote(u.password or ""),
        "database": (u.path or "/").lstrip("/") or "mysql",
    }


def connect(url: str, **kw):
    """A pymysql connection (autocommit)."""
    import pymysql

    p = _parts(url)
    return pymysql.connect(
        host=p["host"],
        port=p["port"],
        user=p["user"],
        password=p["password"],
        database=p["database"],
        autocommit=True,
        **kw,
    )


def cli_args(url: str) -> list[str]:
    """Flags for the `mariadb` client (password through MYSQL_PWD is not used: test servers)."""
    p = _parts(url)
    args = [f"--host={p['host']}", f"--port={p['port']}", f"--user={p['user']}"]
    if p["password"]:
        args.append(f"--password={p['password']}")
    return [*args, p["database"]]


def with_database(url: str, db: str) -> str:
    """The same server, another database."""
    u = urlsplit(url)
    return u._replace(path="/" + db).geturl()


def ensure_database(url: str, db: str) -> str:
    """Create `db` if missing; return its URL."""
    conn = connect(url)
    with conn.cursor() as c:
        c.execute(f"CREATE DATABASE IF NOT EXISTS `{db}`")
    conn.close()
    return with_database(url, db)


def _mysql_type(pg_type: str) -> str:
    if pg_type.startswith("numeric"):
        return pg_type.replace("numeric", "DECIMAL")
    if pg_type.startswith("character varying"):
        return pg_type.replace("character varying", "VARCHAR")
    if pg_type.startswith("character"):
        return pg_type.replace("character", "CHAR")
    return TYPES.get(pg_type, "LONGTEXT")


def copy_dataset(
    pg_conn: psycopg.Connection,
    pg_url: str,
    my_url: str,
    ds: Dataset,
    log: Callable[[str], None] = print,
) -> None:
    """Make MariaDB's table `ds.table` hold the same rows as PostgreSQL's (skipped if it does)."""
    my = connect(my_url, local_infile=True)
    with my.cursor() as c:
        c.execute(
            "SELECT table_comment FROM information_schema.tables "
            "WHERE table_schema = database() AND table_name = %s",
            (ds.table,),
        )
        row = c.fetchone()
    (comment,) = pg_conn.execute(
        "SELECT obj_description(%s::regclass, 'pg_class')", (f"public.{ds.table}",)
    ).fetchone()
    marker = (comment or "")[:60]
    if row and row[0] == marker:
        my.close()
        return
    log(f"copying {ds.label} to MariaDB")
    cols = pg_conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull FROM pg_attribute a "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (f"public.{ds.table}",),
    ).fetchall()
    ddl = ", ".join(f"`{n}` {_mysql_type(t)}{' NOT NULL' if nn else ''}" for n, t, nn in cols)
    # Timestamps leave PostgreSQL in UTC without an offset, booleans as 1/0, for LOAD DATA.
    select = ", ".join(
        f"to_char({n} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"
        if t.startswith("timestamp with")
        else f"{n}::int"
        if t == "boolean"
        else n
        for n, t, _ in cols
    )
    with tempfile.TemporaryDirectory(prefix="sluicebench-copy-") as tmp:
        data = Path(tmp) / "rows.tsv"
        subprocess.run(
            [
                "psql",
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                pg_url,
                "-c",
                f"\\copy (SELECT {select} FROM public.{ds.table} ORDER BY id) TO '{data}'",
            ],
            check=True,
        )
        with my.cursor() as c:
            c.execute(f"DROP TABLE IF EXISTS `{ds.table}`")
            c.execute(
                f"CREATE TABLE `{ds.table}` ({ddl}, PRIMARY KEY (id)) ENGINE=InnoDB "
                f"COMMENT='{marker}'"
            )
            c.execute(
                f"LOAD DATA LOCAL INFILE '{data}' INTO TABLE `{ds.table}` CHARACTER SET utf8mb4"
            )
            c.execute(f"ANALYZE TABLE `{ds.table}`")
            c.fetchall()
    my.close()


def sluice_accepts_mysql(sluice: str, url: str, work: Path) -> str | None:
    """None when `sluice export` can read `url`; otherwise why not (a tiny probe export)."""
    conn = connect(url)
    with conn.cursor() as c:
        c.execute("CREATE TABLE IF NOT EXISTS sluicebench_probe (id BIGINT PRIMARY KEY)")
        c.execute("INSERT IGNORE INTO sluicebench_probe VALUES (1)")
    conn.close()
    out = work / "probe"
    r = subprocess.run(
        [
            sluice,
            "export",
            "-q",
            "--source",
            url,
            "--table",
            "sluicebench_probe",
            "--to",
            str(out),
            "--overwrite",
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode == 0:
        return None
    return (
        f"sluice export from mysql:// exited {r.returncode}: {(r.stderr or r.stdout).strip()[:300]}"
    )
