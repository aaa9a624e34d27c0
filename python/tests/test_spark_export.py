"""``sluice.spark.export``: the export's chunks written by Spark tasks, the plan, snapshot and
manifest by the driver. Its output equals ``sluice export``'s part for part; a task that dies
is retried and rewrites its part; a job that fails leaves no manifest, and ``resume=True``
finishes it reading only the chunks without a receipt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import sluice
import sluice.spark
import sparkkit
from conftest import run_python, wait_for
from test_spark import ACCOUNTS, BALANCE, Transfers, accounts


@pytest.fixture(scope="module")
def spark():
    yield from sparkkit.spark_for("local")


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def parts(m: dict) -> list:
    return [
        (d["name"], p["ordinal"], p["file"], p["rows"], p["xxh3_128"], p["range"])
        for d in m["datasets"]
        for p in d["parts"]
    ]


def exported(out: Path):
    return pq.read_table(out / "public.acct")


def test_distributed_export_equals_sluice_export(spark, pg, sluice_bin, tmp_path):
    accounts(pg)
    cli, dist = tmp_path / "cli", tmp_path / "dist"
    subprocess.run(
        [sluice_bin, "-q", "export", "--source", pg.url, "--table", "public.acct", "--to", str(cli),
         "--parallel", "2", "--chunk-size", "256kB"],
        check=True,
    )
    report = sluice.spark.export(spark, pg.url, to=dist, table="public.acct", parallel=2, chunk_size="256kB")
    m_cli, m_dist = manifest(cli), manifest(dist)
    assert len(parts(m_dist)) >= 4
    # The same parts, byte for byte (the same rows in the same plan, written with the same
    # budgets); only the run's ids and times differ.
    assert parts(m_dist) == parts(m_cli)
    assert m_dist["datasets"][0]["guarantee"] == {"kind": "snapshot", "snapshot": 0}
    assert report["rows"] == ACCOUNTS
    assert any("task(s) wrote the parts" in n for n in report["notes"])
    # A second run finds the output complete and reads nothing.
    again = sluice.spark.export(spark, pg.url, to=dist, table="public.acct", parallel=2, chunk_size="256kB", resume=True)
    assert again["already_complete"] is True


# A separate process: failpoints are read from the environment when a process starts, and
# the executors' Python workers inherit it from the driver that starts Spark.
EXPORT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    import sparkkit, sluice, sluice.spark
    spark = sparkkit.session({master!r})
    try:
        r = sluice.spark.export(spark, {url!r}, to={out!r}, table="public.acct", parallel=2,
                                chunk_size="256kB", chunk_by={chunk_by!r})
        print(json.dumps({{"ok": r}}))
    except sluice.SluiceError as e:
        print(json.dumps({{"error": str(e)}}))
    except Exception as e:
        print(json.dumps({{"error": str(e)}}))
    spark.stop()
    """
)


def start_export(url: str, out: Path, master: str, env: dict, chunk_by: str = "auto"):
    code = EXPORT.format(tests=str(Path(__file__).parent), master=master, url=url, out=str(out), chunk_by=chunk_by)
    return run_python(code, env=env, timeout=300)


def result(p) -> dict:
    stdout, stderr = p.communicate(timeout=300)
    lines = [l for l in stdout.splitlines() if l.startswith("{")]
    assert lines, f"no result (exit {p.returncode}): {stderr[-3000:]}"
    return json.loads(lines[-1])


def test_a_task_that_dies_is_retried_and_rewrites_its_part(pg, tmp_path):
    accounts(pg)
    writer = Transfers(pg)
    writer.start()
    try:
        wait_for(lambda: writer.commits > 20, "the writer's first commits")
        # The first task to commit a part waits after its receipt; it is killed there (as a
        # lost executor would leave it) and the others let go. local[2,4] lets Spark retry.
        fp = tmp_path / "fp"
        fp.mkdir()
        p = start_export(pg.url, tmp_path / "out", "local[2,4]",
                         {"SLUICE_FAILPOINTS": "export.after_receipt=wait@1", "SLUICE_FAILPOINT_DIR": str(fp)})
        reached = fp / "export.after_receipt.reached"
        wait_for(lambda: reached.exists() and reached.read_text(), "a task at its first receipt", timeout=120)
        receipts = tmp_path / "out" / "_sluice" / "parts"
        before = {r: r.stat().st_mtime_ns for r in receipts.rglob("*.json")}
        os.kill(int(reached.read_text()), signal.SIGKILL)
        (fp / "export.after_receipt.release").touch()
        got = result(p)
    finally:
        writer.halt()
    # The killed task's part and receipt were written again by its retry, under the same names.
    assert any(r.stat().st_mtime_ns != t for r, t in before.items()), "no task was retried"
    assert "ok" in got, got
    m = manifest(tmp_path / "out")
    ds = m["datasets"][0]
    ordinals = [p["ordinal"] for p in ds["parts"]]
    assert ordinals == sorted(set(ordinals)) and len(ordinals) >= 4
    assert sorted(f.name for f in (tmp_path / "out" / "public.acct").iterdir()) == sorted(Path(p["file"]).name for p in ds["parts"])
    t = exported(tmp_path / "out")
    ids = t.column("id").to_pylist()
    assert len(ids) == len(set(ids)) == ds["rows"]
    # One snapshot under a writer: the money adds up.
    assert ds["guarantee"] == {"kind": "snapshot", "snapshot": 0}
    assert sum(t.column("bal").to_pylist()) == ACCOUNTS * BALANCE


