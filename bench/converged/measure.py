"""The converged-consistency benchmark's driver, run by bench/converged/run inside
`sluice-testkit run --pg --mariadb`.

For each engine (SLUICE_BENCH_ENGINES: PostgreSQL, MariaDB) and table (narrow: 5 columns;
wide: about 2 KB a row), a writer updates random rows at a fixed rate for as long as the
exports run (PostgreSQL: pgbench -R; MariaDB: two `mariadb` clients running a script of
single-row updates, each followed by a sleep that paces it); `sluice export --consistency
snapshot` and `--consistency converged` run alternately (SLUICE_BENCH_RUNS each) at the same
`--parallel`. Each run's figures come from its `--report-json`. Standard library only (the
`mariadb` client's flags come from the lab's helper).
"""

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sluicebench.mariadb import cli_args, with_database  # noqa: E402

URL = os.environ["SLUICE_TEST_PG_URL"]
SLUICE = os.environ["SLUICE_BENCH_SLUICE"]
RESULTS = Path(os.environ["SLUICE_BENCH_RESULTS"])
DOC = Path(os.environ["SLUICE_BENCH_DOC"])
RATE = int(os.environ["SLUICE_BENCH_RATE"])
RUNS = int(os.environ["SLUICE_BENCH_RUNS"])
PARALLEL = os.environ["SLUICE_BENCH_PARALLEL"]
COMMAND = os.environ["SLUICE_BENCH_COMMAND"]
DB_URL = URL.rsplit("/", 1)[0] + "/convbench"
ENGINES = os.environ.get("SLUICE_BENCH_ENGINES", "pg mariadb").split()
MY_URL = os.environ.get("SLUICE_TEST_MYSQL_URL", "")
MY_DB_URL = with_database(MY_URL, "convbench") if MY_URL else ""
ENGINE_NAMES = {"pg": "PostgreSQL", "mariadb": "MariaDB"}


def count(text):
    """`100k` → 100000."""
    t = text.lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(t[-1], 1)
    return int(float(t.rstrip("km")) * scale)


TABLES = {
    "narrow": (count(os.environ["SLUICE_BENCH_NARROW"]),
               "g AS id, g % 1000 AS v, md5(g::text) AS a, g * 1.5 AS x, now() AS at"),
    "wide": (count(os.environ["SLUICE_BENCH_WIDE"]),
             "g AS id, g % 1000 AS v, repeat(md5(g::text), 16) AS a, "
             "repeat(md5((g + 1)::text), 16) AS b, repeat(md5((g + 2)::text), 16) AS c, "
             "repeat(md5((g + 3)::text), 16) AS d, now() AS at, g * 1.5 AS x"),
}
# The same rows on MariaDB (its sequence engine's `seq` for generate_series).
MY_TABLES = {
    "narrow": "(id BIGINT PRIMARY KEY, v INT NOT NULL, a CHAR(32) NOT NULL, x DECIMAL(20,1), "
              "at DATETIME(6), KEY (v)) SELECT seq AS id, seq % 1000 AS v, md5(seq) AS a, "
              "seq * 1.5 AS x, now(6) AS at FROM seq_1_to_{rows}",
    "wide": "(id BIGINT PRIMARY KEY, v INT NOT NULL, a TEXT, b TEXT, c TEXT, d TEXT, "
            "at DATETIME(6), x DECIMAL(20,1), KEY (v)) SELECT seq AS id, seq % 1000 AS v, "
            "repeat(md5(seq), 16) AS a, repeat(md5(seq + 1), 16) AS b, "
            "repeat(md5(seq + 2), 16) AS c, repeat(md5(seq + 3), 16) AS d, now(6) AS at, "
            "seq * 1.5 AS x FROM seq_1_to_{rows}",
}


def psql(url, sql):
    subprocess.run(["psql", url, "-X", "-v", "ON_ERROR_STOP=1", "-q", "-c", sql], check=True)


def mariadb(url, sql):
    subprocess.run(["mariadb", "--no-defaults", *cli_args(url), "-e", sql], check=True)


