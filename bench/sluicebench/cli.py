"""Command line: measure (the default), list the strategies, or only re-render the report."""

from __future__ import annotations

import sys

from sluicebench.settings import parse_args


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m sluicebench`."""
    s = parse_args(sys.argv[1:] if argv is None else argv)
    if s.list_only:
        from sluicebench.strategies import all_strategies

        for engine in s.engines:
            for st in all_strategies(engine):
                mark = "" if s.wants(st.name) else "  (not selected)"
                print(f"{engine:8} {st.name:22} {st.about}{mark}")
        return 0
    from sluicebench.report import render

    if s.report_only:
        md = render(s.report_only, s.docs_dir)
        print(f"wrote {md}")
        return 0
    from sluicebench.lab import log, run_lab

    out = run_lab(s)
    if not s.no_report:
        md = render(out, s.docs_dir)
        log(f"report: {md} (charts in {s.docs_dir / 'bench'})")
    log(f"results: {out}")
    return 0
