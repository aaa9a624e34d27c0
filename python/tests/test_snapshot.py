"""Parallel reads share one snapshot: while 4 workers read and another session writes, the
result equals the table as of the run's snapshot, read by a transaction that imports the same
exported snapshot while the run still holds it (as the CLI's consistency test does)."""

from __future__ import annotations

import threading

import sluice
from conftest import wait_for


def test_four_workers_read_one_snapshot_under_concurrent_writes(pg):
    pg.exec(
        "CREATE TABLE hot (id bigint PRIMARY KEY, v int, pad text);"
        "INSERT INTO hot SELECT g, 0, md5(g::text) FROM generate_series(1, 200000) g; ANALYZE hot"
    )
    stop = threading.Event()
    changes = [0]

    def write() -> None:
        conn = pg.connect()
        i = 0
        while not stop.is_set():
            i += 1
            key = (i * 7919) % 200_000 + 1
            with conn.transaction():
                # Growing the row moves it to another page, across chunk boundaries.
                conn.execute("UPDATE hot SET v = v + 1, pad = pad || repeat('x', 200) WHERE id = %s", (key,))
                conn.execute("DELETE FROM hot WHERE id = %s", ((key * 13) % 200_000 + 1,))
                conn.execute("INSERT INTO hot VALUES (%s, -1, 'new') ON CONFLICT (id) DO UPDATE SET v = -2", (200_000 + i,))
            changes[0] += 1
        conn.close()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    wait_for(lambda: changes[0] >= 20, "the writer to start")

    reader = sluice.read_batches(
        pg.url, table="hot", parallel=4, chunk_size="1MB", batch_size="256KB"
    )
    # The run holds its snapshot while the reader is open: join it from its exported file.
    exported = [r[0] for r in pg.rows("SELECT pg_ls_dir('pg_snapshots')")]
    assert len(exported) == 1, f"one exported snapshot expected, found {exported}"
    sessions = pg.rows(f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{pg.name}' AND backend_type = 'client backend'")[0][0]
    oracle = pg.connect()
    oracle.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    oracle.execute(f"SET TRANSACTION SNAPSHOT '{exported[0]}'")
    changes_at_snapshot = changes[0]
    want = sorted(oracle.execute("SELECT id, v, pad FROM hot").fetchall())
    oracle.execute("COMMIT")
    oracle.close()

    table = reader.read_all()
    stop.set()
    writer.join()
    got = sorted(zip(*(table.column(c).to_pylist() for c in ("id", "v", "pad"))))
    assert len(got) == len(want)
    assert got == want, "the read must equal the table as of its snapshot"
    assert changes[0] > changes_at_snapshot + 10, "the writer made too few changes during the read"
    now = sorted(pg.rows("SELECT id, v, pad FROM hot"))
    assert now != want, "the table should have changed since the snapshot"
    # Coordinator and 4 workers (plus the harm probe, the writer and this fixture's session).
    assert sessions >= 7, sessions
