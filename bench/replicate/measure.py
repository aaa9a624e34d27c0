"""Drain one backlog of small transactions into a durable target: `sluice replicate --parallel N`
against the engines' own replication, measured in the same run on the same backlog.

Run by bench/replicate/run inside two nested `sluice-testkit run` calls: the outer one's
servers are the sources (SLUICE_BENCH_SOURCE_PG, SLUICE_BENCH_SOURCE_MY), the inner one's the
targets (SLUICE_TEST_PG_URL, SLUICE_TEST_MYSQL_URL), switched to durable commits here
(PostgreSQL fsync, full_page_writes, synchronous_commit on; MariaDB
innodb_flush_log_at_trx_commit=1, sync_binlog=1). Per engine:

1. The source gets the tables and their starting rows (`workload.py`); each sluice replication
   (one per --parallel N, its own --slot and --target-schema) does its initial load with
   `--initial snapshot --until-current`, and the native anchor is prepared: on PostgreSQL a
   disabled subscription (its slot made now) in the target cluster's `native` database, on
   MariaDB the source's GTID position before the backlog.
2. The backlog is written on the source while nothing applies it.
3. Timed drains, each from the same starting state to the last backlog transaction on the
   target: `sluice replicate --until-current` (process start to exit); MariaDB's replica (the
   target server, `bench` rebuilt to the starting rows, gtid_slave_pos set back, the IO thread
   fetching the whole backlog first, then `START SLAVE SQL_THREAD` timed until gtid_slave_pos
   reaches the source's) with slave_parallel_threads=N, slave_parallel_mode=optimistic; the
   PostgreSQL subscription (`ALTER SUBSCRIPTION … ENABLE` timed until the backlog's last row is
   visible: a subscription applies in commit order). Before them, the source-read floor: the
   backlog read and thrown away (`pg_recvlogical` on a slot made before the backlog,
   `mariadb-binlog --raw` from the position before it). Every target is then checked against the
   source table by table (row count and a sum of row hashes).

The `pgbench` pass does the same with pgbench's own TPC-B (`pgbench -i -I dtgvpf`, then a
rate-limited `pgbench -c 4 -j 2 -t … -R …` as the backlog): hot branch rows and an insert into
the keyless `pgbench_history` in every transaction.
"""

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlsplit

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402
import workload  # noqa: E402
from sluicebench import machine  # noqa: E402
from sluicebench import mariadb as my  # noqa: E402

SLUICE = os.environ["SLUICE_BENCH_SLUICE"]
RESULTS = os.environ["SLUICE_BENCH_RESULTS"]
ENGINES = os.environ.get("SLUICE_BENCH_ENGINES", "pg,mariadb").split(",")
PARALLEL = [int(p) for p in os.environ.get("SLUICE_BENCH_PARALLEL", "1,2,4,8").split(",")]
# sluice, native or both: the anchors alone check the lab without a sluice that can replicate.
APPLIERS = os.environ.get("SLUICE_BENCH_APPLIERS", "sluice,native").split(",")
# Which profile built the binary: from its directory, unless SLUICE_BENCH_BUILD says.
_REAL = os.path.realpath(SLUICE)
BUILD = os.environ.get("SLUICE_BENCH_BUILD") or (
    "debug" if "/debug/" in _REAL else "release" if "/release/" in _REAL else "unknown")
POLL_S = 0.02
TIMEOUT_S = float(os.environ.get("SLUICE_BENCH_TIMEOUT", "3600"))


def size(text):
    m = re.fullmatch(r"(\d+)([kKmM]?)", text.strip())
    if not m:
        raise SystemExit(f"--transactions {text!r}: a number with k or m")
    return int(m.group(1)) * {"": 1, "k": 1000, "m": 10**6}[m.group(2).lower()]


TRANSACTIONS = size(os.environ.get("SLUICE_BENCH_TRANSACTIONS", "20k"))


def log(msg):
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {msg}", flush=True)


def pg_url(url, db):
    return urlsplit(url)._replace(path="/" + db).geturl()


