"""Drain the same change backlog with the engine's floor and with `sluice stream`.

Run by bench/stream/run inside `sluice-testkit run --pg` (engine `pg`, the default) or
`--mariadb` (`SLUICE_BENCH_ENGINE=mysql`, `bench/stream/run --mysql`). Standard library only.
For each table (narrow: 4 columns, ~60 bytes a row; wide: 24 columns, ~1 KB) a backlog of row
changes is written in transactions of 1 to 100 rows (60% inserts, 30% updates, 10% deletes)
after both readers have their start position, then each drains it, timed with GNU time (wall,
user+system CPU, peak RSS):

- PostgreSQL: two slots on one publication; the floor is pg_recvlogical (pgoutput protocol 1
  to /dev/null, decoding on the server), sluice streams to Parquet. On the narrow table, one
  more slot per other format (JSON Lines, Avro, gzip CSV) drains the same backlog into that
  format: CPU per change, files per second and bytes per change of each, next to Parquet's.
  Optionally one big transaction (`--big-tx`) and a steady load's commit-to-file delay
  (`--steady`).
- MySQL/MariaDB: a stream saves its position first (`--initial none`); the floor fetches the
  backlog from that position with `mariadb-binlog --read-from-remote-server --raw` (raw events
  into a RAM directory, nothing decoded), sluice streams it to Parquet.

PostgreSQL writes the page's head and keeps its MySQL/MariaDB section; MySQL/MariaDB replaces
that section only.
"""

import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from urllib.parse import urlparse

import pglab
from pglab import timed

ENGINE = os.environ.get("SLUICE_BENCH_ENGINE", "pg")
if ENGINE not in ("pg", "mysql"):
    raise SystemExit(f"SLUICE_BENCH_ENGINE={ENGINE!r}: pg or mysql")
URL = os.environ["SLUICE_TEST_PG_URL" if ENGINE == "pg" else "SLUICE_TEST_MYSQL_URL"]
SLUICE = os.environ["SLUICE_BENCH_SLUICE"]
RESULTS = os.environ["SLUICE_BENCH_RESULTS"]
DOC = os.environ["SLUICE_BENCH_DOC"]
COMMAND = os.environ.get(
    "SLUICE_BENCH_COMMAND", "bench/stream/run" + (" --mysql" if ENGINE == "mysql" else ""))
# Where the MySQL/MariaDB section of the page starts.
MARK_PREFIX = "<!-- MySQL/MariaDB section"
MARK = MARK_PREFIX + ": written by bench/stream/measure.py (SLUICE_BENCH_ENGINE=mysql) -->"

def size(text):
    m = re.fullmatch(r"(\d+)([kKmMgG]?)", text.strip())
    if not m:
        raise SystemExit(f"--changes {text!r}: a number with k or m")
    return int(m.group(1)) * {"": 1, "k": 1000, "m": 10**6, "g": 10**9}[m.group(2).lower()]


def nbytes(text):
    m = re.fullmatch(r"(\d+)\s*([KMG]?B)", text.strip(), re.I)
    if not m:
        raise SystemExit(f"--big-tx {text!r}: e.g. 1GB")
    return int(m.group(1)) * {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}[m.group(2).upper()]


CHANGES = size(os.environ["SLUICE_BENCH_CHANGES"])
BIG_TX = os.environ.get("SLUICE_BENCH_BIG_TX") or ""
STEADY = os.environ.get("SLUICE_BENCH_STEADY") or ""
# The narrow table under REPLICA IDENTITY FULL, with a pass writing before-images (the floor
# then reads the same larger log).
BEFORE_IMAGES = bool(os.environ.get("SLUICE_BENCH_BEFORE_IMAGES"))


def smoke_note(reference):
    """A debug build or a pass smaller than the reference shows that the lab works, not what
    sluice does: said at the top of the section, so it is not read as the reference figures."""
    if "/debug" not in SLUICE and CHANGES >= 5 * 10**6:
        return []
    return ["**Smoke pass only** (" + ("a debug build, " if "/debug" in SLUICE else "")
            + f"{CHANGES:,} changes a table, on whatever machine ran it: the figures show the lab "
            f"works, not what sluice does; the reference pass, `{reference}` with a release "
            "build on a quiet machine, replaces this section).", ""]


