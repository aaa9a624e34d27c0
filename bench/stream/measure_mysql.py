"""Drain the same binary log backlog with mariadb-binlog (the floor) and `sluice stream`.

Run by `bench/stream/run --mysql` inside `sluice-testkit run --mariadb`. Standard library only.
For each table (narrow: 4 columns; wide: 24 columns, ~1 KB a row) a stream is started first
(`--initial none`, so it holds the position), then a backlog of row changes is written in
transactions of 1 to 100 rows (60% inserts, 30% updates, 10% deletes). The floor fetches that
backlog with `mariadb-binlog --read-from-remote-server --raw` from the stream's position (raw
events written to a RAM directory: nothing decoded), sluice drains it into Parquet change
files. Each drain is timed with GNU time (wall, user+system CPU, peak RSS). The results
replace the MySQL section of the stream benchmark page.
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

URL = os.environ["SLUICE_TEST_MYSQL_URL"]
SLUICE = os.environ["SLUICE_BENCH_SLUICE"]
RESULTS = os.environ["SLUICE_BENCH_RESULTS"]
DOC = os.environ["SLUICE_BENCH_DOC"]
COMMAND = os.environ.get("SLUICE_BENCH_COMMAND", "bench/stream/run --mysql")
MARK = "<!-- MySQL/MariaDB section: written by bench/stream/measure_mysql.py -->"

U = urlparse(URL)
CLIENT = ["--no-defaults", "-h", U.hostname, "-P", str(U.port), "-u", U.username,
          f"-p{U.password}"]


def size(text):
    m = re.fullmatch(r"(\d+)([kKmMgG]?)", text.strip())
    if not m:
        raise SystemExit(f"--changes {text!r}: a number with k or m")
    return int(m.group(1)) * {"": 1, "k": 1000, "m": 10**6, "g": 10**9}[m.group(2).lower()]


CHANGES = size(os.environ["SLUICE_BENCH_CHANGES"])


def sql(text, db=None):
    p = subprocess.run(["mariadb"] + CLIENT + ["-N", "-B"] + ([db] if db else []),
                       input=text, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"mariadb failed: {p.stderr.strip()}\n{text[:300]}")
    return p.stdout.strip()


TABLES = {
    "narrow": "id bigint PRIMARY KEY, a int, b bigint, s varchar(40)",
    "wide": "id bigint PRIMARY KEY, "
    + ", ".join(f"i{k} int" for k in range(8))
    + ", "
    + ", ".join(f"n{k} decimal(12,2)" for k in range(4))
    + ", "
    + ", ".join(f"t{k} varchar(100)" for k in range(10))
    + ", ts timestamp(6) NULL",
}


def row_values(table):
    if table == "narrow":
        return "i, i % 1000, i * 7, MD5(i)"
    ints = ", ".join(f"i + {k}" for k in range(8))
    nums = ", ".join(f"(i % 10000) / 7.0 + {k}" for k in range(4))
    texts = ", ".join(f"REPEAT(MD5(i + {k}), 3)" for k in range(10))
    return f"i, {ints}, {nums}, {texts}, NOW(6)"


def backlog(table, n, db):
    setcol = "a = a + 1" if table == "narrow" else "i0 = i0 + 1"
    sql(f"""DELIMITER //
        CREATE PROCEDURE load_{table}()
        BEGIN
          DECLARE done bigint DEFAULT 0; DECLARE i bigint DEFAULT 0;
          DECLARE k int; DECLARE r int DEFAULT 0; DECLARE j int;
          WHILE done < {n} DO
            SET k = 1 + (r * 37) % 100; SET r = r + 1; SET j = 1;
            START TRANSACTION;
            WHILE j <= k DO
              IF j % 10 < 6 OR i < 1000 THEN
                SET i = i + 1; INSERT INTO {table} VALUES ({row_values(table)});
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
    sql(f"CALL load_{table}()", db)


def timed(argv):
    start = time.monotonic()
    p = subprocess.run(["/usr/bin/time", "-f", "TIME %e %U %S %M"] + argv,
                       capture_output=True, text=True)
    wall = time.monotonic() - start
    out = p.stdout + p.stderr
    if p.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({p.returncode}):\n{out[-3000:]}")
    m = re.search(r"TIME (\S+) (\S+) (\S+) (\d+)", out)
    return wall, float(m.group(2)) + float(m.group(3)), int(m.group(4)) * 1024, out


