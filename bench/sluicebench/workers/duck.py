"""DuckDB's postgres or mysql scanner: the table copied into one Parquet file by DuckDB itself.

    python -m sluicebench.workers.duck --url URL --table T --out DIR --threads N

What many users reach for: `ATTACH` the database read-only, then `COPY (SELECT * FROM db.t) TO
'x.parquet'`. The scanner extensions install from PyPI (`duckdb-ext-postgres`,
`duckdb-ext-mysql`) and are loaded by path (`INSTALL '<file>'`), as DuckDB's own extension
server is not a registry the lab installs from. `threads` bounds DuckDB's workers (the
postgres scanner reads ctid ranges in parallel, one connection each); Parquet is zstd as
sluice's default. Prints the row count.
"""

from __future__ import annotations

import argparse
import glob
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

import duckdb


def extension(name: str) -> str:
    """The path of an installed DuckDB extension package's file."""
    root = os.path.dirname(os.path.dirname(duckdb.__file__))
    found = glob.glob(os.path.join(root, "duckdb_ext*", "**", f"{name}.duckdb_extension"),
                      recursive=True)
    if not found:
        raise SystemExit(f"no {name} extension: pip install duckdb-ext-{name.split('_')[0]} "
                         "(bench/run installs bench/requirements.txt)")
    return found[0]


def attach_string(url: str) -> tuple[str, str, str]:
    """(extension, ATTACH target, TYPE) for a sluice source URL."""
    u = urlparse(url)
    if u.scheme.startswith("postgres"):
        return "postgres_scanner", url.replace("postgres://", "postgresql://", 1), "postgres"
    parts = [f"host={u.hostname}", f"port={u.port or 3306}", f"user={unquote(u.username or '')}",
             f"database={u.path.lstrip('/')}"]
    if u.password:
        parts.append(f"password={unquote(u.password)}")
    return "mysql_scanner", " ".join(parts), "mysql"


def main() -> None:
    p = argparse.ArgumentParser(prog="sluicebench.workers.duck")
    p.add_argument("--url", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    ext, target, kind = attach_string(a.url)
    con = duckdb.connect()
    con.execute(f"SET threads = {a.threads}")
    con.execute(f"INSTALL '{extension(ext)}'")
    con.execute(f"LOAD {kind}")
    con.execute(f"ATTACH '{target}' AS src (TYPE {kind}, READ_ONLY)")
    a.out.mkdir(parents=True, exist_ok=True)
    out = a.out / "part-0.parquet"
    table = ".".join(f'"{p}"' for p in a.table.split("."))
    con.execute(f"COPY (SELECT * FROM src.{table}) TO '{out}' (FORMAT parquet, COMPRESSION zstd)")
    print(con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()[0])


if __name__ == "__main__":
    main()