def test_a_failed_job_leaves_no_manifest_and_resume_finishes_it(spark, pg, tmp_path):
    accounts(pg)
    out = tmp_path / "out"
    # Every task fails for good right after its first part's receipt: the job fails.
    # Key ranges: a resume reads only the missing ones (page ranges partly read are read again
    # whole, since rows move between pages).
    got = result(start_export(pg.url, out, "local[2]", {"SLUICE_FAILPOINTS": "export.after_receipt=fatal@1"}, chunk_by="key"))
    assert "error" in got and "export.after_receipt" in got["error"], got
    assert not (out / "manifest.json").exists()
    written = list((out / "_sluice" / "parts").rglob("*.json"))
    assert (out / "_sluice" / "run.json").exists()
    writer = Transfers(pg)
    writer.start()
    try:
        wait_for(lambda: writer.commits > 20, "the writer's first commits")
        report = sluice.spark.export(spark, pg.url, to=out, table="public.acct", parallel=2, chunk_size="256kB", chunk_by="key", resume=True)
    finally:
        writer.halt()
    m = manifest(out)
    ds = m["datasets"][0]
    assert report["parts_skipped"] == len(written) > 0
    ids = exported(out).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == ds["rows"]
    # Parts from two snapshots: the manifest does not claim one point in time.
    assert ds["guarantee"]["kind"] == "key_ranges"
    assert len(m["snapshots"]) == 2


def test_refusals(spark, pg, my, tmp_path):
    accounts(pg)
    with pytest.raises(sluice.ConfigError, match="harm budget"):
        sluice.spark.export(spark, pg.url, to=tmp_path / "x", table="acct", max_latency="10ms")
    my.exec("CREATE TABLE t (id int PRIMARY KEY)")
    with pytest.raises(sluice.ConfigError, match='consistency="chunk"'):
        sluice.spark.export(spark, my.url, to=tmp_path / "y", table="t")
    assert not (tmp_path / "y").exists() or not any((tmp_path / "y").iterdir())
    # Per chunk it works on MariaDB.
    my.exec("INSERT INTO t SELECT seq FROM seq_1_to_3000")
    r = sluice.spark.export(spark, my.url, to=tmp_path / "z", table="t", consistency="chunk", chunk_by="key", chunk_size="8kB")
    assert r["rows"] == 3000
    (name,) = [d["name"] for d in manifest(tmp_path / "z")["datasets"]]
    assert pq.read_table(tmp_path / "z" / name).num_rows == 3000


def test_speculation_is_refused_before_the_output_is_touched(pg, tmp_path):
    """spark.speculation is fixed when a session starts: a session of its own, in a child."""
    accounts(pg)
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import sparkkit, sluice, sluice.spark
        sparkkit.spark_home()
        spark = sparkkit.session("local[1]", {{"spark.speculation": "true"}})
        try:
            sluice.spark.export(spark, {pg.url!r}, to={str(tmp_path / "out")!r}, table="acct")
            print("EXPORTED")
        except sluice.ConfigError as e:
            print("REFUSED:", e)
        finally:
            spark.stop()
    """)
    p = run_python(code)
    out, err = p.communicate(timeout=240)
    assert "REFUSED: spark.speculation is on" in out, out + err
    assert not (tmp_path / "out").exists()


def test_a_task_refuses_a_table_altered_since_the_plan(pg, tmp_path):
    # The driver's and a task's halves called directly (no Spark needed to show the check):
    # without a snapshot's locks, a column added between the plan and a task must not give
    # that task's part other columns than run.json records.
    from sluice import _sluice

    accounts(pg)
    opts = dict(source=pg.url, to=str(tmp_path / "out"), table="public.acct", consistency="chunk",
                chunk_by="key", chunk_size="256kB")
    driver, complete = _sluice.begin_export(**opts)
    assert complete is None and len(driver.chunks) >= 2
    first = json.loads(_sluice.write_chunks(driver.chunks[:1], driver.spec, **opts))
    assert len(first["parts"]) == 1
    pg.exec("ALTER TABLE acct ADD COLUMN note text")
    with pytest.raises(sluice.SourceError, match="not the ones the driver planned"):
        _sluice.write_chunks(driver.chunks[1:2], driver.spec, **opts)
    driver.abandon()
    assert not (tmp_path / "out" / "manifest.json").exists()
