"""From run JSON to the figures the report shows: median, min and max per strategy."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

FAMILY_ORDER = ["sluice", "sluice-py", "floor", "psql", "rivet", "connectorx", "duckdb", "python"]


@dataclass
class Stat:
    """Median, min and max of one figure over the good runs."""

    median: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: list[float]) -> Stat | None:
        """None when there are no values."""
        v = [x for x in values if x is not None]
        if not v:
            return None
        return cls(statistics.median(v), min(v), max(v))


@dataclass
class Row:
    """One strategy on one dataset of one engine."""

    engine: str
    kind: str
    rows: int
    table: str
    table_bytes: int
    text_bytes: int
    name: str
    family: str
    workers: int
    about: str
    runs: int = 0
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    unavailable: str | None = None
    wall: Stat | None = None
    rows_per_second: Stat | None = None
    mb_per_second: Stat | None = None
    rss: Stat | None = None
    cpu: Stat | None = None
    out_bytes: Stat | None = None
    xmin_age: Stat | None = None
    longest_xact: Stat | None = None
    longest_stmt: Stat | None = None
    connections: Stat | None = None
    server_cpu: Stat | None = None
    files: Stat | None = None
    predicted_rss: Stat | None = None  # the tool's own prediction (sluice's report), if any
    own_rss: Stat | None = None  # the tool's own peak RSS figure (sluice's report), if any

    @property
    def key(self) -> tuple[str, str, int]:
        """(engine, kind, rows): the dataset."""
        return (self.engine, self.kind, self.rows)


def _picker(good: list[dict]) -> Callable[[Callable[[dict], float | None]], Stat | None]:
    """pick(f): the Stat of f over the good runs."""
    return lambda f: Stat.of([f(r) for r in good])


def aggregate(runs: list[dict]) -> list[Row]:
    """Group runs by engine, dataset and strategy."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        d, s = r["dataset"], r["strategy"]
        groups[(r["engine"], d["kind"], d["rows"], s["name"])].append(r)
    # Within a family, strategies keep the order of the lab's first (forward) run.
    order = {r["strategy"]["name"]: r.get("position", 999) for r in runs if r["run"] == 1}
    rows: list[Row] = []
    for (engine, kind, n, name), rs in groups.items():
        first = rs[0]
        d, s = first["dataset"], first["strategy"]
        row = Row(
            engine,
            kind,
            n,
            d["table"],
            d["table_bytes"],
            d["text_bytes"],
            name,
            s["family"],
            s["workers"],
            s["about"],
            runs=len(rs),
        )
        good = [r for r in rs if r["status"] == "ok"]
        row.ok = len(good)
        for r in rs:
            if r["status"] == "unavailable":
                row.unavailable = r.get("error")
            elif r["status"] != "ok":
                row.failures.append(f"run {r['run']}: {r['status']}: {r.get('error')}")
        if good:
            pick = _picker(good)
            row.wall = pick(lambda r: r["wall_seconds"])
            row.rows_per_second = pick(lambda r: r["rows_per_second"])
            row.mb_per_second = pick(lambda r: r["mb_per_second"])
            row.rss = pick(lambda r: r["peak_rss_bytes"])
            row.cpu = pick(lambda r: r["cpu_seconds"])
            row.out_bytes = pick(lambda r: r["output"]["bytes"] if r["output"]["files"] else None)
            row.xmin_age = pick(lambda r: r["harm"].get("peak_xmin_age"))
            row.longest_xact = pick(lambda r: r["harm"].get("longest_transaction_seconds"))
            row.longest_stmt = pick(lambda r: r["harm"].get("longest_statement_seconds"))
            row.connections = pick(lambda r: r["harm"].get("peak_connections"))
            row.server_cpu = pick(lambda r: r["harm"].get("server_cpu_seconds"))
            row.files = pick(lambda r: r["output"]["files"] or None)
            row.predicted_rss = pick(
                lambda r: (r.get("tool_report") or {}).get("predicted_peak_rss_bytes")
            )
            row.own_rss = pick(lambda r: (r.get("tool_report") or {}).get("peak_rss_bytes"))
        rows.append(row)
    rows.sort(
        key=lambda r: (
            r.engine,
            r.kind != "narrow",
            r.rows,
            family_rank(r),
            order.get(r.name, 999),
            r.name,
        )
    )
    return rows


def family_rank(r: Row) -> int:
    """Families in the report's order: sluice, floor, rivet, ConnectorX, Python."""
    return FAMILY_ORDER.index(r.family) if r.family in FAMILY_ORDER else len(FAMILY_ORDER)


def find(rows: list[Row], key: tuple, name: str) -> Row | None:
    """The row of strategy `name` on dataset `key`, if measured."""
    for r in rows:
        if r.key == key and r.name == name:
            return r
    return None


def peer_for(rows: list[Row], row: Row, family: str) -> Row | None:
    """The peer row of `family` to compare `row` with: same workers, else the fastest."""
    same = find(rows, row.key, f"{family}-p{row.workers}")
    if same and same.wall:
        return same
    candidates = [r for r in rows if r.key == row.key and r.family == family and r.wall]
    return min(candidates, key=lambda r: r.wall.median, default=None)


def floor_for(rows: list[Row], row: Row) -> Row | None:
    """The floor row: binary COPY on PostgreSQL, the client's --quick dump on MariaDB."""
    return find(rows, row.key, "floor-copy-binary" if row.engine == "pg" else "floor-mariadb-quick")
