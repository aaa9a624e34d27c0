"""Ctrl-C while reading raises KeyboardInterrupt and leaves no session behind.

The read runs in a child interpreter; a failpoint holds its first part's writer right after
its first batch (``export.after_batch=wait``), so the signal arrives while the child waits
for batches, deterministically; the failpoint is released once the signal was sent."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest

from conftest import run_python, wait_for

@pytest.mark.parametrize("how", ["read_arrow", "read_batches"])
def test_ctrl_c_stops_the_read_and_closes_every_session(pg, tmp_path: Path, how: str):
    pg.exec(
        "CREATE TABLE big (id bigint PRIMARY KEY, pad text);"
        "INSERT INTO big SELECT g, repeat('p', 100) FROM generate_series(1, 100000) g; ANALYZE big"
    )
    call = {
        "read_arrow": "sluice.read_arrow(URL, table='big', parallel=2, chunk_size='1MB')",
        "read_batches": "sluice.read_batches(URL, table='big', parallel=2, chunk_size='1MB').read_all()",
    }[how]
    code = textwrap.dedent(
        f"""
        import sluice
        URL = {pg.url!r}
        try:
            {call}
            print("FINISHED", flush=True)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
        """
    )
    fp = tmp_path / "fp"
    fp.mkdir()
    child = run_python(
        code,
        env={"SLUICE_FAILPOINTS": "export.after_batch=wait@1", "SLUICE_FAILPOINT_DIR": str(fp)},
    )
    wait_for(lambda: (fp / "export.after_batch.reached").exists() or child.poll() is not None, "the first batch")
    assert child.poll() is None, child.communicate()
    active = pg.rows(f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{pg.name}' AND application_name = 'sluice'")[0][0]
    assert active >= 3, "coordinator and two workers were reading"
    os.kill(child.pid, signal.SIGINT)
    (fp / "export.after_batch.release").touch()
    out, err = child.communicate(timeout=60)
    assert "INTERRUPTED" in out, (out, err)
    assert "FINISHED" not in out

    def gone() -> bool:
        return pg.rows(
            f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{pg.name}' AND application_name = 'sluice'"
        )[0][0] == 0

    wait_for(gone, "the run's sessions to end", timeout=20)


def test_dropping_a_reader_early_stops_the_run(pg):
    import sluice

    pg.exec(
        "CREATE TABLE big (id bigint PRIMARY KEY, pad text);"
        "INSERT INTO big SELECT g, repeat('p', 100) FROM generate_series(1, 100000) g; ANALYZE big"
    )

    def sessions() -> int:
        return pg.rows(
            f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{pg.name}' AND application_name = 'sluice'"
        )[0][0]

    reader = sluice.read_batches(pg.url, table="big", parallel=2, chunk_size="1MB", batch_size="256KB")
    assert reader.read_next_batch().num_rows > 0
    assert sessions() >= 3, "coordinator and two workers are waiting for the reader"
    del reader
    wait_for(lambda: sessions() == 0, "the run's sessions to end", timeout=20)