def measure_table(table, n):
    db = f"bench_stream_{table}"
    sql(f"DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db}")
    sql(f"CREATE TABLE {table} ({TABLES[table]})", db)
    url = URL.rsplit("/", 1)[0] + "/" + db
    out = tempfile.mkdtemp(prefix=f"sluice-stream-bench-{table}-")
    raw = tempfile.mkdtemp(prefix="sluice-binlog-raw-", dir="/dev/shm")
    try:
        args = [SLUICE, "stream", "--source", url, "--table", table, "--to", out, "-q"]
        subprocess.run(args + ["--initial", "none", "--until-current"], check=True)
        state = json.load(open(os.path.join(out, "_sluice", "stream.json")))
        seq, offset = state["committed"]["restart"].split("_")
        start_file = sql("SHOW MASTER STATUS").split("\t")[0].rsplit(".", 1)[0] + f".{int(seq):06}"
        t0 = time.monotonic()
        backlog(table, n, db)
        load_s = time.monotonic() - t0
        status = sql("SHOW MASTER STATUS").split("\t")
        floor = timed(["mariadb-binlog"] + CLIENT + [
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
            "floor": {"wall": floor[0], "cpu": floor[1], "rss": floor[2],
                      "changes_per_s": changes / floor[0]},
            "sluice": {"wall": ours[0], "cpu": ours[1], "rss": ours[2],
                       "changes_per_s": changes / ours[0],
                       "peak_rss_report": rep["peak_rss_bytes"]},
        }
        row["ratio_rate"] = row["sluice"]["changes_per_s"] / row["floor"]["changes_per_s"]
        row["cpu_us_per_change"] = ours[1] / changes * 1e6
        return row
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(raw, ignore_errors=True)
        sql(f"DROP DATABASE IF EXISTS {db}")


def main():
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = [measure_table(t, CHANGES) for t in ("narrow", "wide")]
    version = subprocess.run([SLUICE, "--version"], capture_output=True, text=True).stdout.strip()
    server = sql("SELECT VERSION()")
    data = {"started": started.isoformat(), "command": COMMAND, "sluice": version,
            "server": server, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "rows": rows}
    with open(os.path.join(RESULTS, "results-mysql.json"), "w") as f:
        json.dump(data, f, indent=2)
    mb = lambda b: f"{b / (1 << 20):.0f} MB"
    smoke = "/debug" in SLUICE or CHANGES < 5 * 10**6
    lines = [MARK, "", "## MySQL/MariaDB: sluice stream against mariadb-binlog", ""]
    if smoke:
        lines += ["**Smoke pass only** (" + ("a debug build, " if "/debug" in SLUICE else "")
                  + f"{CHANGES:,} changes a table: the figures show the lab works, not what "
                  "sluice does; the reference pass is `bench/stream/run --mysql` with a release "
                  "build on a quiet machine).", ""]
    lines += [
        f"Measured {started:%Y-%m-%d %H:%M} UTC with `{COMMAND}` ({version}; MariaDB {server}; "
        f"{data['machine']}). Raw figures: `{RESULTS}/results-mysql.json`.",
        "",
        "Each table gets a backlog of row changes in transactions of 1–100 rows (60% inserts, 30% "
        "updates, 10% deletes) after a stream has saved its position. The floor fetches that "
        "backlog with `mariadb-binlog --read-from-remote-server --raw` from the same position "
        "(raw events into a RAM directory, nothing decoded); sluice drains it into Parquet change "
        "files (zstd, fsync) with `sluice stream --until-current`. Rates are changes per second "
        "of wall time; CPU is the client's user + system time.",
        "",
        "| table | changes | binary log | floor changes/s | sluice changes/s | sluice ÷ floor | sluice CPU µs/change | floor RSS | sluice RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['table']} | {r['changes']:,} | {mb(r['binlog_bytes'])} | "
            f"{r['floor']['changes_per_s']:,.0f} | {r['sluice']['changes_per_s']:,.0f} | "
            f"{r['ratio_rate']:.2f}× | {r['cpu_us_per_change']:.2f} | {mb(r['floor']['rss'])} | "
            f"{mb(r['sluice']['rss'])} |")
    lines += ["", "Targets (issue): ≥ 0.9× the floor's rate, ≤ 1 µs of client CPU per change, "
              "peak RSS ≤ 64 MiB."]
    old = open(DOC).read() if os.path.exists(DOC) else ""
    head = old.split(MARK)[0].rstrip("\n")
    with open(DOC, "w") as f:
        f.write((head + "\n\n" if head else "") + "\n".join(lines) + "\n")
    print("\n".join(lines))


main()
