"""Fixtures for the Python package's tests: fresh databases on the servers the test kit
started (``sluice-testkit run --pg --mariadb --firebird -- …``, as ./scripts/test does), and
the ``sluice`` binary whose Parquet output the reads are compared with.

A server that is not there fails the test with the command that starts it; nothing is
skipped."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest


def need(var: str) -> str:
    value = os.environ.get(var)
    if not value:
        pytest.fail(
            f"{var} is not set, so there is no server to test against: run ./scripts/test, or "
            f"wrap pytest in `sluice-testkit run --pg --mariadb --firebird -- …`.",
            pytrace=False,
        )
    return value


def with_database(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + db, parts.query, parts.fragment))


def unique(prefix: str) -> str:
    return f"{prefix}_{random.getrandbits(48):012x}"


# --- PostgreSQL -------------------------------------------------------------------------------


class Pg:
    """A fresh PostgreSQL database and a connection to it (autocommit)."""

    def __init__(self, server_url: str) -> None:
        import psycopg

        self.name = unique("py")
        with psycopg.connect(server_url.replace("postgres://", "postgresql://", 1), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{self.name}"')
        self.server_url = server_url
        self.url = with_database(server_url, self.name)
        self.conn = self.connect()

    def connect(self):
        import psycopg

        return psycopg.connect(self.url.replace("postgres://", "postgresql://", 1), autocommit=True)

    def exec(self, sql: str) -> None:
        self.conn.execute(sql)

    def rows(self, sql: str) -> list:
        return self.conn.execute(sql).fetchall()

    def drop(self) -> None:
        import psycopg

        self.conn.close()
        with psycopg.connect(self.server_url.replace("postgres://", "postgresql://", 1), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


@pytest.fixture
def pg() -> Iterator[Pg]:
    db = Pg(need("SLUICE_TEST_PG_URL"))
    yield db
    db.drop()


# --- MariaDB ----------------------------------------------------------------------------------


class My:
    """A fresh MariaDB database and a connection to it (autocommit)."""

    def __init__(self, server_url: str) -> None:
        self.name = unique("py")
        parts = urlsplit(server_url)
        self.params = dict(
            host=parts.hostname,
            port=parts.port or 3306,
            user=parts.username,
            password=parts.password or "",
            autocommit=True,
        )
        with self.connect(None) as c, c.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{self.name}`")
        self.url = with_database(server_url, self.name)
        self.conn = self.connect(self.name)

    def connect(self, db):
        import pymysql

        return pymysql.connect(database=db, **self.params)

    def exec(self, sql: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute(sql)

    def drop(self) -> None:
        self.conn.close()
        with self.connect(None) as c, c.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{self.name}`")


@pytest.fixture
def my() -> Iterator[My]:
    db = My(need("SLUICE_TEST_MYSQL_URL"))
    yield db
    db.drop()


# --- Firebird (embedded) ----------------------------------------------------------------------


class Fb:
    """A fresh embedded Firebird database (firebird-driver on the test kit's client library)."""

    def __init__(self, directory: str, fbclient: str) -> None:
        from firebird.driver import create_database, driver_config

        driver_config.fb_client_library.value = fbclient
        self.path = Path(directory) / f"{unique('py')}.fdb"
        self.url = f"firebird://{self.path}"
        self.conn = create_database(str(self.path), user="SYSDBA")

    def exec(self, sql: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute(sql)
        self.conn.commit()

    def drop(self) -> None:
        self.conn.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def fb() -> Iterator[Fb]:
    need("FIREBIRD")
    db = Fb(need("SLUICE_TEST_FIREBIRD_DIR"), need("FBCLIENT"))
    yield db
    db.drop()


# --- the CLI ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sluice_bin() -> str:
    path = os.environ.get("SLUICE_BIN") or os.path.join(
        os.environ.get("CARGO_TARGET_DIR", "target"), "debug", "sluice"
    )
    if not os.access(path, os.X_OK):
        pytest.fail(f"no sluice binary at {path}: build it (cargo build --workspace) or set SLUICE_BIN.", pytrace=False)
    return path


def cli_parquet(sluice_bin: str, url: str, table: str, out: Path, *extra: str):
    """The table as the CLI exports it to Parquet, read back with pyarrow."""
    import pyarrow.parquet as pq

    subprocess.run(
        [sluice_bin, "-q", "export", "--source", url, "--table", table, "--to", str(out), *extra],
        check=True,
    )
    dirs = [d for d in out.iterdir() if d.is_dir() and not d.name.startswith("_")]
    assert len(dirs) == 1, dirs
    return pq.read_table(dirs[0])


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.Popen:
    """Start `code` in a fresh interpreter (for RSS and signal tests), stdout piped."""
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full,
    )


def wait_for(predicate, what: str, timeout: float = 30.0):
    """Poll `predicate` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
