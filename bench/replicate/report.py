"""docs/replicate/benchmarks.md from one run's results (the dict measure.py writes as
results.json), so `bench/replicate/run --report-only DIR` re-renders it without measuring."""

import datetime
import json
import os
import sys

REFERENCE = "bench/replicate/run --transactions 200k"


def _ratio(a, b):
    return f"{a / b:.2f}×" if a and b else "–"


def _rows(p, n_tx):
    native = {r["threads"]: r for r in p["rows"] if r["applier"] == "native"}
    sluice = {r["threads"]: r for r in p["rows"] if r["applier"] == "sluice"}
    one = sluice.get(1)
    serial_anchor = p["engine"] == "pg"
    out = [
        "| applier | threads | drain s | transactions/s | ÷ anchor | ÷ sluice p1 | target transactions | "
        "conflicts retried | client CPU s | peak RSS | load avg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    floor = next((r for r in p["rows"] if r["applier"] == "floor"), None)
    for r in sorted(p["rows"], key=lambda r: (r["applier"] != "floor", r["threads"],
                                              r["applier"] != "native")):
        rep = r.get("report") or {}
        anchor = native.get(1 if serial_anchor else r["threads"])
        if r["applier"] == "floor":
            tool = "pg_recvlogical" if serial_anchor else "mariadb-binlog --raw"
            out.append(
                f"| source read only (`{tool}`, nothing applied) | 1 | {r['wall']:.1f} | "
                f"{n_tx / r['wall']:,.0f} | – | – | – | – | {r['cpu']:.1f} | "
                f"{r['rss'] / (1 << 20):.0f} MB | {r['load']:.1f} |")
            continue
        if r["applier"] == "native":
            name = ("subscription (serial apply)" if serial_anchor
                    else "MariaDB replica, optimistic")
            out.append(
                f"| {name} | {r['threads']} | {r['wall']:.1f} | {n_tx / r['wall']:,.0f} | 1.00× | – | – | – | – | – | "
                f"{r['load']:.1f} |")
            continue
        out.append(
            f"| `sluice replicate --parallel {r['threads']}` | {r['threads']} | {r['wall']:.1f} | "
            f"{rep.get('transactions', 0) / r['wall']:,.0f} | "
            f"{_ratio(r['wall'], anchor and anchor['wall'])} | "
            f"{_ratio(r['wall'], one and one['wall'])} | {rep.get('units', 0):,} | "
            f"{rep.get('conflicts', 0):,} | {r['cpu']:.1f} | {r['rss'] / (1 << 20):.0f} MB | "
            f"{r['load']:.1f} |")
    verdict = []
    if serial_anchor and native.get(1) and sluice:
        best = min(sluice.values(), key=lambda r: r["wall"])
        verdict.append(
            f"best sluice ÷ subscription: {_ratio(best['wall'], native[1]['wall'])} at "
            f"--parallel {best['threads']} (target ≤ 0.50×)")
    elif native and sluice:
        same = [f"{_ratio(sluice[n]['wall'], native[n]['wall'])} at {n}"
                for n in sorted(sluice) if n in native]
        verdict.append("sluice ÷ replica at equal threads: " + ", ".join(same)
                       + " (target ≤ 1.0×)")
    if sluice.get(4) and one:
        verdict.append(f"--parallel 4 speed-up over --parallel 1: "
                       f"{one['wall'] / sluice[4]['wall']:.2f}× (target ≥ 2×)")
    if floor and sluice:
        best = min(sluice.values(), key=lambda r: r["wall"])
        tool = "pg_recvlogical" if serial_anchor else "mariadb-binlog --raw"
        verdict.append(
            f"the engine's own client reads the same log and throws it away in "
            f"{floor['wall']:.1f} s (`{tool}`): sluice --parallel 1 applies it in "
            f"{_ratio(one['wall'], floor['wall']) if one else '–'} of that time, the best "
            f"(--parallel {best['threads']}) in {_ratio(best['wall'], floor['wall'])}")
    return out, verdict


def render(data, results_dir):
    started = datetime.datetime.fromisoformat(data["started"])
    m = data["machine"]
    debug = data["build"] != "release"
    b = data["backlog"]
    smoke = debug or b["transactions"] < 200_000
    L = ["# Replication: `sluice replicate` against the engines' own replication", ""]
    if smoke:
        L += [
            "**Smoke pass only** (" + (f"a **{data['build']}** build of sluice, " if debug else "")
            + f"{b['transactions']:,} transactions, on a 2-core machine shared with builds: "
            + ("a debug build's figures only show the lab works, not what sluice does"
               if debug else "indicative only, see the run notes")
            + "). The reference pass is "
            f"`{REFERENCE}` with a release build (`cargo build --release --workspace`, the "
            "script's default binaries) on a quiet machine.",
            "",
        ]
    L += [
        f"Measured {started:%Y-%m-%d %H:%M} UTC on `{m['host']}`: {m['cpu']}, {m['cores']} cores, "
        f"{m['memory_bytes'] / (1 << 30):.0f} GiB, {m['os']}. Sources and targets ran on the same "
        "machine as sluice: compare ratios, not absolute times.",
        "",
        f"- Command: `{data['command']}`",
        f"- sluice: {m['versions']['sluice']} ({data['build']} build)",
    ]
    for p in data["passes"]:
        L.append(f"- {p['pair']} servers: {p['server']}; target settings "
                 + ", ".join(f"{k}={v}" for k, v in sorted(p["target_settings"].items())))
    L += [
        f"- One 8 KB write + fdatasync on the servers' disk: {data['fdatasync_us']:.0f} µs "
        "(median over 1 s): the least a durable commit costs here; a disk with slower syncs "
        "rewards grouping and parallel commits more" if data.get("fdatasync_us") else None,
        f"- Raw figures: `{results_dir}/results.json` (and each sluice run's `--report-json`)",
        "",
        "## What is measured",
        "",
        f"A backlog of {b['transactions']:,} transactions ({b['statements']:,} single-row "
        f"statements: 1–10 each; {b['hot_transactions']:,} of them transfers between 8 hot "
        "accounts) over three tables with primary and unique keys (`accounts`, `orders` with a "
        "unique `ref` that is also re-keyed, an append-only `ledger` with UNIQUE (account_id, "
        "seq)), written on the source while nothing applies it (`bench/replicate/workload.py`). "
        "Each applier starts from the same starting rows and drains the same backlog into a "
        "target with durable commits; the drain is timed from its start until the target holds "
        "the backlog's last transaction, and every target is then compared with the source "
        "table by table (row count and a sum of row hashes).",
        "",
        "- **sluice**: one replication per `--parallel N` (own `--slot` and `--target-schema`), "
        "loaded with `--initial snapshot --until-current` before the backlog, then "
        "`sluice replicate … --parallel N --until-current` timed from process start to exit "
        "(it reads the change log from the source itself).",
        "- **MariaDB anchor**: the target server as a replica (`MASTER_USE_GTID=slave_pos`, "
        "`slave_parallel_mode=optimistic`, `slave_parallel_threads=N`); its `bench` database "
        "rebuilt to the starting rows and `gtid_slave_pos` set back before each N, the IO thread "
        "fetches the whole backlog first (not timed), then `START SLAVE SQL_THREAD` is timed "
        "until `gtid_slave_pos` equals the source's `gtid_binlog_pos`. The replica runs as "
        "replicas do by default: `log_slave_updates=OFF`, so its applier writes no binary log, "
        "while sluice's sessions are ordinary clients whose commits also go through the "
        "target's binary log (`sync_binlog=1`).",
        "- **Source-read floor**: the backlog read from the source and thrown away, as fast as "
        "the server hands it out: `pg_recvlogical` on a slot of its own (pgoutput protocol 1, "
        "decoding on the server, to /dev/null), `mariadb-binlog --read-from-remote-server --raw` "
        "(events to a RAM directory): how fast the source hands its log out to a client that "
        "does nothing with it (on PostgreSQL the decoding is the server's, and the client's "
        "own work counts on the same 2 cores). MariaDB's replica fetched its backlog before "
        "its timed part.",
        "- **PostgreSQL anchor**: a native subscription (pgoutput; PostgreSQL 15 applies one "
        "transaction at a time) in another database of the target cluster, created disabled "
        "before the backlog (its slot holds the position) with `synchronous_commit = 'on'` "
        "(a subscription's default is `off`), then `ALTER SUBSCRIPTION … ENABLE` timed until "
        "the backlog's last row is visible.",
        "",
    ]
    if any(p.get("workload") == "pgbench" for p in data["passes"]):
        L += [
            "- **pgbench pass**: pgbench's own TPC-B (`pgbench -i -I dtgvpf`, then a "
            "rate-limited `pgbench -c 4 -j 2 -t … -R …` as the backlog): every transaction "
            "updates an account, a teller and one of a few hot branch rows and inserts into the "
            "keyless `pgbench_history` (REPLICA IDENTITY FULL). Same appliers and checks "
            "(balances' sums, the history's rows and deltas).",
            "",
        ]
    for p in data["passes"]:
        table, verdict = _rows(p, p.get("transactions") or b["transactions"])
        L += [f"## {p['pair']}", "",
              f"Backlog written on the source in {p['backlog_load_seconds']:.0f} s"
              + (f" ({p['wal_bytes'] / (1 << 20):.0f} MB of WAL)" if p.get("wal_bytes") else "")
              + ". Ratios are drain times: below 1 sluice is faster.", ""]
        L += table + [""]
        L += [f"- {v}" for v in verdict] + [""]
    notes = os.path.join(results_dir, "notes.md")
    if os.path.exists(notes):
        L += ["## Run notes", "", f"From `{notes}` (written by whoever ran the pass):", "",
              open(notes).read().strip(), ""]
    L += [
        "Targets (issue): MariaDB → MariaDB drain ≤ 1.0× MariaDB's parallel replica at the same "
        "thread count; PostgreSQL → PostgreSQL drain ≤ 0.5× the native subscription; "
        "`--parallel 4` at least 2× as fast as `--parallel 1`. For comparison, Vitess reports "
        "its parallel applier at 1.4–1.7× its serial one with 4 workers.",
        "",
    ]
    return "\n".join(line for line in L if line is not None)


if __name__ == "__main__":
    results = sys.argv[1]
    print(render(json.load(open(f"{results}/results.json")), results), end="")
