"""The lab run: prepare the engines, load each dataset once, measure every strategy on it in
alternating order, write one JSON per run."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from sluicebench import datasets, mariadb, objstore, results
from sluicebench.datasets import Dataset
from sluicebench.harm import MariaHarmSampler, PgHarmSampler
from sluicebench.machine import describe
from sluicebench.measure import run_measured
from sluicebench.settings import Settings, size_label
from sluicebench.strategies import Context, Strategy, all_strategies
from sluicebench.strategies.base import Tools
from sluicebench.verify import inspect

BENCH_DB = "sluice_bench"
RUN_TIMEOUT = 3600.0


def log(msg: str) -> None:
    """Progress on stderr, like the shell's `say`."""
    print(f"\033[1m==> {msg}\033[0m", flush=True)


@dataclass
class Engine:
    """One database the lab reads from."""

    name: str  # pg | mariadb
    url: str  # the benchmark database
    version: str


def pg_bench_url(url: str) -> str:
    """The test kit hands out the `postgres` database; the lab works in its own."""
    u = urlsplit(url)
    if u.path.strip("/") not in ("", "postgres"):
        return url  # a database the user chose: use it as it is
    with psycopg.connect(url, autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (BENCH_DB,)).fetchone():
            c.execute(f"CREATE DATABASE {BENCH_DB}")
    return u._replace(path="/" + BENCH_DB).geturl()


def datasets_wanted(s: Settings) -> list[tuple[str, int]]:
    """(kind, rows) in the order they are measured: small first, so problems show early."""
    want = [("narrow", n) for n in s.narrow_sizes] + [("wide", n) for n in s.wide_sizes]
    return sorted(want, key=lambda kr: (kr[1] * (40 if kr[0] == "wide" else 1), kr[0]))