def mb(b):
    return f"{b / (1 << 20):.0f} MB"


def table_lines(rows, log_key, log_title):
    def per_change(r, who, key):
        v = r[who].get(key)
        return "–" if v is None else f"{v / r['changes'] * 1e6:.2f}"

    lines = [
        f"| table | changes | {log_title} | floor changes/s | sluice changes/s | sluice ÷ floor | "
        "floor CPU µs/change | sluice CPU µs/change | sluice user-space CPU µs/change | "
        "floor RSS | sluice RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['table']} | {r['changes']:,} | {mb(r[log_key])} | "
            f"{r['floor']['changes_per_s']:,.0f} | {r['sluice']['changes_per_s']:,.0f} | "
            f"{r['ratio_rate']:.2f}× | {per_change(r, 'floor', 'cpu')} | "
            f"{r['cpu_us_per_change']:.2f} | {per_change(r, 'sluice', 'user')} | "
            f"{mb(r['floor']['rss'])} | {mb(r['sluice']['rss'])} |")
    return lines


TARGETS = ("Targets (issue): ≥ 0.9× the floor's rate, ≤ 1 µs of client CPU per change, peak RSS "
           "≤ 64 MiB.")


# PostgreSQL

def psql(sql, db=None):
    return pglab.psql(sql, db or URL)


