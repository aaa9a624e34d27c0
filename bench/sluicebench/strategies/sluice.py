"""sluice itself, in the variants the issues ask about.

Defaults are sluice's own (zstd level 1, fsync on, chunk size chosen by the planner), so a
row measures what a user gets; one variant turns fsync off to show what durability costs, and
one writes to S3 (the moto emulator) to compare object storage with local disk.
"""

from __future__ import annotations

from sluicebench import objstore
from sluicebench.strategies.base import Context, Invocation, Strategy

# name suffix → (workers, chunk-by, consistency, format, extra flags, about)
PG_VARIANTS = [
    ("none-p1", 1, "none", "snapshot", "parquet", [], "one reader, no chunking (full table)"),
    ("ctid-p1", 1, "ctid", "snapshot", "parquet", [], "ctid chunks, 1 worker"),
    ("ctid-p2", 2, "ctid", "snapshot", "parquet", [], "ctid chunks, 2 workers"),
    ("ctid-p4", 4, "ctid", "snapshot", "parquet", [], "ctid chunks, 4 workers"),
    # Past 7 workers the smallest budgets (4 MB row groups) no longer fit the default 64 MB:
    # sluice refuses and says what it needs, so these give it that much.
    (
        "ctid-p8",
        8,
        "ctid",
        "snapshot",
        "parquet",
        ["--memory", "96MB"],
        "ctid chunks, 8 workers, --memory 96MB",
    ),
    (
        "ctid-p16",
        16,
        "ctid",
        "snapshot",
        "parquet",
        ["--memory", "160MB"],
        "ctid chunks, 16 workers, --memory 160MB",
    ),
    (
        "ctid-p8-csv",
        8,
        "ctid",
        "snapshot",
        "csv",
        [],
        "ctid, 8 workers, CSV",
    ),
    ("key-p1", 1, "key", "snapshot", "parquet", [], "key-range chunks, 1 worker"),
    ("key-p2", 2, "key", "snapshot", "parquet", [], "key-range chunks, 2 workers"),
    ("key-p4", 4, "key", "snapshot", "parquet", [], "key-range chunks, 4 workers"),
    (
        "key-p8",
        8,
        "key",
        "snapshot",
        "parquet",
        ["--memory", "96MB"],
        "key-range chunks, 8 workers, --memory 96MB",
    ),
    (
        "ctid-p2-chunk",
        2,
        "ctid",
        "chunk",
        "parquet",
        [],
        "ctid, 2 workers, a transaction per chunk",
    ),
    ("ctid-p1-csv", 1, "ctid", "snapshot", "csv", [], "ctid, 1 worker, CSV"),
    ("ctid-p2-csv", 2, "ctid", "snapshot", "csv", [], "ctid, 2 workers, CSV"),
    ("ctid-p2-delta", 2, "ctid", "snapshot", "delta", [], "ctid, 2 workers, a Delta table"),
    (
        "ctid-p2-iceberg",
        2,
        "ctid",
        "snapshot",
        "iceberg",
        ["--namespace", "bench"],
        "ctid, 2 workers, an Iceberg table (SQLite catalog in the output)",
    ),
    (
        "ctid-p2-nofsync",
        2,
        "ctid",
        "snapshot",
        "parquet",
        ["--no-fsync"],
        "ctid, 2 workers, --no-fsync",
    ),
    (
        "ctid-p2-s3",
        2,
        "ctid",
        "snapshot",
        "parquet",
        [],
        "ctid, 2 workers, to S3 (the moto emulator on loopback)",
    ),
]
MYSQL_VARIANTS = [
    ("none-p1", 1, "none", "snapshot", "parquet", [], "one reader, no chunking (full table)"),
    ("key-p1", 1, "key", "snapshot", "parquet", [], "key-range chunks, 1 worker"),
    ("key-p2", 2, "key", "snapshot", "parquet", [], "key-range chunks, 2 workers"),
    ("key-p4", 4, "key", "snapshot", "parquet", [], "key-range chunks, 4 workers"),
    ("key-p2-chunk", 2, "key", "chunk", "parquet", [], "key, 2 workers, a transaction per chunk"),
    ("key-p2-csv", 2, "key", "snapshot", "csv", [], "key, 2 workers, CSV"),
]


def _build(
    workers: int, chunk_by: str, consistency: str, fmt: str, extra: list[str], s3: bool = False
):
    def build(ctx: Context) -> Invocation:
        report = ctx.work / "report.json"
        table = f"public.{ctx.dataset.table}" if ctx.engine == "pg" else ctx.dataset.table
        to, fetch = str(ctx.out), None
        if s3:
            to, fetch = objstore.s3_target(ctx.out)
        return Invocation(
            argv=[
                ctx.tools.sluice,
                "export",
                "-q",
                "--source",
                ctx.url,
                "--table",
                table,
                "--to",
                to,
                "--format",
                fmt,
                "--parallel",
                str(workers),
                "--chunk-by",
                chunk_by,
                "--consistency",
                consistency,
                "--report-json",
                str(report),
                *extra,
            ],
            report_json=report,
            fetch=fetch,
        )

    return build


def strategies(engine: str) -> list[Strategy]:
    """sluice rows for `engine`."""
    variants = PG_VARIANTS if engine == "pg" else MYSQL_VARIANTS
    return [
        Strategy(
            f"sluice-{suffix}",
            "sluice",
            engine,
            workers,
            about,
            _build(workers, chunk_by, consistency, fmt, extra, suffix.endswith("-s3")),
            needs_s3=suffix.endswith("-s3"),
        )
        for suffix, workers, chunk_by, consistency, fmt, extra, about in variants
    ]