def pg(url):
    return psycopg.connect(url, autocommit=True)


def timed(argv):
    """Run argv under GNU time: (wall s, cpu s, peak RSS bytes); fails loudly on a non-zero exit."""
    start = time.monotonic()
    p = subprocess.run(["/usr/bin/time", "-f", "TIME %e %U %S %M"] + argv,
                       capture_output=True, text=True)
    wall = time.monotonic() - start
    out = p.stdout + p.stderr
    if p.returncode != 0:
        raise SystemExit(f"{argv[0]} {argv[1]} failed ({p.returncode}):\n{out[-3000:]}")
    m = re.search(r"TIME (\S+) (\S+) (\S+) (\d+)", out)
    return wall, float(m.group(2)) + float(m.group(3)), int(m.group(4)) * 1024


def wait_until(check, what):
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {TIMEOUT_S:.0f} s waiting for {what}")
        time.sleep(POLL_S)
    return time.monotonic()


def run_script(argv, text, what):
    t0 = time.monotonic()
    p = subprocess.run(argv, input=text, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{what} failed: {p.stderr.strip()[:2000]}")
    return time.monotonic() - t0


def checksums(query, engine, schema):
    return {t: list(query(workload.checksum_sql(engine, schema, t))) for t in workload.TABLES}


def replicate_args(source, target, schema, n, target_schema):
    return [SLUICE, "replicate", "-q", "--source", source, "--target", target, "--schema", schema,
            "--target-schema", target_schema, "--slot", f"bench_{target_schema}",
            "--parallel", str(n), "--until-current"]


def sluice_drain(args, report_path, verify):
    """One timed `sluice replicate --until-current`: wall, CPU, RSS and its own report."""
    load = os.getloadavg()[0]
    wall, cpu, rss = timed(args + ["--report-json", report_path])
    rep = json.load(open(report_path))
    verify()
    keep = ("transactions", "changes", "units", "conflicts", "aborts", "wall_seconds",
            "transactions_per_second", "peak_rss_bytes")
    return {"wall": wall, "cpu": cpu, "rss": rss, "load": load,
            "report": {k: rep.get(k) for k in keep}}


# --- PostgreSQL → PostgreSQL -------------------------------------------------------------------

def measure_pg(src_admin, tgt_admin, txs):
    src_url = pg_url(src_admin, "bench")
    with pg(src_admin) as c:
        c.execute("DROP DATABASE IF EXISTS bench")
        c.execute("CREATE DATABASE bench")
    with pg(tgt_admin) as c:
        for stmt in ("ALTER SYSTEM SET fsync = on", "ALTER SYSTEM SET full_page_writes = on",
                     "ALTER SYSTEM SET synchronous_commit = on"):
            c.execute(stmt)
        c.execute("SELECT pg_reload_conf()")
        for db in ("target", "native"):
            c.execute(f"DROP DATABASE IF EXISTS {db}")
            c.execute(f"CREATE DATABASE {db}")
        time.sleep(0.5)
        settings = dict(c.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('fsync', 'synchronous_commit', 'full_page_writes', 'wal_sync_method')").fetchall())
        version = c.execute("SELECT version()").fetchone()[0]
    if settings.get("fsync") != "on" or settings.get("synchronous_commit") != "on":
        raise SystemExit(f"the target did not take durable settings: {settings}")
    tgt_url, native_url = pg_url(tgt_admin, "target"), pg_url(tgt_admin, "native")
    for url in (src_url, native_url):
        with pg(url) as c:
            for stmt in workload.DDL + workload.starting_rows():
                c.execute(stmt)
    with pg(src_url) as c:
        c.execute("CREATE PUBLICATION native_pub FOR TABLE accounts, orders, ledger")
    s = urlsplit(src_admin)
    with pg(native_url) as c:
        c.execute(
            f"CREATE SUBSCRIPTION native CONNECTION 'host={s.hostname} port={s.port} "
            f"user={s.username} dbname=bench' PUBLICATION native_pub WITH (copy_data = false, "
            "enabled = false, synchronous_commit = 'on')")
    initial = {}
    for n in PARALLEL if "sluice" in APPLIERS else []:
        log(f"pg: initial load for --parallel {n}")
        wall, _, _ = timed(replicate_args(src_url, tgt_url, "public", n, f"p{n}")
                           + ["--initial", "snapshot"])
        initial[n] = wall
    with pg(src_url) as c:
        # The source-read floor: a slot of its own on the same publication, drained after the
        # backlog by pg_recvlogical (decoding on the server, nothing applied).
        c.execute("SELECT pg_create_logical_replication_slot('floor', 'pgoutput')")
        lsn0 = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    log(f"pg: writing the backlog ({len(txs):,} transactions)")
    load_s = run_script(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", src_url, "-f", "-"],
                        workload.script(txs), "psql (backlog)")
    with pg(src_url) as c:
        wal = c.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (lsn0,)).fetchone()[0]
        end = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        source_sums = checksums(lambda q: c.execute(q).fetchone(), "pg", "public")

    def verify(url, schema, who):
        with pg(url) as c:
            got = checksums(lambda q: c.execute(q).fetchone(), "pg", schema)
        if got != source_sums:
            raise SystemExit(f"pg: {who} differs from the source: {got} != {source_sums}")

    rows = []
    log("pg: source-read floor (pg_recvlogical)")
    load = os.getloadavg()[0]
    wall, cpu, rss = timed(["pg_recvlogical", "-d", src_url, "--slot", "floor", "--start",
                            "-o", "proto_version=1", "-o", "publication_names=native_pub",
                            "--endpos", end, "-f", "/dev/null", "--no-loop"])
    with pg(src_url) as c:
        c.execute("SELECT pg_drop_replication_slot('floor')")
    rows.append({"applier": "floor", "threads": 1, "wall": wall, "cpu": cpu, "rss": rss,
                 "load": load})
    with pg(tgt_admin) as c:
        c.execute("CHECKPOINT")
    if "native" in APPLIERS:
        log("pg: native subscription")
        with pg(native_url) as c:
            load = os.getloadavg()[0]
            t0 = time.monotonic()
            c.execute("ALTER SUBSCRIPTION native ENABLE")
            t1 = wait_until(lambda: c.execute("SELECT 1 FROM ledger WHERE id = %s",
                                              (workload.SENTINEL_ID,)).fetchone() is not None,
                            "the subscription")
            c.execute("ALTER SUBSCRIPTION native DISABLE")
        verify(native_url, "public", "the native subscription")
        rows.append({"applier": "native", "threads": 1, "wall": t1 - t0, "load": load})
    for n in PARALLEL if "sluice" in APPLIERS else []:
        with pg(tgt_admin) as c:
            c.execute("CHECKPOINT")
        log(f"pg: sluice --parallel {n}")
        r = sluice_drain(replicate_args(src_url, tgt_url, "public", n, f"p{n}"),
                         os.path.join(RESULTS, f"pg-p{n}.json"),
                         lambda: verify(tgt_url, f"p{n}", f"sluice --parallel {n}"))
        rows.append({"applier": "sluice", "threads": n, "initial_load": initial[n], **r})
    with pg(native_url) as c:
        c.execute("ALTER SUBSCRIPTION native SET (slot_name = NONE)")
        c.execute("DROP SUBSCRIPTION native")
    return {"pair": "PostgreSQL → PostgreSQL", "engine": "pg", "server": version,
            "target_settings": settings, "backlog_load_seconds": load_s, "wal_bytes": int(wal),
            "rows": rows}


# --- PostgreSQL → PostgreSQL, pgbench's TPC-B ----------------------------------------------------

PGBENCH_SCALE = int(os.environ.get("SLUICE_BENCH_PGBENCH_SCALE", "5"))
PGBENCH_RATE = int(os.environ.get("SLUICE_BENCH_PGBENCH_RATE", "1500"))
PGBENCH_TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")


def pgbench_sums(c, schema):
    """What the backlog leaves, compared between source and each target: the balances' sums,
    the history's rows and deltas."""
    one = lambda q: c.execute(q).fetchone()  # noqa: E731
    return [one(f"SELECT count(*), coalesce(sum(abalance), 0) FROM {schema}.pgbench_accounts"),
            one(f"SELECT count(*), coalesce(sum(bbalance), 0) FROM {schema}.pgbench_branches"),
            one(f"SELECT count(*), coalesce(sum(tbalance), 0) FROM {schema}.pgbench_tellers"),
            one(f"SELECT count(*), coalesce(sum(delta), 0) FROM {schema}.pgbench_history")]


def measure_pgbench(src_admin, tgt_admin, transactions):
    """pgbench's TPC-B: every transaction updates an account, a teller and one of SCALE hot
    branch rows, and inserts into the keyless pgbench_history (REPLICA IDENTITY FULL). The
    backlog is a rate-limited `pgbench` run written while nothing applies it."""
    src_url = pg_url(src_admin, "pgb")
    with pg(src_admin) as c:
        c.execute("DROP DATABASE IF EXISTS pgb")
        c.execute("CREATE DATABASE pgb")
    with pg(tgt_admin) as c:
        for stmt in ("ALTER SYSTEM SET fsync = on", "ALTER SYSTEM SET full_page_writes = on",
                     "ALTER SYSTEM SET synchronous_commit = on"):
            c.execute(stmt)
        c.execute("SELECT pg_reload_conf()")
        for db in ("pgb_target", "pgb_native"):
            c.execute(f"DROP DATABASE IF EXISTS {db}")
            c.execute(f"CREATE DATABASE {db}")
        version = c.execute("SELECT version()").fetchone()[0]
        settings = dict(c.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('fsync', 'synchronous_commit', 'full_page_writes', 'wal_sync_method')").fetchall())
    tgt_url, native_url = pg_url(tgt_admin, "pgb_target"), pg_url(tgt_admin, "pgb_native")
    for url in (src_url, native_url):
        run_script(["pgbench", "-q", "-i", "-I", "dtgvpf", "-s", str(PGBENCH_SCALE), url], "",
                   "pgbench -i")
    with pg(src_url) as c:
        c.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL")
        c.execute("CREATE PUBLICATION native_pub FOR TABLE " + ", ".join(PGBENCH_TABLES))
    s = urlsplit(src_admin)
    with pg(native_url) as c:
        c.execute(
            f"CREATE SUBSCRIPTION pgb_native CONNECTION 'host={s.hostname} port={s.port} "
            f"user={s.username} dbname=pgb' PUBLICATION native_pub WITH (copy_data = false, "
            "enabled = false, synchronous_commit = 'on')")
    initial = {}
    for n in PARALLEL if "sluice" in APPLIERS else []:
        log(f"pgbench: initial load for --parallel {n}")
        wall, _, _ = timed([SLUICE, "replicate", "-q", "--source", src_url, "--target", tgt_url,
                            "--schema", "public", "--target-schema", f"p{n}",
                            "--slot", f"pgb_p{n}", "--parallel", str(n), "--until-current",
                            "--initial", "snapshot"])
        initial[n] = wall
    with pg(src_url) as c:
        c.execute("SELECT pg_create_logical_replication_slot('pgb_floor', 'pgoutput')")
        lsn0 = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    clients = 4
    per_client = max(1, transactions // clients)
    log(f"pgbench: writing the backlog ({clients * per_client:,} transactions at "
        f"{PGBENCH_RATE}/s)")
    load_s = run_script(["pgbench", "-n", "-c", str(clients), "-j", "2", "-t", str(per_client),
                         "-R", str(PGBENCH_RATE), src_url], "", "pgbench (backlog)")
    with pg(src_url) as c:
        # The last transaction: a row the anchor's drain waits for.
        c.execute("INSERT INTO pgbench_history (tid, bid, aid, delta, mtime, filler) "
                  "VALUES (1, 1, 1, 0, now(), 'sluice-end')")
        wal = c.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (lsn0,)).fetchone()[0]
        end = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        source_sums = pgbench_sums(c, "public")
    n_tx = clients * per_client + 1

    def verify(url, schema, who):
        with pg(url) as c:
            got = pgbench_sums(c, schema)
        if got != source_sums:
            raise SystemExit(f"pgbench: {who} differs from the source: {got} != {source_sums}")

    rows = []
    log("pgbench: source-read floor (pg_recvlogical)")
    load = os.getloadavg()[0]
    wall, cpu, rss = timed(["pg_recvlogical", "-d", src_url, "--slot", "pgb_floor", "--start",
                            "-o", "proto_version=1", "-o", "publication_names=native_pub",
                            "--endpos", end, "-f", "/dev/null", "--no-loop"])
    with pg(src_url) as c:
        c.execute("SELECT pg_drop_replication_slot('pgb_floor')")
    rows.append({"applier": "floor", "threads": 1, "wall": wall, "cpu": cpu, "rss": rss,
                 "load": load})
    if "native" in APPLIERS:
        with pg(tgt_admin) as c:
            c.execute("CHECKPOINT")
        log("pgbench: native subscription")
        with pg(native_url) as c:
            load = os.getloadavg()[0]
            t0 = time.monotonic()
            c.execute("ALTER SUBSCRIPTION pgb_native ENABLE")
            t1 = wait_until(lambda: c.execute(
                "SELECT 1 FROM pgbench_history WHERE filler = 'sluice-end'").fetchone()
                is not None,
                "the subscription")
            c.execute("ALTER SUBSCRIPTION pgb_native DISABLE")
        verify(native_url, "public", "the native subscription")
        rows.append({"applier": "native", "threads": 1, "wall": t1 - t0, "load": load})
    for n in PARALLEL if "sluice" in APPLIERS else []:
        with pg(tgt_admin) as c:
            c.execute("CHECKPOINT")
        log(f"pgbench: sluice --parallel {n}")
        r = sluice_drain([SLUICE, "replicate", "-q", "--source", src_url, "--target", tgt_url,
                          "--schema", "public", "--target-schema", f"p{n}",
                          "--slot", f"pgb_p{n}", "--parallel", str(n), "--until-current"],
                         os.path.join(RESULTS, f"pgbench-p{n}.json"),
                         lambda: verify(tgt_url, f"p{n}", f"sluice --parallel {n}"))
        rows.append({"applier": "sluice", "threads": n, "initial_load": initial[n], **r})
    with pg(native_url) as c:
        c.execute("ALTER SUBSCRIPTION pgb_native SET (slot_name = NONE)")
        c.execute("DROP SUBSCRIPTION pgb_native")
    with pg(src_url) as c:
        c.execute("SELECT pg_drop_replication_slot('pgb_native')")
        for n in PARALLEL if "sluice" in APPLIERS else []:
            c.execute("SELECT pg_drop_replication_slot(%s)", (f"pgb_p{n}",))
    return {"pair": f"PostgreSQL → PostgreSQL, pgbench TPC-B (scale {PGBENCH_SCALE})",
            "engine": "pg", "workload": "pgbench", "transactions": n_tx, "server": version,
            "target_settings": settings, "backlog_load_seconds": load_s, "wal_bytes": int(wal),
            "rows": rows}


# --- MariaDB → MariaDB -------------------------------------------------------------------------

def measure_mariadb(src_root, tgt_root, txs):
    src_url = my.with_database(src_root, "bench")
    src, tgt = my.connect(src_root), my.connect(tgt_root)

    def q(conn, sql, args=None):
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall()

    def one(conn, sql):
        return q(conn, sql)[0]

    q(src, "DROP DATABASE IF EXISTS bench")
    q(src, "CREATE DATABASE bench")
    q(src, "USE bench")
    for stmt in workload.DDL + workload.starting_rows():
        q(src, stmt)
    gtid0 = one(src, "SELECT @@gtid_binlog_pos")[0]
    # The target is also the replica: its own id and GTID domain, so that sluice's writes into
    # it never look like the source's transactions.
    for stmt in ("SET GLOBAL server_id = 2", "SET GLOBAL gtid_domain_id = 2",
                 "SET GLOBAL innodb_flush_log_at_trx_commit = 1", "SET GLOBAL sync_binlog = 1"):
        q(tgt, stmt)
    settings = dict(q(tgt, "SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                           "('innodb_flush_log_at_trx_commit', 'sync_binlog', 'log_bin', "
                           "'log_slave_updates', 'innodb_flush_method', 'slave_parallel_max_queued')"))
    version = one(tgt, "SELECT VERSION()")[0]
    initial = {}
    for n in PARALLEL if "sluice" in APPLIERS else []:
        log(f"mariadb: initial load for --parallel {n}")
        q(tgt, f"DROP DATABASE IF EXISTS m{n}")
        wall, _, _ = timed(replicate_args(src_url, tgt_root, "bench", n, f"m{n}")
                           + ["--initial", "snapshot"])
        initial[n] = wall
    start = one(src, "SHOW MASTER STATUS")
    log(f"mariadb: writing the backlog ({len(txs):,} transactions)")
    load_s = run_script(["mariadb", "--no-defaults", *my.cli_args(src_url)],
                        workload.script(txs), "mariadb (backlog)")
    gtid1 = one(src, "SELECT @@gtid_binlog_pos")[0]
    master = one(src, "SHOW MASTER STATUS")
    source_sums = checksums(lambda s: one(src, s), "my", "bench")

    def verify(schema, who):
        got = checksums(lambda s: one(tgt, s), "my", schema)
        if got != source_sums:
            raise SystemExit(f"mariadb: {who} differs from the source: {got} != {source_sums}")

    p = my._parts(src_root)
    rows = []
    # The source-read floor: the backlog's events fetched from the server as a replica does,
    # written raw into a RAM directory (nothing decoded or applied).
    log("mariadb: source-read floor (mariadb-binlog --raw)")
    raw = tempfile.mkdtemp(prefix="sluice-replbench-binlog-", dir="/dev/shm")
    try:
        load = os.getloadavg()[0]
        wall, cpu, rss = timed(["mariadb-binlog", "--no-defaults", *my.cli_args(src_url)[:-1],
                                "--read-from-remote-server", "--raw", f"--result-file={raw}/",
                                f"--start-position={int(start[1])}", "--to-last-log", start[0]])
    finally:
        shutil.rmtree(raw, ignore_errors=True)
    rows.append({"applier": "floor", "threads": 1, "wall": wall, "cpu": cpu, "rss": rss,
                 "load": load})

    def slave_status():
        with tgt.cursor() as cur:
            cur.execute("SHOW SLAVE STATUS")
            row = cur.fetchone()
            return dict(zip([d[0] for d in cur.description], row)) if row else {}

    def fetched():
        st = slave_status()
        if st.get("Last_IO_Error"):
            raise SystemExit(f"mariadb replica IO thread: {st['Last_IO_Error']}")
        return (st.get("Master_Log_File"), int(st.get("Read_Master_Log_Pos") or 0)) == (
            master[0], int(master[1]))

    def applied():
        st = slave_status()
        if st.get("Last_SQL_Error"):
            raise SystemExit(f"mariadb replica SQL thread: {st['Last_SQL_Error']}")
        return one(tgt, "SELECT @@gtid_slave_pos")[0] == gtid1

    def native_drain(n):
        log(f"mariadb: native replica, slave_parallel_threads={n}")
        q(tgt, "STOP SLAVE")
        q(tgt, "RESET SLAVE ALL")
        # The starting rows again, outside the replica's binary log.
        q(tgt, "SET SESSION sql_log_bin = 0")
        q(tgt, "DROP DATABASE IF EXISTS bench")
        q(tgt, "CREATE DATABASE bench")
        q(tgt, "USE bench")
        for stmt in workload.DDL + workload.starting_rows():
            q(tgt, stmt)
        q(tgt, "SET SESSION sql_log_bin = 1")
        q(tgt, "SET GLOBAL gtid_slave_pos = %s", (gtid0,))
        q(tgt, f"SET GLOBAL slave_parallel_threads = {n}")
        q(tgt, "SET GLOBAL slave_parallel_mode = 'optimistic'")
        q(tgt, "CHANGE MASTER TO MASTER_HOST = %s, MASTER_PORT = %s, MASTER_USER = %s, "
               "MASTER_PASSWORD = %s, MASTER_USE_GTID = slave_pos",
          (p["host"], p["port"], p["user"], p["password"]))
        q(tgt, "START SLAVE IO_THREAD")
        wait_until(fetched, "the replica's IO thread to fetch the backlog")
        q(tgt, "FLUSH TABLES")
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        q(tgt, "START SLAVE SQL_THREAD")
        t1 = wait_until(applied, "the replica's SQL thread")
        q(tgt, "STOP SLAVE")
        verify("bench", f"the replica with {n} threads")
        rows.append({"applier": "native", "threads": n, "wall": t1 - t0, "load": load})

    for n in PARALLEL:
        if "native" in APPLIERS:
            native_drain(n)
        if "sluice" not in APPLIERS:
            continue
        log(f"mariadb: sluice --parallel {n}")
        q(tgt, "FLUSH TABLES")
        r = sluice_drain(replicate_args(src_url, tgt_root, "bench", n, f"m{n}"),
                         os.path.join(RESULTS, f"mariadb-p{n}.json"),
                         lambda: verify(f"m{n}", f"sluice --parallel {n}"))
        rows.append({"applier": "sluice", "threads": n, "initial_load": initial[n], **r})
    q(tgt, "RESET SLAVE ALL")
    return {"pair": "MariaDB → MariaDB", "engine": "mariadb", "server": version,
            "target_settings": settings, "backlog_load_seconds": load_s,
            "gtid": [gtid0, gtid1], "binlog_end": list(master[:2]), "rows": rows}


def fdatasync_us():
    """Median µs of an 8 KB write + fdatasync in the temporary directory the servers' data
    directories are in: what one durable commit costs at least on this disk."""
    import tempfile
    times = []
    with tempfile.NamedTemporaryFile(prefix="sluice-replbench-fsync-") as f:
        block = b"\0" * 8192
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            t0 = time.perf_counter()
            os.pwrite(f.fileno(), block, 0)
            os.fdatasync(f.fileno())
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e6


def main():
    started = datetime.datetime.now(datetime.timezone.utc)
    os.makedirs(RESULTS, exist_ok=True)
    log(f"generating the backlog: {TRANSACTIONS:,} transactions")
    txs, counts = workload.backlog(TRANSACTIONS)
    passes = []
    if "pg" in ENGINES:
        passes.append(measure_pg(os.environ["SLUICE_BENCH_SOURCE_PG"],
                                 os.environ["SLUICE_TEST_PG_URL"], txs))
    if "pgbench" in ENGINES:
        passes.append(measure_pgbench(os.environ["SLUICE_BENCH_SOURCE_PG"],
                                      os.environ["SLUICE_TEST_PG_URL"],
                                      int(os.environ.get("SLUICE_BENCH_PGBENCH_TRANSACTIONS",
                                                         "16000"))))
    if "mariadb" in ENGINES:
        passes.append(measure_mariadb(os.environ["SLUICE_BENCH_SOURCE_MY"],
                                      os.environ["SLUICE_TEST_MYSQL_URL"], txs))
    data = {
        "started": started.isoformat(),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "command": os.environ.get("SLUICE_BENCH_COMMAND", "bench/replicate/run"),
        "sluice": SLUICE,
        "build": BUILD,
        "machine": machine.describe(SLUICE, None),
        "backlog": counts,
        "fdatasync_us": fdatasync_us(),
        "passes": passes,
    }
    with open(os.path.join(RESULTS, "results.json"), "w") as f:
        json.dump(data, f, indent=2)
    page = report.render(data, RESULTS)
    with open(os.environ["SLUICE_BENCH_DOC"], "w") as f:
        f.write(page)
    print(page)


main()