def drop_db(db):
    """Drop a pass's database. Its slots' walsenders may still be busy for a moment after
    their client left (one decoding a large transaction notices only when it next sends), and
    an active slot blocks the drop: wait for them, up to a minute."""
    for _ in range(120):
        p = subprocess.run(
            ["psql", "-X", "-q", "-At", URL, "-c", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"],
            capture_output=True, text=True)
        if p.returncode == 0:
            return
        if "active logical replication slot" not in p.stderr:
            raise SystemExit(f"psql failed: {p.stderr.strip()}")
        time.sleep(0.5)
    raise SystemExit(f"{db}: its replication slots stayed active for a minute after the pass")


PG_TABLES = {
    "narrow": "id bigint PRIMARY KEY, a int, b bigint, s text",
    "wide": "id bigint PRIMARY KEY, "
    + ", ".join(f"i{k} int" for k in range(8))
    + ", "
    + ", ".join(f"n{k} numeric(12,2)" for k in range(4))
    + ", "
    + ", ".join(f"t{k} text" for k in range(10))
    + ", ts timestamptz",
}


def pg_row_values(table, idx):
    if table == "narrow":
        return f"{idx}, ({idx} % 1000)::int, {idx} * 7, md5({idx}::text)"
    ints = ", ".join(f"({idx} + {k})::int" for k in range(8))
    nums = ", ".join(f"({idx} % 10000) / 7.0 + {k}" for k in range(4))
    texts = ", ".join(f"repeat(md5(({idx} + {k})::text), 3)" for k in range(10))
    return f"{idx}, {ints}, {nums}, {texts}, now()"


def pg_backlog(table, n, url):
    """n row changes in transactions of 1..100 rows: 60% inserts, 30% updates, 10% deletes."""
    setcol = "a = a + 1" if table == "narrow" else "i0 = i0 + 1"
    vals = pg_row_values(table, "i")
    psql(
        f"""
        DO $$
        DECLARE done bigint := 0; i bigint := coalesce((SELECT max(id) FROM {table}), 0);
                k int; r int := 0;
        BEGIN
          WHILE done < {n} LOOP
            k := 1 + (r * 37) % 100; r := r + 1;
            FOR j IN 1..k LOOP
              IF j % 10 < 6 OR i < 1000 THEN
                i := i + 1; INSERT INTO {table} VALUES ({vals});
              ELSIF j % 10 < 9 THEN
                UPDATE {table} SET {setcol} WHERE id = i - (j * 13) % 500;
              ELSE
                DELETE FROM {table} WHERE id = i - (j * 17) % 900 - 1;
              END IF;
            END LOOP;
            done := done + k;
            COMMIT;
          END LOOP;
        END $$;""",
        url,
    )


# The formats measured next to Parquet on the narrow table: (name, sluice flags).
FORMATS = [
    ("jsonl", ["--format", "jsonl"]),
    ("avro", ["--format", "avro"]),
    ("csv.gz", ["--format", "csv", "--compression", "gzip"]),
    ("parquet --columns id,a", ["--columns", "public.narrow:id,a"]),
    # The changes merged into a Delta table made by the first of them (--initial none).
    ("delta", ["--format", "delta"]),
] + ([("parquet --before-images", ["--before-images"])] if BEFORE_IMAGES else [])


def tree_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def format_pass(name, flags, url, table, out):
    """Drain the backlog waiting on this format's slot into `out`: figures per change."""
    report = os.path.join(out, "report.json")
    wall, cpu, rss, _, user = timed([
        SLUICE, "stream", "--source", url, "--table", f"public.{table}", "--to", out,
        "--until-current", "--report-json", report, "-q", *flags,
    ])
    rep = json.load(open(report))
    changes = rep["changes"]
    return {"format": name, "changes": changes, "wall": wall, "cpu": cpu, "user": user,
            "rss": rss, "files": rep["files"],
            "bytes": tree_bytes(os.path.join(out, f"public.{table}", "changes")),
            "cpu_us_per_change": cpu / changes * 1e6}


def format_lines(table, rows):
    lines = [
        f"Formats on the {table} table (the same backlog, one slot each; Parquet is the pass "
        "above" + ("; the table has REPLICA IDENTITY FULL, so every pass reads whole old rows"
                   if BEFORE_IMAGES else "") + "):",
        "",
        "| format | changes | wall s | CPU µs/change | user-space CPU µs/change | files/s | "
        "bytes/change | peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in rows:
        lines.append(
            f"| {f['format']} | {f['changes']:,} | {f['wall']:.2f} | {f['cpu_us_per_change']:.2f} | "
            f"{f['user'] / f['changes'] * 1e6:.2f} | {f['files'] / f['wall']:.1f} | "
            f"{f['bytes'] / f['changes']:.1f} | {mb(f['rss'])} |")
    lines += ["", "Targets (issue): JSON Lines ≤ 2 µs of client CPU per change (Rigatoni's published "
              "1.2 µs JSON serialization plus 0.8 µs processing); Avro ≤ Parquet's CPU per change."]
    return lines


def pg_measure_table(table, n):
    db = f"bench_stream_{table}"
    psql(f"DROP DATABASE IF EXISTS {db}")
    psql(f"CREATE DATABASE {db}")
    url = URL.rsplit("/", 1)[0] + "/" + db
    psql(f"CREATE TABLE {table} ({PG_TABLES[table]})", url)
    if BEFORE_IMAGES and table == "narrow":
        psql(f"ALTER TABLE {table} REPLICA IDENTITY FULL", url)
    out = tempfile.mkdtemp(prefix=f"sluice-stream-bench-{table}-")
    try:
        # sluice's slot (and its publication) first, then the floor's on the same publication.
        subprocess.run(
            [SLUICE, "stream", "--source", url, "--table", f"public.{table}", "--to", out,
             "--initial", "none", "--until-current", "--slot", "bench_sluice",
             "--publication", "bench_pub", "-q"],
            check=True,
        )
        formats = FORMATS if table == "narrow" else []
        for name, flags in formats:
            subprocess.run(
                [SLUICE, "stream", "--source", url, "--table", f"public.{table}", "--to",
                 os.path.join(out, name), "--initial", "none", "--until-current", "--slot",
                 "bench_" + re.sub(r"\W", "_", name), "--publication", "bench_pub", "-q", *flags],
                check=True,
            )
        psql("SELECT pg_create_logical_replication_slot('bench_floor', 'pgoutput')", url)
        t0 = time.monotonic()
        pg_backlog(table, n, url)
        load_s = time.monotonic() - t0
        end = psql("SELECT pg_current_wal_insert_lsn()", url)
        psql("CHECKPOINT", url)
        wal = int(psql(
            "SELECT pg_current_wal_insert_lsn() - restart_lsn FROM pg_replication_slots "
            "WHERE slot_name = 'bench_floor'", url))
        floor = timed([
            "pg_recvlogical", "-d", url, "--slot", "bench_floor", "--start", "-o",
            "proto_version=1", "-o", "publication_names=bench_pub", "--endpos", end,
            "-f", "/dev/null", "--no-loop",
        ])
        report = os.path.join(out, "report.json")
        ours = timed([
            SLUICE, "stream", "--source", url, "--table", f"public.{table}", "--to", out,
            "--until-current", "--report-json", report, "-q",
        ])
        rep = json.load(open(report))
        changes = rep["changes"]
        files = tree_bytes(os.path.join(out, f"public.{table}", "changes"))
        passes = [{"format": "parquet", "changes": changes, "wall": ours[0], "cpu": ours[1],
                   "user": ours[4], "rss": ours[2], "files": rep["files"], "bytes": files,
                   "cpu_us_per_change": ours[1] / changes * 1e6}] if formats else []
        passes += [format_pass(name, flags, url, table, os.path.join(out, name))
                   for name, flags in formats]
        row = {
            "table": table,
            "changes": changes,
            "transactions": rep["transactions"],
            "wal_bytes": wal,
            "load_seconds": round(load_s, 2),
            "floor": {"wall": floor[0], "cpu": floor[1], "user": floor[4], "rss": floor[2],
                      "changes_per_s": changes / floor[0]},
            "sluice": {"wall": ours[0], "cpu": ours[1], "user": ours[4], "rss": ours[2],
                       "changes_per_s": changes / ours[0], "parquet_bytes": files,
                       "peak_rss_report": rep["peak_rss_bytes"]},
        }
        row["ratio_rate"] = row["sluice"]["changes_per_s"] / row["floor"]["changes_per_s"]
        row["cpu_us_per_change"] = ours[1] / changes * 1e6
        row["formats"] = passes
        return row
    finally:
        shutil.rmtree(out, ignore_errors=True)
        drop_db(db)


def measure_big_tx(target):
    db = "bench_stream_bigtx"
    psql(f"DROP DATABASE IF EXISTS {db}")
    psql(f"CREATE DATABASE {db}")
    url = URL.rsplit("/", 1)[0] + "/" + db
    psql("CREATE TABLE big (id bigint PRIMARY KEY, v int, pad text)", url)
    out = tempfile.mkdtemp(prefix="sluice-stream-bench-bigtx-")
    try:
        subprocess.run(
            [SLUICE, "stream", "--source", url, "--table", "public.big", "--to", out,
             "--initial", "none", "--until-current", "-q"], check=True)
        rows = target // 360
        psql(f"INSERT INTO big SELECT g, g, repeat(md5(g::text), 10) FROM generate_series(1, {rows}) g", url)
        report = os.path.join(out, "report.json")
        wall, cpu, rss, _, _ = timed([
            SLUICE, "stream", "--source", url, "--table", "public.big", "--to", out,
            "--until-current", "--memory", "64MB", "--report-json", report, "-q"])
        rep = json.load(open(report))
        return {"rows": rep["changes"], "transactions": rep["transactions"],
                "batches": rep["batches"], "wall": wall, "cpu": cpu, "rss": rss,
                "memory_target": 64 << 20}
    finally:
        shutil.rmtree(out, ignore_errors=True)
        drop_db(db)


def measure_steady(rate, seconds=30, batch_seconds=5):
    """A steady load of `rate` changes/s (10 transactions a second) while sluice streams with
    --batch-seconds: the delay from each change's commit to the moment its file is visible
    (the file's modification time, written and fsynced just before it is renamed)."""
    db = "bench_stream_steady"
    psql(f"DROP DATABASE IF EXISTS {db}")
    psql(f"CREATE DATABASE {db}")
    url = URL.rsplit("/", 1)[0] + "/" + db
    psql("CREATE TABLE steady (id bigint PRIMARY KEY, v int, pad text)", url)
    out = tempfile.mkdtemp(prefix="sluice-stream-bench-steady-")
    try:
        args = [SLUICE, "stream", "--source", url, "--table", "public.steady", "--to", out,
                "--initial", "none", "--format", "csv", "--batch-seconds", str(batch_seconds), "-q"]
        subprocess.run(args + ["--until-current"], check=True)
        proc = subprocess.Popen(args)
        pglab.steady_load(url, "steady", rate, seconds)
        time.sleep(batch_seconds + 3)
        proc.terminate()
        proc.wait(timeout=120)
        delays = []
        changes_dir = os.path.join(out, "public.steady", "changes")
        for f in os.listdir(changes_dir):
            path = os.path.join(changes_dir, f)
            visible = os.path.getmtime(path)
            with open(path) as fh:
                header = fh.readline().rstrip("\n").split(",")
                at = header.index("_commit_ts")
                for line in fh:
                    ts = line.rstrip("\n").split(",")[at]
                    commit = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00"))
                    delays.append(visible - commit.timestamp())
        delays.sort()
        p = lambda q: delays[min(len(delays) - 1, int(q * len(delays)))]
        return {"rate": rate, "seconds": seconds, "batch_seconds": batch_seconds,
                "changes": len(delays), "p50": p(0.5), "p99": p(0.99), "max": delays[-1]}
    finally:
        shutil.rmtree(out, ignore_errors=True)
        drop_db(db)


def pg_main():
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = [pg_measure_table(t, CHANGES) for t in ("narrow", "wide")]
    big = measure_big_tx(nbytes(BIG_TX)) if BIG_TX else None
    steady = measure_steady(size(STEADY)) if STEADY else None
    version = subprocess.run([SLUICE, "--version"], capture_output=True, text=True).stdout.strip()
    server = psql("SHOW server_version")
    data = {"started": started.isoformat(), "command": COMMAND, "sluice": version,
            "server": server, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "rows": rows, "big_tx": big, "steady": steady}
    with open(os.path.join(RESULTS, "results.json"), "w") as f:
        json.dump(data, f, indent=2)
    lines = ["# Change capture: sluice stream against pg_recvlogical", ""]
    lines += smoke_note("bench/stream/run --big-tx 1GB --steady 10k")
    lines += [
        f"Measured {started:%Y-%m-%d %H:%M} UTC with `{COMMAND}` ({version}; PostgreSQL {server}; "
        f"{data['machine']}). Raw figures: `{RESULTS}/results.json`.",
        "",
        "Each table gets a backlog of row changes in transactions of 1–100 rows (60% inserts, 30% "
        "updates, 10% deletes) while two slots wait on the same publication. The floor drains one "
        "with `pg_recvlogical -o proto_version=1 -o publication_names=… -f /dev/null` (decoding on "
        "the server, nothing decoded or written by the client); sluice drains the other into "
        "Parquet change files (zstd, fsync) with `sluice stream --until-current`. Rates are "
        "changes per second of wall time; CPU is the client's user + system time (the kernel's "
        "part is mostly receiving the stream, which the floor pays too), the user-space part "
        "apart.",
        "",
    ]
    lines += table_lines(rows, "wal_bytes", "WAL")
    for r in rows:
        if r.get("formats"):
            lines += [""] + format_lines(r["table"], r["formats"])
    if big:
        lines += ["", f"One transaction of {big['rows']:,} rows (about {BIG_TX}): streamed in "
                  f"{big['wall']:.1f} s in {big['batches']} batches, peak RSS {mb(big['rss'])} with "
                  f"`--memory 64MB`."]
    if steady:
        lines += ["", f"Steady load of {steady['rate']:,} changes/s for {steady['seconds']} s with "
                  f"`--batch-seconds {steady['batch_seconds']}`: delay from commit to visible file "
                  f"p50 {steady['p50']:.2f} s, p99 {steady['p99']:.2f} s, max {steady['max']:.2f} s "
                  f"over {steady['changes']:,} changes (target: p99 ≤ batch seconds + 1 s)."]
    lines += ["", TARGETS + " For comparison, Rigatoni (MongoDB change streams to S3) reports "
              "about 0.8 µs per event of in-memory processing and 10 k–100 k events/s end to end."]
    # The MySQL/MariaDB section is kept as it is.
    old = open(DOC).read() if os.path.exists(DOC) else ""
    tail = old[old.index(MARK_PREFIX):] if MARK_PREFIX in old else ""
    with open(DOC, "w") as f:
        f.write("\n".join(lines) + "\n" + ("\n" + tail if tail else ""))
    print("\n".join(lines))


# MySQL/MariaDB

def mysql_client():
    u = urlparse(URL)
    return ["--no-defaults", "-h", u.hostname, "-P", str(u.port), "-u", u.username,
            f"-p{u.password}"]


def mysql(text, db=None):
    p = subprocess.run(["mariadb"] + mysql_client() + ["-N", "-B"] + ([db] if db else []),
                       input=text, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"mariadb failed: {p.stderr.strip()}\n{text[:300]}")
    return p.stdout.strip()


MY_TABLES = {
    "narrow": "id bigint PRIMARY KEY, a int, b bigint, s varchar(40)",
    "wide": "id bigint PRIMARY KEY, "
    + ", ".join(f"i{k} int" for k in range(8))
    + ", "
    + ", ".join(f"n{k} decimal(12,2)" for k in range(4))
    + ", "
    + ", ".join(f"t{k} varchar(100)" for k in range(10))
    + ", ts timestamp(6) NULL",
}


def my_row_values(table):
    if table == "narrow":
        return "i, i % 1000, i * 7, MD5(i)"
    ints = ", ".join(f"i + {k}" for k in range(8))
    nums = ", ".join(f"(i % 10000) / 7.0 + {k}" for k in range(4))
    texts = ", ".join(f"REPEAT(MD5(i + {k}), 3)" for k in range(10))
    return f"i, {ints}, {nums}, {texts}, NOW(6)"


def my_backlog(table, n, db):
    setcol = "a = a + 1" if table == "narrow" else "i0 = i0 + 1"
    mysql(f"""DELIMITER //
        CREATE PROCEDURE load_{table}()
        BEGIN
          DECLARE done bigint DEFAULT 0; DECLARE i bigint DEFAULT 0;
          DECLARE k int; DECLARE r int DEFAULT 0; DECLARE j int;
          WHILE done < {n} DO
            SET k = 1 + (r * 37) % 100; SET r = r + 1; SET j = 1;
            START TRANSACTION;
            WHILE j <= k DO
              IF j % 10 < 6 OR i < 1000 THEN
                SET i = i + 1; INSERT INTO {table} VALUES ({my_row_values(table)});
              ELSEIF j % 10 < 9 THEN
                UPDATE {table} SET {setcol} WHERE id = i - (j * 13) % 500;
              ELSE
                DELETE FROM {table} WHERE id = i - (j * 17) % 900 - 1;
              END IF;
              SET j = j + 1;
            END WHILE;
            COMMIT;
            SET done = done + k;
          END WHILE;
        END //""", db)
    mysql(f"CALL load_{table}()", db)


def my_measure_table(table, n):
    db = f"bench_stream_{table}"
    mysql(f"DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db}")
    mysql(f"CREATE TABLE {table} ({MY_TABLES[table]})", db)
    url = URL.rsplit("/", 1)[0] + "/" + db
    out = tempfile.mkdtemp(prefix=f"sluice-stream-bench-{table}-")
    raw = tempfile.mkdtemp(prefix="sluice-binlog-raw-", dir="/dev/shm")
    try:
        args = [SLUICE, "stream", "--source", url, "--table", table, "--to", out, "-q"]
        subprocess.run(args + ["--initial", "none", "--until-current"], check=True)
        state = json.load(open(os.path.join(out, "_sluice", "stream.json")))
        # SSSSSSSSSS_OOOOOOOOOOOOOO, after a GTID resume gEEEEEE_…, then ~GTID state.
        seq, offset = state["committed"]["restart"].split("~")[0].split("_")[-2:]
        start_file = mysql("SHOW MASTER STATUS").split("\t")[0].rsplit(".", 1)[0] + f".{int(seq):06}"
        t0 = time.monotonic()
        my_backlog(table, n, db)
        load_s = time.monotonic() - t0
        status = mysql("SHOW MASTER STATUS").split("\t")
        floor = timed(["mariadb-binlog"] + mysql_client() + [
            "--read-from-remote-server", "--raw", f"--result-file={raw}/",
            f"--start-position={int(offset)}", "--to-last-log", start_file])
        fetched = sum(os.path.getsize(os.path.join(raw, f)) for f in os.listdir(raw))
        report = os.path.join(out, "report.json")
        ours = timed(args + ["--until-current", "--report-json", report])
        rep = json.load(open(report))
        changes = rep["changes"]
        row = {
            "table": table, "changes": changes, "transactions": rep["transactions"],
            "binlog_bytes": fetched, "load_seconds": round(load_s, 2), "end": status[:2],
            "floor": {"wall": floor[0], "cpu": floor[1], "user": floor[4], "rss": floor[2],
                      "changes_per_s": changes / floor[0]},
            "sluice": {"wall": ours[0], "cpu": ours[1], "user": ours[4], "rss": ours[2],
                       "changes_per_s": changes / ours[0],
                       "peak_rss_report": rep["peak_rss_bytes"]},
        }
        row["ratio_rate"] = row["sluice"]["changes_per_s"] / row["floor"]["changes_per_s"]
        row["cpu_us_per_change"] = ours[1] / changes * 1e6
        return row
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(raw, ignore_errors=True)
        mysql(f"DROP DATABASE IF EXISTS {db}")


def my_main():
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = [my_measure_table(t, CHANGES) for t in ("narrow", "wide")]
    version = subprocess.run([SLUICE, "--version"], capture_output=True, text=True).stdout.strip()
    server = mysql("SELECT VERSION()")
    data = {"started": started.isoformat(), "command": COMMAND, "sluice": version,
            "server": server, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "rows": rows}
    with open(os.path.join(RESULTS, "results-mysql.json"), "w") as f:
        json.dump(data, f, indent=2)
    lines = [MARK, "", "## MySQL/MariaDB: sluice stream against mariadb-binlog", ""]
    lines += smoke_note("bench/stream/run --mysql")
    lines += [
        f"Measured {started:%Y-%m-%d %H:%M} UTC with `{COMMAND}` ({version}; MariaDB {server}; "
        f"{data['machine']}). Raw figures: `{RESULTS}/results-mysql.json`.",
        "",
        "Each table gets a backlog of row changes in transactions of 1–100 rows (60% inserts, 30% "
        "updates, 10% deletes) after a stream has saved its position. The floor fetches that "
        "backlog with `mariadb-binlog --read-from-remote-server --raw` from the same position "
        "(raw events into a RAM directory, nothing decoded); sluice drains it into Parquet change "
        "files (zstd, fsync) with `sluice stream --until-current`. Rates are changes per second "
        "of wall time; CPU is the client's user + system time, the user-space part apart.",
        "",
    ]
    lines += table_lines(rows, "binlog_bytes", "binary log")
    lines += ["", TARGETS]
    old = open(DOC).read() if os.path.exists(DOC) else ""
    head = old.split(MARK_PREFIX)[0].rstrip("\n")
    with open(DOC, "w") as f:
        f.write((head + "\n\n" if head else "") + "\n".join(lines) + "\n")
    print("\n".join(lines))


pg_main() if ENGINE == "pg" else my_main()
