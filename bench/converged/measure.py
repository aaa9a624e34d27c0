"""The converged-consistency benchmark's driver, run by bench/converged/run inside
`sluice-testkit run --pg`.

For each table (narrow: 5 columns; wide: about 2 KB a row), a pgbench script updates random rows
at a fixed rate (-R) for as long as the exports run; `sluice export --consistency snapshot` and
`--consistency converged` run alternately (SLUICE_BENCH_RUNS each) at the same `--parallel`.
Each run's figures come from its `--report-json`. Standard library only.
"""

import json
import os
import statistics
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

URL = os.environ["SLUICE_TEST_PG_URL"]
SLUICE = os.environ["SLUICE_BENCH_SLUICE"]
RESULTS = Path(os.environ["SLUICE_BENCH_RESULTS"])
DOC = Path(os.environ["SLUICE_BENCH_DOC"])
RATE = int(os.environ["SLUICE_BENCH_RATE"])
RUNS = int(os.environ["SLUICE_BENCH_RUNS"])
PARALLEL = os.environ["SLUICE_BENCH_PARALLEL"]
COMMAND = os.environ["SLUICE_BENCH_COMMAND"]
DB_URL = URL.rsplit("/", 1)[0] + "/convbench"


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


def psql(url, sql):
    subprocess.run(["psql", url, "-X", "-v", "ON_ERROR_STOP=1", "-q", "-c", sql], check=True)


def prepare():
    psql(URL, "DROP DATABASE IF EXISTS convbench")
    psql(URL, "CREATE DATABASE convbench")
    for name, (rows, cols) in TABLES.items():
        psql(DB_URL, f"CREATE TABLE {name} AS SELECT {cols} FROM generate_series(1, {rows}) g; "
                     f"ALTER TABLE {name} ADD PRIMARY KEY (id); CREATE INDEX ON {name} (v)")
        psql(DB_URL, f"VACUUM ANALYZE {name}")


def writer(table, rows, work, pattern):
    """pgbench updating rows of `table` (the indexed `v` changes: not HOT): anywhere in the
    table (`uniform`, pgbench's own pattern: the worst case, every part gets changed keys), or
    among its newest 1 % (`recent`, the common OLTP pattern: only the last parts do)."""
    script = Path(work) / f"{table}-{pattern}.sql"
    low = 1 if pattern == "uniform" else rows - rows // 100
    script.write_text(f"\\set id random({low}, {rows})\nUPDATE {table} SET v = v + 1 WHERE id = :id;\n")
    return subprocess.Popen(
        ["pgbench", "-n", "-R", str(RATE), "-c", "2", "-j", "1", "-T", "100000", "-f", str(script),
         DB_URL], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def export(table, consistency, work, n):
    out = Path(work) / f"{table}-{consistency}-{n}"
    report = Path(work) / f"{table}-{consistency}-{n}.json"
    subprocess.run(
        [SLUICE, "-q", "export", "--source", DB_URL, "--table", table, "--to", str(out),
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


def main():
    RESULTS.mkdir(parents=True, exist_ok=True)
    prepare()
    tables = []
    with tempfile.TemporaryDirectory(prefix="sluice-converged-bench-") as work:
        for table, (rows, _) in TABLES.items():
            for pattern in ("uniform", "recent"):
                w = writer(table, rows, work, pattern)
                try:
                    runs = []
                    for n in range(RUNS):
                        for consistency in ("snapshot", "converged"):
                            runs.append(export(table, consistency, work, n))
                finally:
                    w.terminate()
                    w.wait()
                tables.append({"table": table, "rows": rows, "updates": pattern, "runs": runs})
    summary = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": COMMAND,
        "rate_tps": RATE,
        "parallel": PARALLEL,
        "cores": os.cpu_count(),
        "tables": tables,
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
        "(`recent`). Goals (issue 32): converged wall ≤ 1.3x snapshot; no snapshot held longer than "
        "2 s where `snapshot` holds one for the whole run.",
        "",
        f"- **Command**: `{s['command']}`",
        f"- **Date**: {s['date']}",
        f"- **Writer**: {s['rate_tps']} updates/s (pgbench -R, 2 clients); `--parallel {s['parallel']}`",
        f"- **Machine**: {s['cores']} cores, client and server on it: compare ratios, not seconds",
        "",
        "| table | rows | updates | consistency | runs | wall (s) | wall vs snapshot "
        "| longest snapshot (s) | changed keys | rewritten | encoded again | end snapshot (s) "
        "| log kept (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in s["tables"]:
        base = mean([r for r in t["runs"] if r["consistency"] == "snapshot"], "wall_seconds")
        for c in ("snapshot", "converged"):
            runs = [r for r in t["runs"] if r["consistency"] == c]
            wall = mean(runs, "wall_seconds")
            fmt = lambda v, f: "" if v is None else f.format(v)
            lines.append(
                f"| {t['table']} | {t['rows']:,} | {t['updates']} | {c} | {len(runs)} | {wall:.2f} | "
                f"{wall / base:.2f}x | {mean(runs, 'longest_snapshot_seconds'):.2f} | "
                f"{fmt(mean(runs, 'changed_keys'), '{:,.0f}')} | "
                f"{fmt(mean(runs, 'rewritten_share'), '{:.0%}')} | "
                f"{fmt(mean(runs, 'reencoded_share'), '{:.0%}')} | "
                f"{fmt(mean(runs, 'end_snapshot_seconds'), '{:.2f}')} | "
                f"{fmt(mean(runs, 'log_bytes') and mean(runs, 'log_bytes') / 1e6, '{:.1f}')} |")
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
