"""What one invocation of the lab measures, parsed from the command line."""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = BENCH_DIR.parent
DOCS_DIR = REPO_DIR / "docs"
ENGINES = ("pg", "mariadb")


def parse_size(text: str) -> int:
    """`100k` → 100000, `10m` → 10000000, `2500` → 2500."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 100k, 1m, 10m)")
    mult = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def size_label(rows: int) -> str:
    """10000000 → `10m`, 300000 → `300k` (the inverse of parse_size for round numbers)."""
    for unit, div in (("g", 1_000_000_000), ("m", 1_000_000), ("k", 1_000)):
        if rows >= div and rows % div == 0:
            return f"{rows // div}{unit}"
    return str(rows)


def _sizes(text: str) -> list[int]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def _wide_default(narrow_rows: int) -> int:
    """A wide row is ~50× a narrow one: a 33rd of the rows, one significant digit (10m → 300k)."""
    n = max(1000, narrow_rows // 33)
    magnitude = 10 ** (len(str(n)) - 1)
    return n // magnitude * magnitude


@dataclass
class Settings:
    """Everything a lab run needs to know."""

    narrow_sizes: list[int]
    wide_sizes: list[int]
    runs: int
    engines: list[str]
    strategy_globs: list[str]
    pg_url: str | None
    mysql_url: str | None
    results_root: Path
    docs_dir: Path
    scratch: Path
    sample_interval: float
    command: str
    report_only: Path | None = None
    append: Path | None = None
    no_report: bool = False
    list_only: bool = False
    unavailable: dict[str, str] = field(default_factory=dict)

    def wants(self, strategy_name: str) -> bool:
        """True when the strategy matches one of --strategies (default: all)."""
        return any(fnmatch.fnmatch(strategy_name, g) for g in self.strategy_globs)


def parse_args(argv: list[str] | None = None) -> Settings:
    """Parse the command line (the same flags bench/run takes)."""
    p = argparse.ArgumentParser(
        prog="bench/run",
        description="Measure sluice against the floor, its peers and the classic Python "
        "strategies; write one JSON per run and regenerate docs/benchmarks.md with charts.",
    )
    p.add_argument("--sizes", default="100k,1m", help="narrow table sizes (default 100k,1m)")
    p.add_argument(
        "--wide-sizes",
        default=None,
        help="wide table sizes (default: a 33rd of each narrow size, rounded: 10m → 300k)",
    )
    p.add_argument("--runs", type=int, default=3, help="runs per strategy and dataset (default 3)")
    p.add_argument("--only", default="pg,mariadb", help="engines: pg, mariadb (default both)")
    p.add_argument(
        "--strategies",
        default="*",
        help="comma-separated globs over strategy names, e.g. 'sluice-*,floor-*' (default all)",
    )
    p.add_argument("--list", action="store_true", help="list the strategies and exit")
    p.add_argument("--pg-url", default=None, help="use this PostgreSQL instead of a throwaway one")
    p.add_argument(
        "--mysql-url", default=None, help="use this MariaDB/MySQL instead of a throwaway one"
    )
    p.add_argument(
        "--results", type=Path, default=BENCH_DIR / "results", help="where run JSON goes"
    )
    p.add_argument("--docs", type=Path, default=DOCS_DIR, help="where benchmarks.md and charts go")
    p.add_argument(
        "--scratch",
        type=Path,
        default=Path.home() / ".cache" / "sluice" / "bench-scratch",
        help="where exports are written (and deleted after their check)",
    )
    p.add_argument("--sample-interval", type=float, default=0.1, help="harm sampling period, s")
    p.add_argument("--no-report", action="store_true", help="measure only; do not touch docs/")
    p.add_argument(
        "--report-only",
        type=Path,
        default=None,
        metavar="RESULTS_DIR",
        help="re-render docs/benchmarks.md and the charts from stored run JSON, measure nothing",
    )
    p.add_argument(
        "--append",
        type=Path,
        default=None,
        metavar="RESULTS_DIR",
        help="add runs to an earlier results directory (numbered after its runs) instead of "
        "starting a new one; the report then covers both",
    )
    a = p.parse_args(argv)
    narrow = _sizes(a.sizes)
    wide = _sizes(a.wide_sizes) if a.wide_sizes is not None else [_wide_default(n) for n in narrow]
    engines = [e.strip() for e in a.only.split(",") if e.strip()]
    for e in engines:
        if e not in ENGINES:
            p.error(f"--only: unknown engine {e!r} (known: {', '.join(ENGINES)})")
    s = Settings(
        narrow_sizes=narrow,
        wide_sizes=wide,
        runs=max(1, a.runs),
        engines=engines,
        strategy_globs=[g.strip() for g in a.strategies.split(",") if g.strip()],
        pg_url=a.pg_url or os.environ.get("SLUICE_TEST_PG_URL"),
        mysql_url=a.mysql_url or os.environ.get("SLUICE_TEST_MYSQL_URL"),
        results_root=a.results,
        docs_dir=a.docs,
        scratch=a.scratch,
        sample_interval=a.sample_interval,
        command=os.environ.get("SLUICE_BENCH_COMMAND", "bench/run " + " ".join(argv or [])),
        report_only=a.report_only,
        append=a.append,
        no_report=a.no_report,
    )
    for key, env in (
        ("mariadb", "SLUICE_BENCH_MARIADB_UNAVAILABLE"),
        ("rivet", "SLUICE_BENCH_RIVET_UNAVAILABLE"),
    ):
        if os.environ.get(env):
            s.unavailable[key] = os.environ[env]
    s.list_only = a.list
    return s