def run_lab(s: Settings) -> Path:
    """Measure everything `s` asks for; return the results directory."""
    tools = Tools(
        sluice=_env("SLUICE_BENCH_SLUICE", "sluice"),
        rivet=None if "rivet" in s.unavailable else _env("SLUICE_BENCH_RIVET", None),
    )
    s.scratch.mkdir(parents=True, exist_ok=True)
    if s.append:
        out_dir = s.append
        earlier = results.load(out_dir)
        run_offset = max((r["run"] for r in earlier.runs), default=0)
    else:
        out_dir = results.new_results_dir(s.results_root)
        earlier, run_offset = None, 0
    log(f"results go to {out_dir}")

    engines: list[Engine] = []
    if not s.pg_url:
        raise SystemExit("no PostgreSQL: run through bench/run, or pass --pg-url")
    pg_url = pg_bench_url(s.pg_url)
    pg = psycopg.connect(pg_url, autocommit=True)
    pg_version = "PostgreSQL " + pg.execute("SHOW server_version").fetchone()[0]
    if "pg" in s.engines:
        engines.append(Engine("pg", pg_url, pg_version))
    if "mariadb" in s.engines and "mariadb" not in s.unavailable:
        if not s.mysql_url:
            s.unavailable["mariadb"] = (
                "no MariaDB server (the test kit did not start one, no --mysql-url)"
            )
        else:
            my_url = mariadb.ensure_database(s.mysql_url, BENCH_DB)
            why = mariadb.sluice_accepts_mysql(tools.sluice, my_url, s.scratch)
            if why:
                s.unavailable["mariadb-sluice"] = why
            conn = mariadb.connect(my_url)
            with conn.cursor() as c:
                c.execute("SELECT version()")
                my_version = c.fetchone()[0]
            conn.close()
            engines.append(Engine("mariadb", my_url, f"MariaDB {my_version}"))

    lab = {
        "schema": results.SCHEMA,
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": results.redact(s.command),
        "settings": {
            "narrow_sizes": s.narrow_sizes,
            "wide_sizes": s.wide_sizes,
            "runs": s.runs,
            "engines": s.engines,
            "strategies": s.strategy_globs,
            "sample_interval": s.sample_interval,
        },
        "machine": describe(tools.sluice, tools.rivet),
        "servers": {e.name: e.version for e in engines},
        "unavailable": s.unavailable,
        "datasets": [],
    }
    if earlier:
        # Keep the first invocation's header; list every command that added runs.
        first = earlier.lab
        first.setdefault("appended", []).append(
            {"command": lab["command"], "started_at": lab["started_at"], "runs": s.runs}
        )
        first["unavailable"] = {**first.get("unavailable", {}), **s.unavailable}
        lab = first
    if "mariadb" in s.engines and "mariadb" in s.unavailable:
        log(f"MariaDB not available yet: {s.unavailable['mariadb']}")
    results.write_json(out_dir / "lab.json", lab)

    for kind, rows in datasets_wanted(s):
        ds = datasets.ensure(pg, kind, rows, log=log)
        if asdict(ds) not in lab["datasets"]:
            lab["datasets"].append(asdict(ds))
        results.write_json(out_dir / "lab.json", lab)
        for engine in engines:
            if engine.name == "mariadb":
                mariadb.copy_dataset(pg, pg_url, engine.url, ds, log=log)
            strategies = [st for st in all_strategies(engine.name) if _runnable(st, s)]
            for run in range(run_offset + 1, run_offset + s.runs + 1):
                order = strategies if run % 2 == 1 else list(reversed(strategies))
                for pos, st in enumerate(order, 1):
                    r = measure_one(engine, ds, st, run, pos, tools, s)
                    results.write_json(
                        results.run_path(out_dir, engine.name, ds.table, st.name, run), r
                    )
                    _print_line(engine, ds, st, run, r)
    lab["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    results.write_json(out_dir / "lab.json", lab)
    pg.close()
    return out_dir


def _env(name: str, default):
    return os.environ.get(name) or default


def _runnable(st: Strategy, s: Settings) -> bool:
    return s.wants(st.name)


def _unavailable_reason(st: Strategy, tools: Tools, s: Settings) -> str | None:
    if st.needs_s3 and objstore.available():
        return objstore.available()
    if st.family == "rivet" and not tools.rivet:
        return s.unavailable.get("rivet", "rivet is not installed")
    if st.engine == "mariadb" and st.family == "sluice" and "mariadb-sluice" in s.unavailable:
        return s.unavailable["mariadb-sluice"]
    return None


def measure_one(
    engine: Engine, ds: Dataset, st: Strategy, run: int, pos: int, tools: Tools, s: Settings
) -> dict:
    """Run one strategy once on one dataset; everything about it as a dict for the JSON."""
    record: dict = {
        "schema": results.SCHEMA,
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "engine": engine.name,
        "dataset": asdict(ds),
        "strategy": {
            "name": st.name,
            "family": st.family,
            "workers": st.workers,
            "about": st.about,
        },
        "run": run,
        "position": pos,
        "expected": {"rows": ds.rows, "id_sum": ds.id_sum},
    }
    why = _unavailable_reason(st, tools, s)
    if why:
        return {**record, "status": "unavailable", "error": why}
    # Per lab process: two labs sharing a scratch directory must not delete each other's output.
    work = s.scratch / f"lab-{os.getpid()}" / "work"
    out = s.scratch / f"lab-{os.getpid()}" / "out"
    for d in (work, out):
        shutil.rmtree(d, ignore_errors=True)
    work.mkdir(parents=True)
    ctx = Context(engine.name, engine.url, ds, out, work, tools)
    try:
        inv = st.build(ctx)
    except Exception as e:
        return {**record, "status": "failed", "error": f"could not build the command: {e}"}
    record["argv"] = [results.redact(a) for a in inv.argv]

    sampler = (
        PgHarmSampler(engine.url, s.sample_interval)
        if engine.name == "pg"
        else MariaHarmSampler(engine.url, s.sample_interval)
    )
    time.sleep(0.5)  # let the previous run's backends go
    # Other work on the machine shows in the times: the load average is kept with each run.
    record["load_average_before"] = list(os.getloadavg())
    sampler.prepare()
    m = run_measured(
        inv.argv, env=inv.env, cwd=inv.cwd, timeout=RUN_TIMEOUT, on_start=sampler.start
    )
    harm = sampler.stop()
    record["load_average_after"] = list(os.getloadavg())

    record.update(
        {
            "exit_code": m.exit_code,
            "wall_seconds": m.wall_seconds,
            "user_seconds": m.user_seconds,
            "system_seconds": m.system_seconds,
            "cpu_seconds": m.user_seconds + m.system_seconds,
            "peak_rss_bytes": m.peak_rss_bytes,
            "max_rss_single_bytes": m.max_rss_single_bytes,
            "peak_rss_tree_bytes": m.peak_rss_tree_bytes,
            "processes": m.processes_seen,
            "harm": harm.to_json(),
        }
    )
    if inv.report_json and inv.report_json.exists():
        try:
            record["tool_report"] = json.loads(inv.report_json.read_text())
        except ValueError:
            pass

    if m.exit_code != 0:
        record.update(status="failed", error=f"exit {m.exit_code}: {m.stderr_tail.strip()[-1500:]}")
        _cleanup(out, work)
        return record

    if inv.fetch:
        try:
            out.mkdir(parents=True, exist_ok=True)
            inv.fetch()
        except Exception as e:
            record.update(status="failed", error=f"could not fetch the output: {e}")
            _cleanup(out, work)
            return record
    if st.writes_files:
        o = inspect(out)
        record["output"] = asdict(o)
        rows, id_sum = o.rows, o.id_sum
    else:
        rows = inv.rows_from_stdout(m.stdout) if inv.rows_from_stdout else None
        id_sum = None
        # A worker that reports in one JSON line (workers/pyread.py): kept with the run.
        last = m.stdout.strip().splitlines()[-1:] or [""]
        if last[0].startswith("{"):
            try:
                record["tool_report"] = json.loads(last[0])
            except ValueError:
                pass
        record["output"] = {"files": 0, "bytes": 0, "rows": rows, "id_sum": None}
    _cleanup(out, work)

    if rows != ds.rows or (id_sum is not None and id_sum != ds.id_sum):
        record.update(
            status="wrong",
            error=f"expected {ds.rows} rows (id sum {ds.id_sum}), got {rows} (id sum {id_sum})",
        )
        return record
    record.update(
        status="ok",
        rows_per_second=ds.rows / m.wall_seconds,
        mb_per_second=ds.table_bytes / 1e6 / m.wall_seconds,
    )
    return record


def _cleanup(*dirs: Path) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        try:
            d.parent.rmdir()  # the lab-<pid> directory, once both are gone
        except OSError:
            pass
    subprocess.run(["sync"], check=False)  # the next run should not pay for this one's writeback


def _print_line(engine: Engine, ds: Dataset, st: Strategy, run: int, r: dict) -> None:
    head = f"{engine.name} {ds.kind} {size_label(ds.rows)} run {run} {st.name:<22}"
    if r["status"] == "ok":
        print(
            f"    {head} {r['wall_seconds']:7.2f} s  {r['rows_per_second'] / 1e3:8.1f} krows/s  "
            f"{r['mb_per_second']:6.1f} MB/s  "
            f"rss {r['peak_rss_bytes'] / 2**20:7.1f} MiB  cpu {r['cpu_seconds']:6.2f} s",
            flush=True,
        )
    else:
        print(f"    {head} {r['status'].upper()}: {str(r.get('error'))[:200]}", flush=True)
