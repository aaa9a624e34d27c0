"""The replication benchmark's tables, starting rows and backlog: deterministic SQL text that
both engines run unchanged (standard statements, lower-case names, plain literals).

Three tables with primary and unique keys:

- `accounts` (id, name UNIQUE, balance, version): 10,000 rows; ids 1–8 are the hot rows.
- `orders` (id, account_id, ref UNIQUE, amount, status): 10,000 starting rows; inserted,
  updated, deleted, and re-keyed on their unique `ref`.
- `ledger` (id, account_id, seq, delta; UNIQUE (account_id, seq)): append-only.

The backlog is `n` transactions of 1–10 row statements each (a seeded random generator, so
every engine and every run gets the same one). One transaction in ten is a transfer between
hot accounts (balance updates on ids 1–8 plus their ledger lines): those all conflict with each
other, which is what stops a parallel applier. The others mix order inserts (35%), order updates
(20%), order deletes (10%), order key updates (`ref`, 5%), ledger inserts (15%) and cold
account updates (15%). Every statement touches exactly one row. The last transaction inserts
the sentinel ledger row (`SENTINEL_ID`): commits are applied in source order by every applier
measured, so once it is visible on a target the whole backlog is.
"""

from __future__ import annotations

import random

ACCOUNTS = 10_000
ORDERS = 10_000
HOT = 8
SENTINEL_ID = 9_000_000_000_000

# Same text on both engines: BIGINT, INT and VARCHAR mean the same on PostgreSQL and MariaDB.
DDL = [
    "CREATE TABLE accounts (id BIGINT PRIMARY KEY, name VARCHAR(40) NOT NULL UNIQUE, "
    "balance BIGINT NOT NULL, version INT NOT NULL)",
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, account_id BIGINT NOT NULL, "
    "ref VARCHAR(40) NOT NULL UNIQUE, amount BIGINT NOT NULL, status INT NOT NULL)",
    "CREATE TABLE ledger (id BIGINT PRIMARY KEY, account_id BIGINT NOT NULL, seq BIGINT NOT NULL, "
    "delta BIGINT NOT NULL, UNIQUE (account_id, seq))",
]
TABLES = ["accounts", "orders", "ledger"]
COLUMNS = {
    "accounts": ["id", "name", "balance", "version"],
    "orders": ["id", "account_id", "ref", "amount", "status"],
    "ledger": ["id", "account_id", "seq", "delta"],
}


def starting_rows() -> list[str]:
    """INSERT statements (1,000 rows each) for the starting state, before any replication."""
    out = []
    for start in range(1, ACCOUNTS + 1, 1000):
        rows = ", ".join(
            f"({i}, 'acct-{i}', 1000000, 0)" for i in range(start, min(start + 1000, ACCOUNTS + 1))
        )
        out.append(f"INSERT INTO accounts (id, name, balance, version) VALUES {rows}")
    for start in range(1, ORDERS + 1, 1000):
        rows = ", ".join(
            f"({i}, {1 + i * 7 % ACCOUNTS}, 'ord-{i}', {i % 997}, 0)"
            for i in range(start, min(start + 1000, ORDERS + 1))
        )
        out.append(f"INSERT INTO orders (id, account_id, ref, amount, status) VALUES {rows}")
    return out


class _Live:
    """The order ids that exist at this point of the backlog (O(1) pick and remove)."""

    def __init__(self, ids):
        self.ids = list(ids)
        self.at = {v: k for k, v in enumerate(self.ids)}

    def add(self, v):
        self.at[v] = len(self.ids)
        self.ids.append(v)

    def pick(self, rng):
        return self.ids[rng.randrange(len(self.ids))]

    def remove(self, v):
        k = self.at.pop(v)
        last = self.ids.pop()
        if last != v:
            self.ids[k] = last
            self.at[last] = k


def backlog(n: int, seed: int = 16) -> tuple[list[list[str]], dict]:
    """`n` transactions (each a list of statements) and counts of what they do."""
    rng = random.Random(seed)
    live = _Live(range(1, ORDERS + 1))
    next_order, next_ledger = ORDERS + 1, 1
    seq: dict[int, int] = {}
    refs = 0
    counts = {"statements": 0, "hot_transactions": 0}
    txs = []

    def ledger(account, delta):
        nonlocal next_ledger
        seq[account] = seq.get(account, 0) + 1
        next_ledger += 1
        return (
            f"INSERT INTO ledger (id, account_id, seq, delta) VALUES "
            f"({next_ledger - 1}, {account}, {seq[account]}, {delta})"
        )

    for t in range(n):
        k = rng.randint(1, 10)
        stmts: list[str] = []
        if t == n - 1:
            stmts.append(
                f"INSERT INTO ledger (id, account_id, seq, delta) VALUES ({SENTINEL_ID}, 0, 0, 0)"
            )
        elif rng.random() < 0.10:
            counts["hot_transactions"] += 1
            while len(stmts) < k:
                a, amount = rng.randint(1, HOT), rng.randint(1, 100)
                stmts.append(
                    f"UPDATE accounts SET balance = balance - {amount}, version = version + 1 "
                    f"WHERE id = {a}"
                )
                if len(stmts) < k:
                    stmts.append(ledger(a, -amount))
        else:
            for _ in range(k):
                r = rng.random()
                if r < 0.35 or len(live.ids) < 100:
                    i = next_order
                    next_order += 1
                    live.add(i)
                    stmts.append(
                        f"INSERT INTO orders (id, account_id, ref, amount, status) VALUES "
                        f"({i}, {rng.randint(HOT + 1, ACCOUNTS)}, 'ord-{i}', {rng.randint(1, 9999)}, 0)"
                    )
                elif r < 0.55:
                    stmts.append(
                        f"UPDATE orders SET status = status + 1, amount = {rng.randint(1, 9999)} "
                        f"WHERE id = {live.pick(rng)}"
                    )
                elif r < 0.65:
                    i = live.pick(rng)
                    live.remove(i)
                    stmts.append(f"DELETE FROM orders WHERE id = {i}")
                elif r < 0.70:
                    refs += 1
                    stmts.append(f"UPDATE orders SET ref = 'rekey-{refs}' WHERE id = {live.pick(rng)}")
                elif r < 0.85:
                    stmts.append(ledger(rng.randint(HOT + 1, ACCOUNTS), rng.randint(-50, 50)))
                else:
                    stmts.append(
                        f"UPDATE accounts SET balance = balance + {rng.randint(1, 50)}, "
                        f"version = version + 1 WHERE id = {rng.randint(HOT + 1, ACCOUNTS)}"
                    )
        counts["statements"] += len(stmts)
        txs.append(stmts)
    counts["transactions"] = len(txs)
    return txs, counts


def script(txs: list[list[str]]) -> str:
    """The backlog as one SQL script, one explicit transaction per entry."""
    parts = []
    for stmts in txs:
        parts.append("BEGIN;\n" + ";\n".join(stmts) + ";\nCOMMIT;\n")
    return "".join(parts)


def checksum_sql(engine: str, schema: str, table: str) -> str:
    """One row (count, order-independent sum of row hashes) for `schema.table` on `engine`."""
    cols = COLUMNS[table]
    if engine == "pg":
        expr = " || '|' || ".join(f"{c}::text" for c in cols)
        return (
            f'SELECT count(*), coalesce(sum(hashtext({expr})::bigint), 0) FROM "{schema}".{table}'
        )
    expr = ", ".join(cols)
    return f"SELECT COUNT(*), COALESCE(SUM(CRC32(CONCAT_WS('|', {expr}))), 0) FROM `{schema}`.{table}"
