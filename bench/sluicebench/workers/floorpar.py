"""The parallel floor: N `psql` processes at once, each streaming 1/N of a table's pages.

    python -m sluicebench.workers.floorpar --psql PSQL --url URL --table T --pages P --workers N

Each process runs `\\copy (SELECT * FROM T WHERE ctid >= '(a,0)' AND ctid < '(b,0)') TO
'/dev/null' (FORMAT binary)` over its share of the heap pages: the server's own work with
N connections, nothing decoded or written, the same split sluice's ctid chunks make. Prints
`COPY <rows>` with the rows of all processes together (the lab's row check). Its CPU time
includes the psql processes, which it waits for.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys


def ranges(pages: int, workers: int) -> list[tuple[int, int | None]]:
    """Page ranges [a, b) covering 0..pages in `workers` near-equal parts; the last is open
    (pages added since the statistics were taken are still read)."""
    step = max(1, -(-pages // workers))
    out = [(i * step, (i + 1) * step) for i in range(workers)]
    return [(a, b if i < workers - 1 else None) for i, (a, b) in enumerate(out)]


def main() -> int:
    p = argparse.ArgumentParser(prog="sluicebench.workers.floorpar")
    p.add_argument("--psql", default="psql")
    p.add_argument("--url", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--pages", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    a = p.parse_args()
    procs = []
    for lo, hi in ranges(a.pages, a.workers):
        where = f"ctid >= '({lo},0)'::tid" + (f" AND ctid < '({hi},0)'::tid" if hi else "")
        cmd = f"\\copy (SELECT * FROM {a.table} WHERE {where}) TO '/dev/null' (FORMAT binary)"
        procs.append(
            subprocess.Popen(
                [a.psql, "-X", "-v", "ON_ERROR_STOP=1", a.url, "-c", cmd],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    rows, failed = 0, 0
    for pr in procs:
        out, err = pr.communicate()
        if pr.returncode != 0:
            failed = pr.returncode
            print(err.strip()[-500:], file=sys.stderr)
        m = re.findall(r"COPY (\d+)", out)
        rows += int(m[-1]) if m else 0
    if failed:
        return failed
    print(f"COPY {rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
