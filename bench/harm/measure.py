"""The harm-budget benchmark's driver, run by bench/harm/run inside `sluice-testkit run --pg`.

Three phases on the same server, each as long as SLUICE_BENCH_SECONDS: a rate-limited pgbench
(-R, 4 clients) alone (idle), with `sluice export --parallel 4` of the wide table exported
over and over meanwhile (plain), and the same with `--max-latency` (governed). pgbench logs
every transaction (-l); its latency percentiles come from those logs. The export's rows per
second are those of the runs that completed within the phase. Then self-load: with nothing
else running, the export alone, plain and with every limit set (the gentle preset, --max-active
and a --max-rate that never binds), alternated SELF_LOAD_RUNS times: the governor must not
throttle on load it makes itself (goal: at least 0.9x the plain export's rows per second).
Standard library only.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

URL = os.environ["SLUICE_TEST_PG_URL"]
SLUICE = os.environ["SLUICE_BENCH_SLUICE"]
RESULTS = Path(os.environ["SLUICE_BENCH_RESULTS"])
DOC = Path(os.environ["SLUICE_BENCH_DOC"])
RATE = int(os.environ["SLUICE_BENCH_RATE"])
SECONDS = int(os.environ["SLUICE_BENCH_SECONDS"])
MAX_LATENCY = os.environ["SLUICE_BENCH_MAX_LATENCY"]
CHUNK = os.environ["SLUICE_BENCH_CHUNK"]
COMMAND = os.environ["SLUICE_BENCH_COMMAND"]


def count(text):
    """`100k` → 100000."""
    t = text.lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(t[-1], 1)
    return int(float(t.rstrip("km")) * scale)


ROWS = count(os.environ["SLUICE_BENCH_ROWS"])
SELF_LOAD_RUNS = 3
# Every limit, none of them bound by a foreign load on an idle server.
EVERY_LIMIT = ["--harm-budget", "gentle", "--max-active", "50", "--max-rate", "100GB/s"]
DB_URL = URL.rsplit("/", 1)[0] + "/harmbench"


def psql(url, sql):
    subprocess.run(["psql", url, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql], check=True)


def prepare():
    psql(URL, "DROP DATABASE IF EXISTS harmbench")
    psql(URL, "CREATE DATABASE harmbench")
    # About 2 KB a row: the lab's wide table's order of size.
    psql(
        DB_URL,
        f"CREATE TABLE wide AS SELECT g AS id, repeat(md5(g::text), 16) AS a, "
        f"repeat(md5((g + 1)::text), 16) AS b, repeat(md5((g + 2)::text), 16) AS c, "
        f"repeat(md5((g + 3)::text), 16) AS d, now() AS at, g * 1.5 AS x "
        f"FROM generate_series(1, {ROWS}) g; ALTER TABLE wide ADD PRIMARY KEY (id)",
    )
    psql(DB_URL, "VACUUM ANALYZE wide")
    subprocess.run(["pgbench", "-i", "-q", "-s", "10", DB_URL], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def percentiles(prefix_dir, prefix):
    lat = []
    for f in Path(prefix_dir).glob(prefix + ".*"):
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 6:
                lat.append(int(parts[2]) / 1000.0)  # µs → ms
    lat.sort()
    if not lat:
        return {"transactions": 0}
    q = lambda p: lat[min(len(lat) - 1, max(0, int(round(p * len(lat))) - 1))]
    return {"transactions": len(lat), "p50_ms": q(0.50), "p99_ms": q(0.99)}


def phase(name, export_args, work):
    logs = Path(work) / name
    logs.mkdir()
    bench = subprocess.Popen(
        ["pgbench", "-n", "-R", str(RATE), "-c", "4", "-j", "2", "-T", str(SECONDS),
         "-l", "--log-prefix", str(logs / "tx"), DB_URL],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    runs = []
    while export_args is not None and bench.poll() is None:
        out = Path(work) / f"{name}-out"
        report = Path(work) / f"{name}-report.json"
        cmd = [SLUICE, "-q", "export", "--source", DB_URL, "--table", "wide", "--to", str(out),
               "--parallel", "4", "--chunk-size", CHUNK, "--overwrite", "--report-json", str(report), *export_args]
        export = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while export.poll() is None:
            if bench.poll() is not None:
                export.terminate()  # cut short by the phase's end: not counted
                break
            time.sleep(0.1)
        _, err = export.communicate()
        if export.returncode == 0:
            r = json.loads(report.read_text())
            tl = r.get("timeline") or {}
            runs.append({"rows_per_second": r["rows_per_second"], "wall_seconds": r["wall_seconds"],
                         "paused_seconds": tl.get("paused_seconds", 0.0),
                         "min_workers": tl.get("min_workers", 4)})
        elif bench.poll() is None:
            sys.exit(f"the export failed: {err}")
    bench.wait()
    result = {"phase": name, "pgbench": percentiles(logs, "tx"), "exports": runs}
    if runs:
        result["rows_per_second"] = sum(r["rows_per_second"] for r in runs) / len(runs)
    return result


def alone(work, args, i):
    """One export of the wide table with nothing else running; its rows per second."""
    out = Path(work) / f"alone-{i}"
    report = Path(work) / f"alone-{i}.json"
    cmd = [SLUICE, "-q", "export", "--source", DB_URL, "--table", "wide", "--to", str(out),
           "--parallel", "4", "--chunk-size", CHUNK, "--overwrite", "--report-json", str(report),
           *args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    r = json.loads(report.read_text())
    return {"rows_per_second": r["rows_per_second"],
            "paused_seconds": (r.get("timeline") or {}).get("paused_seconds", 0.0)}


def self_load(work):
    """Plain and every-limit exports alternated on an idle server."""
    plain, limited = [], []
    for i in range(SELF_LOAD_RUNS):
        plain.append(alone(work, [], 2 * i))
        limited.append(alone(work, EVERY_LIMIT, 2 * i + 1))
    mean = lambda runs: sum(r["rows_per_second"] for r in runs) / len(runs)
    return {"limits": " ".join(EVERY_LIMIT), "plain": plain, "every_limit": limited,
            "ratio": mean(limited) / mean(plain)}


def main():
    RESULTS.mkdir(parents=True, exist_ok=True)
    prepare()
    with tempfile.TemporaryDirectory(prefix="sluice-harm-bench-") as work:
        phases = [
            phase("idle", None, work),
            phase("plain", [], work),
            phase("governed", ["--max-latency", MAX_LATENCY], work),
        ]
        alone_runs = self_load(work)
    by = {p["phase"]: p for p in phases}
    idle_p99 = by["idle"]["pgbench"].get("p99_ms")
    summary = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": COMMAND,
        "rows": ROWS,
        "rate_tps": RATE,
        "seconds_per_phase": SECONDS,
        "max_latency": MAX_LATENCY,
        "chunk_size": CHUNK,
        "cores": os.cpu_count(),
        "phases": phases,
        "self_load": alone_runs,
    }
    if idle_p99 and by["plain"].get("rows_per_second") and by["governed"].get("rows_per_second"):
        summary["governed_p99_vs_idle"] = by["governed"]["pgbench"]["p99_ms"] / idle_p99
        summary["plain_p99_vs_idle"] = by["plain"]["pgbench"]["p99_ms"] / idle_p99
        summary["governed_throughput_vs_plain"] = (
            by["governed"]["rows_per_second"] / by["plain"]["rows_per_second"])
    (RESULTS / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_doc(summary)
    print(json.dumps(summary, indent=2))


def write_doc(s):
    lines = [
        "# Harm budget: benchmarks",
        "",
        "A rate-limited pgbench (`-R`, 4 clients, a TPS the server sustains idle) against the "
        "server while the wide table is exported with `--parallel 4`, over and over for the "
        "phase's length: pgbench's latency with no export, with a plain export and with "
        "`--max-latency` set. Goal: p99 within 1.25x idle while the governed export keeps at "
        "least 60 % of the plain export's rows per second.",
        "",
        f"- **Command**: `{s['command']}`",
        f"- **Date**: {s['date']}",
        f"- **Data**: {s['rows']:,} rows of about 2 KB (`wide`), pgbench scale 10, "
        f"{s['rate_tps']} TPS, {s['seconds_per_phase']} s a phase, `--chunk-size {s['chunk_size']}` "
        f"(both exports), `--max-latency {s['max_latency']}`",
        f"- **Machine**: {s['cores']} cores, client and server on it (see the notes below)",
        "",
        "| phase | pgbench p50 | pgbench p99 | p99 vs idle | export rows/s | runs | paused (s, mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    idle = next(p for p in s["phases"] if p["phase"] == "idle")["pgbench"].get("p99_ms")
    for p in s["phases"]:
        b = p["pgbench"]
        runs = p["exports"]
        paused = sum(r["paused_seconds"] for r in runs) / len(runs) if runs else None
        lines.append(
            f"| {p['phase']} | {b.get('p50_ms', 0):.2f} ms | {b.get('p99_ms', 0):.2f} ms | "
            f"{(b.get('p99_ms', 0) / idle) if idle else 0:.2f}x | "
            f"{p.get('rows_per_second', 0):,.0f} | {len(runs)} | "
            f"{'' if paused is None else f'{paused:.1f}'} |")
    if "governed_throughput_vs_plain" in s:
        lines += [
            "",
            f"Governed: p99 {s['governed_p99_vs_idle']:.2f}x idle (plain export: "
            f"{s['plain_p99_vs_idle']:.2f}x), throughput {100 * s['governed_throughput_vs_plain']:.0f} % "
            f"of the plain export's.",
        ]
    sl = s.get("self_load")
    if sl:
        runs = lambda key: ", ".join(f"{r['rows_per_second']:,.0f}" for r in sl[key])
        paused = sum(r["paused_seconds"] for r in sl["every_limit"])
        lines += [
            "",
            f"Self-load (nothing else running; `{sl['limits']}` against no limit, "
            f"{len(sl['plain'])} alternated runs each): rows/s {runs('every_limit')} against "
            f"{runs('plain')}: **{sl['ratio']:.2f}x** the plain export's (goal: at least 0.9x), "
            f"paused {paused:.1f} s in all.",
        ]
    DOC.parent.mkdir(parents=True, exist_ok=True)
    # Earlier passes stay (move this pass's table there by hand before the next one).
    if DOC.exists():
        before = DOC.read_text()
        if "## Earlier passes" in before:
            kept = before[before.index("## Earlier passes"):]
            kept = kept.split("## Notes")[0].rstrip()
            lines += ["", kept]
    notes = DOC.with_name("benchmark-notes.md")
    if notes.exists():
        lines += ["", notes.read_text().rstrip()]
    DOC.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
