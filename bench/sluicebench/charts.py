"""The report's PNG charts: throughput, peak RSS and harm, by strategy."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from sluicebench.aggregate import Row  # noqa: E402
from sluicebench.settings import size_label  # noqa: E402

FAMILY_COLORS = {
    "sluice": "#1f6fb4",
    "floor": "#555555",
    "psql": "#999999",
    "rivet": "#d9822b",
    "connectorx": "#3a9a4a",
    "python": "#9a4ab0",
}
SIZE_ALPHAS = [0.45, 0.7, 1.0, 0.85]


def _panels(rows: list[Row], engine: str) -> list[tuple[str, list[int], list[str]]]:
    """(kind, sizes, strategy names) for each dataset kind measured on `engine`."""
    out = []
    for kind in ("narrow", "wide"):
        sel = [r for r in rows if r.engine == engine and r.kind == kind and r.wall]
        if not sel:
            continue
        sizes = sorted({r.rows for r in sel})
        names: list[str] = []
        for r in sel:
            if r.name not in names:
                names.append(r.name)
        out.append((kind, sizes, names))
    return out


def _bar_chart(
    rows: list[Row],
    engine: str,
    value,
    title: str,
    xlabel: str,
    path: Path,
    log: bool = False,
    targets: dict[str, tuple[float, str]] | None = None,
) -> Path | None:
    panels = _panels(rows, engine)
    if not panels:
        return None
    height = max(4.0, max(len(n) for _, _, n in panels) * 0.32 + 2.0)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), height), squeeze=False)
    for ax, (kind, sizes, names) in zip(axes[0], panels):
        bar_h = 0.8 / len(sizes)
        y = np.arange(len(names))
        for i, size in enumerate(sizes):
            vals, lo, hi, colors = [], [], [], []
            for name in names:
                r = next(
                    (
                        r
                        for r in rows
                        if r.engine == engine
                        and r.kind == kind
                        and r.rows == size
                        and r.name == name
                        and r.wall
                    ),
                    None,
                )
                stat = value(r) if r else None
                vals.append(stat.median if stat else 0)
                lo.append(stat.median - stat.lo if stat else 0)
                hi.append(stat.hi - stat.median if stat else 0)
                colors.append(FAMILY_COLORS.get(r.family if r else "", "#999999"))
            ax.barh(
                y + (i - (len(sizes) - 1) / 2) * bar_h,
                vals,
                height=bar_h,
                color=colors,
                alpha=SIZE_ALPHAS[i % len(SIZE_ALPHAS)],
                xerr=[lo, hi],
                error_kw={"elinewidth": 0.8, "capsize": 2},
                label=f"{size_label(size)} rows",
            )
        ax.set_yticks(y)
        ax.set_yticklabels(names, fontsize=8)
        for tick in ax.get_yticklabels():
            if tick.get_text().startswith("sluice"):
                tick.set_fontweight("bold")
        ax.invert_yaxis()
        if log:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_title(f"{kind}", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        handles = [
            Patch(
                facecolor="#555555",
                alpha=SIZE_ALPHAS[i % len(SIZE_ALPHAS)],
                label=f"{size_label(size)} rows",
            )
            for i, size in enumerate(sizes)
        ]
        if targets and kind in targets:
            limit, label = targets[kind]
            ax.axvline(limit, color="#c0392b", linestyle="--", linewidth=1)
            handles.append(Line2D([], [], color="#c0392b", linestyle="--", label=label))
        ax.legend(
            handles=handles,
            fontsize=8,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.09),
            ncol=len(handles),
            frameon=False,
        )
    fig.suptitle(title, fontsize=12)
    fig.text(
        0.01,
        0.005,
        "bar colour: blue sluice · grey floor · orange rivet · green ConnectorX · "
        "light grey psql CSV · purple classic Python; shade: dataset size; "
        "whiskers: min–max over runs",
        fontsize=7,
        color="#444444",
    )
    fig.tight_layout(rect=(0, 0.02, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _harm_chart(rows: list[Row], engine: str, path: Path) -> Path | None:
    """Harm on the largest dataset of each kind: xmin age, longest transaction, connections."""
    panels = _panels(rows, engine)
    if not panels:
        return None
    metrics = [
        ("xmin_age", "peak xmin age (transactions)"),
        ("longest_xact", "longest open transaction (s)"),
        ("connections", "peak connections"),
    ]
    n_names = max(len(n) for _, _, n in panels)
    fig, axes = plt.subplots(
        len(panels), 3, figsize=(15, max(4.0, n_names * 0.3 + 1.5) * len(panels)), squeeze=False
    )
    for row_axes, (kind, sizes, names) in zip(axes, panels):
        size = sizes[-1]
        sel = {r.name: r for r in rows if r.engine == engine and r.kind == kind and r.rows == size}
        y = np.arange(len(names))
        for ax, (attr, label) in zip(row_axes, metrics):
            vals = [
                getattr(sel[n], attr).median if n in sel and getattr(sel[n], attr) else 0
                for n in names
            ]
            colors = [
                FAMILY_COLORS.get(sel[n].family, "#999") if n in sel else "#999" for n in names
            ]
            ax.barh(y, vals, color=colors)
            ax.set_yticks(y)
            ax.set_yticklabels(names if attr == "xmin_age" else [""] * len(names), fontsize=8)
            ax.invert_yaxis()
            ax.set_title(f"{kind} {size_label(size)}: {label}", fontsize=9)
            ax.grid(axis="x", alpha=0.3)
    fig.suptitle(
        f"Harm to the source ({engine}), largest size of each dataset; lower is gentler",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _scaling_chart(rows: list[Row], engine: str, path: Path) -> Path | None:
    """sluice rows/s at 1, 2, 4 workers, ctid against key chunks, with the floor as a line;
    one panel per dataset kind (its largest size)."""
    panels = [(k, sizes) for k, sizes, _ in _panels(rows, engine)]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    drawn = False
    for ax, (kind, sizes) in zip(axes[0], panels):
        size = sizes[-1]
        sel = {r.name: r for r in rows if r.engine == engine and r.kind == kind and r.rows == size}
        for chunk, style in (("ctid", "o-"), ("key", "s--")):
            pts = [
                (n, sel[f"sluice-{chunk}-p{n}"].rows_per_second.median)
                for n in (1, 2, 4)
                if f"sluice-{chunk}-p{n}" in sel and sel[f"sluice-{chunk}-p{n}"].rows_per_second
            ]
            if pts:
                drawn = True
                ax.plot(*zip(*pts), style, color=FAMILY_COLORS["sluice"], label=f"sluice {chunk}")
        floor = sel.get("floor-copy-binary")
        if floor and floor.rows_per_second:
            ax.axhline(
                floor.rows_per_second.median,
                color=FAMILY_COLORS["floor"],
                linestyle=":",
                label="psql binary COPY floor",
            )
        for fam in ("connectorx", "rivet"):
            pts = [
                (n, sel[f"{fam}-p{n}"].rows_per_second.median)
                for n in (1, 2, 4)
                if f"{fam}-p{n}" in sel and sel[f"{fam}-p{n}"].rows_per_second
            ]
            if pts:
                ax.plot(*zip(*pts), "^-", color=FAMILY_COLORS[fam], alpha=0.8, label=fam)
        ax.set_xticks([1, 2, 4])
        ax.set_xlabel("workers")
        ax.set_ylabel("rows per second")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{kind} {size_label(size)}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if not drawn:
        plt.close(fig)
        return None
    fig.suptitle(f"Parallel scaling ({engine}, 2 cores shared with the server)", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_all(rows: list[Row], out: Path) -> list[tuple[str, Path]]:
    """Every chart for every engine measured; returns (title, path) pairs."""
    charts: list[tuple[str, Path]] = []
    for engine in sorted({r.engine for r in rows}):
        for title, path in (
            (
                f"Throughput by strategy and size ({engine})",
                _bar_chart(
                    rows,
                    engine,
                    lambda r: r.rows_per_second,
                    f"Throughput ({engine}): rows per second, higher is better",
                    "rows per second",
                    out / f"throughput-{engine}.png",
                ),
            ),
            (
                f"Peak RSS by strategy ({engine})",
                _bar_chart(
                    rows,
                    engine,
                    lambda r: _mib(r.rss),
                    f"Peak memory ({engine}): RSS in MiB (log scale), lower is better",
                    "peak RSS, MiB",
                    out / f"rss-{engine}.png",
                    log=True,
                    targets={
                        "narrow": (64, "sluice target, 2 workers: 64 MiB"),
                        "wide": (128, "sluice target, 2 workers: 128 MiB"),
                    },
                ),
            ),
            (f"Harm by strategy ({engine})", _harm_chart(rows, engine, out / f"harm-{engine}.png")),
            (
                f"Parallel scaling of sluice ({engine})",
                _scaling_chart(rows, engine, out / f"scaling-{engine}.png"),
            ),
        ):
            if path:
                charts.append((title, path))
    return charts


def _mib(s):
    if s is None:
        return None
    from sluicebench.aggregate import Stat

    return Stat(s.median / 2**20, s.lo / 2**20, s.hi / 2**20)
