"""docs/benchmarks.md, regenerated from a results directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sluicebench.aggregate import Row, aggregate, family_rank, find, floor_for, peer_for
from sluicebench.charts import draw_all
from sluicebench.results import load
from sluicebench.sections import headline, memory, object_storage, scaling
from sluicebench.settings import DOCS_DIR, REPO_DIR, size_label

MIB = 2**20
HEADLINE = "sluice-ctid-p2"  # the configuration the targets are read on (PostgreSQL)
HEADLINE_MYSQL = "sluice-key-p2"


@dataclass(frozen=True)
class Target:
    """A goal from the engine issues, read off the headline sluice row."""

    kind: str  # narrow | wide
    what: str  # floor | connectorx | rivet | rss
    limit: float  # ratio of wall times, or MiB
    text: str


TARGETS = [
    Target("narrow", "floor", 1.0, "narrow: wall ≤ 1.0× the psql binary COPY floor"),
    Target("narrow", "connectorx", 0.5, "narrow: wall ≤ 0.5× ConnectorX (same workers)"),
    Target("narrow", "rivet", 0.4, "narrow: wall ≤ 0.4× rivet (same workers)"),
    Target("narrow", "rss", 64, "narrow: peak RSS ≤ 64 MiB at 2 workers"),
    Target("wide", "floor", 1.2, "wide: wall ≤ 1.2× the psql binary COPY floor"),
    Target("wide", "rss", 128, "wide: peak RSS ≤ 128 MiB at 2 workers"),
]


# Peers a reader may expect here, and why they are not in the tables.
NOT_INSTALLABLE = [
    (
        "DuckDB postgres scanner",
        "the `duckdb` package installs from PyPI, but its `postgres` extension is downloaded "
        "at run time from DuckDB's own extension server, which is not a package registry this "
        "lab installs from; `INSTALL postgres` fails, so DuckDB is not measured.",
    ),
    (
        "pgcopydb",
        "a Debian package exists, but it copies a database into another database (COPY out, "
        "COPY in); it writes no Parquet or CSV files, so its times would not compare. Its read "
        "side is the same `COPY` the floor measures.",
    ),
]


def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def _range(s, scale: float = 1.0, digits: int = 2) -> str:
    if s is None:
        return "–"
    med, lo, hi = (_f(v / scale, digits) for v in (s.median, s.lo, s.hi))
    return med if lo == hi else f"{med} ({lo}–{hi})"


def _rate(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.0f} k"


def _ratio(row: Row, other: Row | None) -> str:
    if not row.wall or not other or not other.wall:
        return "–"
    return f"{row.wall.median / other.wall.median:.2f}×"


def _held(r: Row) -> str:
    """PostgreSQL: the longest open transaction; MariaDB: the longest running statement."""
    s = r.longest_xact if r.engine == "pg" else r.longest_stmt
    return _f(s.median) if s else "–"


def _output(r: Row) -> str:
    if not r.out_bytes:
        return "/dev/null"
    return f"{r.out_bytes.median / 1e6:,.1f} ({r.files.median:.0f})"


def _verdict(row: Row | None, rows: list[Row], t: Target) -> tuple[str, str]:
    """(measured, verdict) for target t on the headline row."""
    if row is None or row.wall is None:
        return "not measured", "–"
    if t.what == "rss":
        value = row.rss.median / MIB
        return (
            f"{value:.0f} MiB",
            "meets" if value <= t.limit else f"**misses** ({value / t.limit:.2f}× the limit)",
        )
    other = floor_for(rows, row) if t.what == "floor" else peer_for(rows, row, t.what)
    if other is None or other.wall is None:
        return f"no {t.what} row", "–"
    ratio = row.wall.median / other.wall.median
    measured = f"{ratio:.2f}× ({row.wall.median:.2f} s vs {other.name} {other.wall.median:.2f} s)"
    return (
        measured,
        "meets" if ratio <= t.limit else f"**misses** (needs {ratio / t.limit:.2f}× faster)",
    )


def _datasets(rows: list[Row]) -> list[tuple]:
    seen: dict[tuple, Row] = {}
    for r in rows:
        seen.setdefault(r.key, r)
    return list(seen.items())


ENGINE_NAMES = {"pg": "PostgreSQL", "mariadb": "MariaDB"}


def render(results_dir: Path, docs_dir: Path) -> Path:
    """Write docs/benchmarks.md and docs/bench/*.png from results_dir; return the .md path."""
    loaded = load(results_dir)
    lab, rows = loaded.lab, aggregate(loaded.runs)
    charts_dir = docs_dir / "bench"
    charts = draw_all(rows, charts_dir)
    drawn = {path for _, path in charts}
    for pattern in ("throughput-*.png", "rss-*.png", "harm-*.png", "scaling-*.png"):
        for old in charts_dir.glob(pattern):
            if old not in drawn:
                old.unlink()  # a chart of an engine this run did not measure
    md = docs_dir / "benchmarks.md"
    rel_results = os.path.relpath(results_dir, REPO_DIR)
    default_docs = docs_dir.resolve() == DOCS_DIR.resolve()
    docs_flag = "" if default_docs else f" --docs {os.path.relpath(docs_dir, REPO_DIR)}"
    m = lab["machine"]
    L: list[str] = []
    add = L.append
    add("# Benchmarks")
    add("")
    add(
        "<!-- Generated by bench/run from the run JSON linked below; "
        "change bench/sluicebench/report.py, not this file. -->"
    )
    add("")
    add(
        f"Measured {lab['started_at'][:16].replace('T', ' ')} UTC on `{m['host']}`: {m['cpu']}, "
        f"{m['cores']} cores, {m['memory_bytes'] / 2**30:.0f} GiB, {m['os']} (kernel {m['kernel']}). "
        "The database servers ran on the same machine, so every strategy shares the cores with the "
        "server it reads from: compare **ratios**, not absolute times."
    )
    add("")
    add(f"- Command: `{lab['command']}`")
    for extra in lab.get("appended", []):
        add(f"- More runs added {extra['started_at'][:16].replace('T', ' ')} UTC: `{extra['command']}`")
    add(
        f"- Runs per strategy: {lab['settings']['runs']}"
        + (" in the first command (see each table's runs column for the total)" if lab.get("appended") else "")
        + ", in alternating order (forward, then reversed); "
        "figures are the median with (min–max) when there is more than one run."
    )
    add(
        f"- Raw results: [`{rel_results}/`]({os.path.relpath(results_dir, docs_dir)}/) — one JSON "
        "per run, plus `lab.json`."
    )
    add(
        "- Regenerate this page from them without measuring: "
        f"`bench/run --report-only {rel_results}{docs_flag}`."
    )
    add("")

    notes = results_dir / "notes.md"
    if notes.exists():
        add("## Notes on this run")
        add("")
        add(notes.read_text().strip())
        add("")
    loads = [
        r["load_average_before"][0] for r in loaded.runs if r.get("load_average_before")
    ]
    if loads:
        mid = sorted(loads)[len(loads) // 2]
        add(
            f"Load average (1 min) when each strategy started: median {mid:.1f}, "
            f"min {min(loads):.1f}, max {max(loads):.1f} on {m['cores']} cores."
        )
        add("")

    add("## Targets")
    add("")
    add(
        "Read on the headline configuration, `sluice-ctid-p2` (sluice's defaults: ctid chunks, one "
        "snapshot, Parquet zstd level 1, fsync on; 2 workers), at every size measured. "
        "A ratio is sluice's wall time divided by the other's: below 1 means sluice is faster."
    )
    add("")
    add("| target | dataset | measured | verdict |")
    add("|---|---|---|---|")
    for t in TARGETS:
        for key, sample in _datasets(rows):
            if key[0] != "pg" or key[1] != t.kind:
                continue
            head = find(rows, key, HEADLINE)
            measured, verdict = _verdict(head, rows, t)
            add(f"| {t.text} | {sample.kind} {size_label(sample.rows)} | {measured} | {verdict} |")
    misses = [ln for ln in L if "**misses**" in ln]
    add("")
    sizes = {(k[1], k[2]) for k, _ in _datasets(rows) if k[0] == "pg"}
    small = (
        max((n for kind, n in sizes if kind == "narrow"), default=0) < 10_000_000
        or max((n for kind, n in sizes if kind == "wide"), default=0) < 300_000
    )
    if misses:
        add(
            f"**sluice misses {len(misses)} of the targets above in this run.**"
            + (
                " This run is smaller than the reference (10 M narrow, 300 k wide rows), where "
                "fixed start-up costs weigh more; the verdicts that count are the reference "
                "run's."
                if small
                else ""
            )
        )
    elif any("| meets |" in ln for ln in L):
        add("sluice meets every target measured in this run.")
    add("")

    L.extend(headline(rows))
    L.extend(scaling(rows))
    L.extend(memory(rows))
    L.extend(object_storage(loaded.runs))
    if default_docs:
        L.extend(other_passes(docs_dir))

    add("## Charts")
    add("")
    for title, path in charts:
        add(f"![{title}]({os.path.relpath(path, docs_dir)})")
        add("")

    for key, sample in _datasets(rows):
        engine, kind, n = key
        dset = [r for r in rows if r.key == key]
        add(f"## {ENGINE_NAMES.get(engine, engine)} — {kind} {size_label(n)}")
        add("")
        add(
            f"{n:,} rows; table {sample.table_bytes / 1e6:,.1f} MB on disk (heap + TOAST, the "
            f"MB/s base), {sample.text_bytes / 1e6:,.1f} MB as text."
        )
        add("")
        held = "longest xact s" if engine == "pg" else "longest query s"
        add(
            "| strategy | workers | runs | wall s | rows/s | MB/s | peak RSS MiB | CPU s | output MB (files) | "
            f"xmin age | {held} | conns | server CPU s | vs floor | vs ConnectorX | vs rivet |"
        )
        add("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        for r in dset:
            name = f"**{r.name}**" if r.family == "sluice" else r.name
            if r.unavailable:
                add(f"| {name} | {r.workers} | – | not available | | | | | | | | | | | | |")
                continue
            if not r.wall:
                add(
                    f"| {name} | {r.workers} | {r.runs} | **failed** ({len(r.failures)}/{r.runs}) "
                    "| | | | | | | | | | | | |"
                )
                continue
            flag = f" ⚠ {len(r.failures)} failed" if r.failures else ""
            ratios = ["", "", ""]
            if r.family == "sluice":
                ratios = [
                    _ratio(r, floor_for(rows, r)),
                    _ratio(r, peer_for(rows, r, "connectorx")),
                    _ratio(r, peer_for(rows, r, "rivet")),
                ]
            add(
                f"| {name}{flag} | {r.workers} | {r.ok} | {_range(r.wall)} | {_rate(r.rows_per_second.median)} | "
                f"{_f(r.mb_per_second.median, 0)} | {_range(r.rss, MIB, 0)} | {_f(r.cpu.median)} | "
                f"{_output(r)} | "
                f"{_f(r.xmin_age.median, 0) if r.xmin_age else '–'} | "
                f"{_held(r)} | "
                f"{_f(r.connections.median, 0) if r.connections else '–'} | "
                f"{_f(r.server_cpu.median) if r.server_cpu else '–'} | " + " | ".join(ratios) + " |"
            )
        add("")
        failures = [(r.name, f) for r in dset for f in r.failures]
        if failures:
            add("Failures (a wrong row count is a failure, never a time):")
            add("")
            for name, f in failures:
                add(f"- `{name}` {f[:400]}")
            add("")

    add("## Strategies")
    add("")
    add("| strategy | what it does |")
    add("|---|---|")
    about: dict[str, Row] = {}
    for r in rows:
        about.setdefault(r.name, r)
    for r in sorted(about.values(), key=family_rank):
        add(f"| {r.name} | {r.about} |")
    add("")

    unavailable = dict(lab.get("unavailable") or {})
    add("## Not measured")
    add("")
    for k, why in unavailable.items():
        label = {
            "mariadb": "MariaDB (all strategies)",
            "mariadb-sluice": "sluice on MariaDB",
            "rivet": "rivet",
        }.get(k, k)
        add(f"- **{label}**: not available in this build — {why}")
    for label, why in NOT_INSTALLABLE:
        add(f"- **{label}**: {why}")
    add("")

    add("## How it is measured")
    add("")
    add(
        "- Every strategy is its own process, started under GNU `/usr/bin/time -v`. **Wall** is "
        "measured around it; **CPU** is user + system time of the process and every child it "
        "waited for (the multiprocessing workers included)."
    )
    add(
        "- **Peak RSS** is the larger of GNU time's maximum resident set (the largest single "
        "process) and the peak of the *sum* of RSS over the process tree, sampled every 50 ms. "
        "The sum matters for the multiprocessing fan-out; it counts pages shared by forked "
        "workers once per process (an upper bound)."
    )
    add(
        "- **Rows are checked**, independently of the tool: the Parquet or CSV files are read back "
        "with pyarrow, and both the row count and the sum of `id` must match (no row missing or "
        "doubled). The floors write to `/dev/null`; their count is psql's `COPY n` or `wc -l`. "
        "A wrong result is listed as a failure and gets no time."
    )
    add(
        "- **Harm** is sampled from a separate session every "
        f"{lab['settings']['sample_interval'] * 1000:.0f} ms, over the client backends that did not "
        "exist when the run started: peak connections, peak `age(backend_xmin)`, the longest open "
        "transaction. The sampler allocates one transaction id per sample, standing in for write "
        "traffic (an idle server's xmin age would stay 0), so xmin age ≈ 10 × the seconds a "
        "snapshot was held at the default period. **Server CPU** is the CPU time of all the "
        "server's processes during the run, from /proc. Runs shorter than a few sampling periods "
        "show little harm because little was sampled."
    )
    add(
        "- **MB/s** is the PostgreSQL table's on-disk size (heap + TOAST) per second of wall "
        "time — on MariaDB too, which holds the same rows, so MB/s compare across engines; "
        "output MB are the data files written."
    )
    add(
        "- Datasets are generated inside PostgreSQL from deterministic functions of the id "
        "(`bench/sluicebench/datasets.py`), frozen and analysed before measuring, and loaded once "
        "per lab run; every strategy then reads a warm cache."
    )
    add(
        "- Python strategies and ConnectorX write Parquet with zstd level 1 like sluice's default; "
        "the Python strategies read about 8 MB of rows per batch, sluice's batch budget."
    )
    add("")

    add("## Versions")
    add("")
    add("| tool | version |")
    add("|---|---|")
    for name, version in {
        **{f"{ENGINE_NAMES.get(k, k)} server": v for k, v in lab["servers"].items()},
        **m["versions"],
    }.items():
        add(f"| {name} | {str(version).replace('|', '/')} |")
    add("")
    md.write_text("\n".join(L))
    return md


def other_passes(docs_dir: Path) -> list[str]:
    """Links to the pages of passes rendered with `--docs DIR` (each under docs/DIR/), with the
    command and date each page records, so this page names every lab command behind a figure."""
    pages = sorted(docs_dir.glob("*/benchmarks.md"))
    if not pages:
        return []
    out = [
        "## Other passes",
        "",
        "Passes rendered to their own pages (`bench/run … --docs DIR`), each from its own "
        "results directory:",
        "",
    ]
    for page in pages:
        lines = page.read_text().splitlines()
        measured = next((ln for ln in lines if ln.startswith("Measured ")), "")
        command = next((ln for ln in lines if ln.startswith("- Command: ")), "")
        when = measured.split(" on ")[0].removeprefix("Measured ")
        out.append(
            f"- [{os.path.relpath(page, docs_dir)}]({os.path.relpath(page, docs_dir)}): "
            f"{when}, {command.removeprefix('- Command: ')}"
        )
    return out + [""]
