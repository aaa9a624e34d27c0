"""Harm to the source, sampled from a session of our own while a strategy runs.

PostgreSQL: every period (100 ms by default) one autocommit statement reads
`pg_stat_activity` for the client backends that were not there when the run started (so any
tool is covered, whatever it names its sessions): how many there are, the age of the oldest
`backend_xmin` among them, the longest open transaction and the longest running statement.

An idle test server allocates no transaction ids, so `age(backend_xmin)` would stay near 0
however long a snapshot is held. The sampler therefore also allocates one transaction id per
sample (`pg_current_xact_id()`), standing in for a source with write traffic: the peak xmin
age is then about (samples per second) × (seconds the oldest snapshot was held), i.e. the
number of transactions whose dead rows VACUUM could not have removed meanwhile.

When the server runs on this machine, the CPU seconds all its processes spent during the
run are read from /proc (live processes, plus exited backends through the postmaster's
children totals).

MariaDB: connections and the longest running statement, from information_schema.processlist,
and the server's CPU seconds the same way.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the stand-alone lab uses ServerCpu without psycopg
    import psycopg

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Harm:
    """Peaks over one run."""

    peak_connections: int = 0
    peak_xmin_age: int | None = None
    longest_transaction_seconds: float = 0.0
    longest_statement_seconds: float = 0.0
    server_cpu_seconds: float | None = None
    samples: int = 0
    error: str | None = None

    def to_json(self) -> dict:
        """As stored in the run JSON."""
        return asdict(self)


class Sampler(threading.Thread):
    """Base: prepare() before the strategy starts, start() right after, stop() when it ended;
    sample() runs every `interval` seconds in between."""

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.harm = Harm()
        self._halt = threading.Event()

    def prepare(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def sample(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def run(self) -> None:
        while not self._halt.is_set():
            t0 = time.monotonic()
            try:
                self.sample()
                self.harm.samples += 1
            except Exception as e:  # a failed sample must not fail the run; it is reported
                self.harm.error = f"{type(e).__name__}: {e}"[:300]
            self._halt.wait(max(0.0, self.interval - (time.monotonic() - t0)))

    def stop(self) -> Harm:
        """Stop sampling and return the peaks."""
        self._halt.set()
        self.join()
        return self.harm


class PgHarmSampler(Sampler):
    """Samples a PostgreSQL server on its own connection."""

    QUERY = """
        SELECT count(*)::int,
               max(age(backend_xmin))::bigint,
               coalesce(extract(epoch FROM max(clock_timestamp() - xact_start)), 0)::float8,
               coalesce(extract(epoch FROM max(clock_timestamp() - query_start)
                        FILTER (WHERE state = 'active')), 0)::float8
        FROM pg_stat_activity
        WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND NOT (pid = ANY(%s))
    """

    def __init__(self, url: str, interval: float) -> None:
        super().__init__(interval)
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True, application_name="sluicebench-harm")
        self.baseline: list[int] = []
        self._cpu = ServerCpu.open(self.conn)

    def prepare(self) -> None:
        """Remember the backends that exist before the strategy starts (call before it starts)."""
        self.baseline = [
            r[0]
            for r in self.conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
            )
        ]
        if self._cpu:
            self._cpu.begin()

    def sample(self) -> None:
        self.conn.execute("SELECT pg_current_xact_id()")
        n, xmin_age, xact, stmt = self.conn.execute(self.QUERY, (self.baseline,)).fetchone()
        h = self.harm
        h.peak_connections = max(h.peak_connections, n)
        if xmin_age is not None:
            h.peak_xmin_age = max(h.peak_xmin_age or 0, int(xmin_age))
        h.longest_transaction_seconds = max(h.longest_transaction_seconds, xact)
        h.longest_statement_seconds = max(h.longest_statement_seconds, stmt)

    def stop(self) -> Harm:
        harm = super().stop()
        if self._cpu:
            harm.server_cpu_seconds = self._cpu.end()
        self.conn.close()
        return harm


class ServerCpu:
    """CPU seconds a local server spends between begin() and end(): the process given (its
    threads included) and its child processes (PostgreSQL's backends, live or exited)."""

    def __init__(self, postmaster: int) -> None:
        self.postmaster = postmaster
        self.start_ticks = 0

    @classmethod
    def open(cls, conn: psycopg.Connection) -> ServerCpu | None:
        """None when the server is not a process of this machine we can read."""
        try:
            (data_dir,) = conn.execute("SHOW data_directory").fetchone()
            pid = int(Path(data_dir, "postmaster.pid").read_text().split()[0])
            cls._stat(pid)
            return cls(pid)
        except Exception:
            return None

    @staticmethod
    def _stat(pid: int) -> list[str]:
        text = Path(f"/proc/{pid}/stat").read_text()
        return text[text.rindex(")") + 2 :].split()

    def _ticks(self) -> int:
        total = 0
        f = self._stat(self.postmaster)
        total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])  # utime stime cutime cstime
        for child in Path(f"/proc/{self.postmaster}/task").glob("*/children"):
            for pid in child.read_text().split():
                try:
                    c = self._stat(int(pid))
                    total += int(c[11]) + int(c[12])
                except (OSError, ValueError):
                    pass  # exited meanwhile: its time moved into the postmaster's totals
        return total

    def begin(self) -> None:
        """Start counting."""
        self.start_ticks = self._ticks()

    def end(self) -> float:
        """CPU seconds since begin()."""
        return (self._ticks() - self.start_ticks) / CLK_TCK


class MariaHarmSampler(Sampler):
    """Samples a MariaDB/MySQL server: connections and the longest running statement."""

    def __init__(self, url: str, interval: float) -> None:
        super().__init__(interval)
        from sluicebench.mariadb import connect

        self.conn = connect(url)
        self.baseline: list[int] = []
        self._cpu: ServerCpu | None = None
        try:
            with self.conn.cursor() as c:
                c.execute("SELECT @@pid_file")
                (pid_file,) = c.fetchone()
            cpu = ServerCpu(int(Path(pid_file).read_text().split()[0]))
            cpu._ticks()
            self._cpu = cpu
        except Exception:
            pass  # not a server process of this machine

    def prepare(self) -> None:
        """Remember the existing connections (call before the strategy starts)."""
        with self.conn.cursor() as c:
            c.execute("SELECT id FROM information_schema.processlist")
            self.baseline = [r[0] for r in c.fetchall()]
        if self._cpu:
            self._cpu.begin()

    def sample(self) -> None:
        with self.conn.cursor() as c:
            c.execute(
                "SELECT id, command, time_ms FROM information_schema.processlist "
                "WHERE id <> connection_id()"
            )
            rows = [r for r in c.fetchall() if r[0] not in self.baseline]
        h = self.harm
        h.peak_connections = max(h.peak_connections, len(rows))
        busy = [float(r[2]) / 1000 for r in rows if r[1] == "Query"]
        h.longest_statement_seconds = max([h.longest_statement_seconds, *busy])

    def stop(self) -> Harm:
        harm = super().stop()
        if self._cpu:
            harm.server_cpu_seconds = self._cpu.end()
        self.conn.close()
        return harm