def prepare(engine):
    if engine == "mariadb":
        mariadb(MY_URL, "DROP DATABASE IF EXISTS convbench; CREATE DATABASE convbench")
        for name, (rows, _) in TABLES.items():
            mariadb(MY_DB_URL, f"CREATE TABLE {name} {MY_TABLES[name].format(rows=rows)}; "
                               f"ANALYZE TABLE {name}")
        return
    psql(URL, "DROP DATABASE IF EXISTS convbench")
    psql(URL, "CREATE DATABASE convbench")
    for name, (rows, cols) in TABLES.items():
        psql(DB_URL, f"CREATE TABLE {name} AS SELECT {cols} FROM generate_series(1, {rows}) g; "
                     f"ALTER TABLE {name} ADD PRIMARY KEY (id); CREATE INDEX ON {name} (v)")
        psql(DB_URL, f"VACUUM ANALYZE {name}")


def writer(engine, table, rows, work, pattern):
    """A writer updating rows of `table` at RATE a second (the indexed `v` changes: on
    PostgreSQL not HOT): anywhere in the table (`uniform`, pgbench's own pattern: the worst
    case, every part gets changed keys), or among its newest 1 % (`recent`, the common OLTP
    pattern: only the last parts do). Returns the processes."""
    low = 1 if pattern == "uniform" else rows - rows // 100
    if engine == "mariadb":
        # Two clients, each pacing itself at half the rate with a sleep after every update
        # (autocommit: one transaction each), for longer than the runs take.
        procs = []
        for c in range(2):
            script = Path(work) / f"{table}-{pattern}-{c}.sql"
            pause = 2.0 / RATE
            rng = random.Random(c)
            script.write_text("".join(
                f"UPDATE {table} SET v = v + 1 WHERE id = {rng.randint(low, rows)}; "
                f"DO SLEEP({pause:.4f});\n" for _ in range(RATE * 600)))
            procs.append(subprocess.Popen(
                ["mariadb", "--no-defaults", *cli_args(MY_DB_URL)],
                stdin=script.open(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return procs
    script = Path(work) / f"{table}-{pattern}.sql"
    script.write_text(f"\\set id random({low}, {rows})\nUPDATE {table} SET v = v + 1 WHERE id = :id;\n")
    return [subprocess.Popen(
        ["pgbench", "-n", "-R", str(RATE), "-c", "2", "-j", "1", "-T", "100000", "-f", str(script),
         DB_URL], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]


def export(engine, table, consistency, work, n):
    out = Path(work) / f"{engine}-{table}-{consistency}-{n}"
    report = Path(work) / f"{engine}-{table}-{consistency}-{n}.json"
    source = MY_DB_URL if engine == "mariadb" else DB_URL
    subprocess.run(
        [SLUICE, "-q", "export", "--source", source, "--table", table, "--to", str(out),
         "--parallel", PARALLEL, "--consistency", consistency, "--report-json", str(report)],
        check=True)
    r = json.loads(report.read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    harm = manifest["harm"]
    run = {
        "consistency": consistency,
        "wall_seconds": r["wall_seconds"],
        "rows": sum(d["rows"] for d in manifest["datasets"]),
        "output_bytes": sum(d["bytes"] for d in manifest["datasets"]),
        "longest_snapshot_seconds": harm["snapshot_held_seconds"],
        "longest_transaction_seconds": harm["longest_transaction_seconds"],
        "peak_xmin_age": harm.get("peak_xmin_age"),
    }
    c = manifest.get("converged")
    if c:
        run.update({
            "changed_keys": c["changed_keys"],
            "reread_rows": c["reread_rows"],
            "rewritten_share": c["rewritten_bytes"] / max(1, c["chunk_bytes"]),
            "reencoded_share": c.get("reencoded_bytes", 0) / max(1, c["chunk_bytes"]),
            "longest_chunk_seconds": c["longest_chunk_seconds"],
            "end_snapshot_seconds": c["end_snapshot_seconds"],
            "log_bytes": c.get("log_bytes"),
        })
    subprocess.run(["rm", "-rf", str(out)], check=True)
    return run


SPILL_ROWS = count(os.environ.get("SLUICE_BENCH_SPILL", "1m"))


def spill_phase(work):
    """The changed keys past their memory: a table with a two-column text key whose every row
    is updated mid-run (one statement, while the export waits after its first part), exported
    converged at `--memory 24MB` (the keys spill to disk past 12 MB) and at `--memory 1GB`
    (they stay in memory), alternated. Per run: wall, peak RSS, the changed keys and how long
    their read at T took (from the log line)."""
    psql(DB_URL, "DROP TABLE IF EXISTS acct")
    psql(DB_URL, "CREATE TABLE acct (tenant text, id bigint, v int NOT NULL, pad text NOT NULL, "
                 "PRIMARY KEY (tenant, id)); CREATE INDEX ON acct (v); "
                 "INSERT INTO acct SELECT 'tenant-of-the-lab-' || (g % 97), g, 0, md5(g::text) "
                 f"FROM generate_series(1, {SPILL_ROWS}) g")
    psql(DB_URL, "VACUUM ANALYZE acct")
    runs = []
    fp = Path(work) / "failpoints"
    fp.mkdir(exist_ok=True)
    for n in range(RUNS):
        for memory in ("24MB", "1GB"):
            for f in fp.iterdir():
                f.unlink()
            out = Path(work) / f"spill-{memory}-{n}"
            timing = Path(work) / "time.txt"
            env = dict(os.environ, SLUICE_FAILPOINTS="export.after_receipt=wait@1",
                       SLUICE_FAILPOINT_DIR=str(fp), SLUICE_LOG="warn,sluice_engine=info")
            start = time.monotonic()
            p = subprocess.Popen(
                ["/usr/bin/time", "-o", str(timing), "-f", "%M", SLUICE, "export", "--source",
                 DB_URL, "--table", "acct", "--to", str(out), "--parallel", PARALLEL,
                 "--consistency", "converged", "--memory", memory],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            while not (fp / "export.after_receipt.reached").exists():
                if p.poll() is not None:
                    raise SystemExit(f"the spill run ended early: {p.stderr.read()}")
                time.sleep(0.05)
            psql(DB_URL, "UPDATE acct SET v = v + 1")
            (fp / "export.after_receipt.release").touch()
            _, err = p.communicate()
            wall = time.monotonic() - start
            if p.returncode != 0:
                raise SystemExit(f"the spill run failed: {err}")
            manifest = json.loads((out / "manifest.json").read_text())
            reread = [line for line in err.splitlines() if "changed keys read again" in line]
            runs.append({
                "memory": memory,
                "wall_seconds": wall,
                "max_rss_kb": int(timing.read_text().split()[-1]),
                "changed_keys": manifest["converged"]["changed_keys"],
                "end_snapshot_seconds": manifest["converged"]["end_snapshot_seconds"],
                "reread_log": reread[-1].split("INFO ")[-1] if reread else None,
            })
            subprocess.run(["rm", "-rf", str(out)], check=True)
    return {"rows": SPILL_ROWS, "runs": runs}


def main():
    RESULTS.mkdir(parents=True, exist_ok=True)
    tables = []
    with tempfile.TemporaryDirectory(prefix="sluice-converged-bench-") as work:
        for engine in ENGINES:
            prepare(engine)
            for table, (rows, _) in TABLES.items():
                for pattern in ("uniform", "recent"):
                    procs = writer(engine, table, rows, work, pattern)
                    try:
                        runs = []
                        for n in range(RUNS):
                            for consistency in ("snapshot", "converged"):
                                runs.append(export(engine, table, consistency, work, n))
                    finally:
                        for w in procs:
                            w.terminate()
                            w.wait()
                    tables.append({"engine": engine, "table": table, "rows": rows,
                                   "updates": pattern, "runs": runs})
        spill = spill_phase(work) if "pg" in ENGINES and SPILL_ROWS else None
    summary = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": COMMAND,
        "rate_tps": RATE,
        "parallel": PARALLEL,
        "cores": os.cpu_count(),
        "tables": tables,
        "spill": spill,
    }
    (RESULTS / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_doc(summary)
    print(json.dumps(summary, indent=2))


def mean(runs, key):
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.mean(values) if values else None


def write_doc(s):
    lines = [
        "# Converged consistency: benchmarks",
        "",
        "Each table exported with `--consistency snapshot` and `--consistency converged`, "
        "alternated, at the same `--parallel`, while a rate-limited pgbench script updates random "
        "rows of it (the indexed column changes, so updates are not HOT and rows move between "
        "pages) — anywhere in the table (`uniform`, pgbench's pattern) or among its newest 1 % "
        "(`recent`); on MariaDB two `mariadb` clients pace single-row updates with a sleep each, "
        "at about the same rate. Goals (issue 32): converged wall ≤ 1.3x snapshot; no snapshot "
        "held longer than 2 s where `snapshot` holds one for the whole run.",
        "",
        f"- **Command**: `{s['command']}`",
        f"- **Date**: {s['date']}",
        f"- **Writer**: {s['rate_tps']} updates/s (PostgreSQL: pgbench -R, 2 clients; MariaDB: "
        f"2 paced clients, at most that rate); `--parallel {s['parallel']}`",
        f"- **Machine**: {s['cores']} cores, client and server on it: compare ratios, not seconds",
        "",
        "| engine | table | rows | updates | consistency | runs | wall (s) | wall vs snapshot "
        "| longest snapshot (s) | changed keys | rewritten | encoded again | end snapshot (s) "
        "| log kept (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in s["tables"]:
        base = mean([r for r in t["runs"] if r["consistency"] == "snapshot"], "wall_seconds")
        for c in ("snapshot", "converged"):
            runs = [r for r in t["runs"] if r["consistency"] == c]
            wall = mean(runs, "wall_seconds")
            fmt = lambda v, f: "" if v is None else f.format(v)
            lines.append(
                f"| {ENGINE_NAMES[t.get('engine', 'pg')]} | {t['table']} | {t['rows']:,} | {t['updates']} | {c} | {len(runs)} | {wall:.2f} | "
                f"{wall / base:.2f}x | {mean(runs, 'longest_snapshot_seconds'):.2f} | "
                f"{fmt(mean(runs, 'changed_keys'), '{:,.0f}')} | "
                f"{fmt(mean(runs, 'rewritten_share'), '{:.0%}')} | "
                f"{fmt(mean(runs, 'reencoded_share'), '{:.0%}')} | "
                f"{fmt(mean(runs, 'end_snapshot_seconds'), '{:.2f}')} | "
                f"{fmt(mean(runs, 'log_bytes') and mean(runs, 'log_bytes') / 1e6, '{:.1f}')} |")
    if s.get("spill"):
        sp = s["spill"]
        lines += [
            "",
            f"**Changed keys past their memory** (PostgreSQL, {sp['rows']:,} rows with a "
            "`(text, bigint)` key, every row updated mid-run by one statement; converged at "
            "`--memory 24MB`, where the keys spill to disk past 12 MB, against `--memory 1GB`, "
            "where they stay in memory):",
            "",
            "| --memory | runs | wall (s) | peak RSS (MB) | changed keys | end snapshot (s) |",
            "|---|---|---|---|---|---|",
        ]
        for m in ("24MB", "1GB"):
            runs = [r for r in sp["runs"] if r["memory"] == m]
            lines.append(
                f"| {m} | {len(runs)} | {mean(runs, 'wall_seconds'):.2f} | "
                f"{mean(runs, 'max_rss_kb') / 1024:.0f} | {mean(runs, 'changed_keys'):,.0f} | "
                f"{mean(runs, 'end_snapshot_seconds'):.2f} |")
    lines += [
        "",
        "\"Longest snapshot\" is the manifest's `harm.snapshot_held_seconds`: the whole run for "
        "`snapshot`; for `converged` the longest of a chunk's transaction and the snapshot at "
        "the end point T (held while the changed keys are read again). \"Rewritten\" is the "
        "bytes of the parts rewritten without changed keys as a share of the bytes read before T; "
        "\"encoded again\" the bytes of the row groups decoded and encoded again, as a share of "
        "the same (the rest of a rewritten part is copied as encoded).",
    ]
    DOC.parent.mkdir(parents=True, exist_ok=True)
    notes = DOC.with_name("benchmark-notes.md")
    if notes.exists():
        lines += ["", notes.read_text().rstrip()]
    DOC.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
