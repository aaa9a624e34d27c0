"""What a strategy is: a name, a family, and how to build the command that runs it."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sluicebench.datasets import Dataset


@dataclass(frozen=True)
class Tools:
    """Paths of the programs strategies run."""

    sluice: str
    rivet: str | None
    python: str = sys.executable


@dataclass(frozen=True)
class Context:
    """Everything one measured run of one strategy needs."""

    engine: str  # pg | mariadb
    url: str  # the benchmark database on that engine
    dataset: Dataset
    out: Path  # empty directory for the export
    work: Path  # scratch for configs and reports (not measured as output)
    tools: Tools

    @property
    def batch_rows(self) -> int:
        """Rows per batch for the Python strategies: about 8 MB of data, sluice's batch budget."""
        per_row = max(1, self.dataset.text_bytes // max(1, self.dataset.rows))
        return max(1000, 8_000_000 // per_row)


@dataclass
class Invocation:
    """The command to measure and how to read its result."""

    argv: list[str]
    env: dict[str, str] | None = None
    # Rows the command reports on stdout, for strategies that write to /dev/null.
    rows_from_stdout: Callable[[str], int | None] | None = None
    # sluice's own report, kept in the run JSON.
    report_json: Path | None = None
    cwd: Path | None = None
    # Run after the measured command (not timed): brings output that went elsewhere (an object
    # store) into the context's `out` directory for checking, and removes it there.
    fetch: Callable[[], None] | None = None


@dataclass(frozen=True)
class Strategy:
    """One way of moving a table out of a database."""

    name: str  # unique, e.g. sluice-ctid-p2
    family: str  # sluice | floor | rivet | connectorx | python
    engine: str  # pg | mariadb
    workers: int
    about: str  # one line for the report
    build: Callable[[Context], Invocation] = field(compare=False)
    writes_files: bool = True  # False: output goes to /dev/null, rows come from stdout
    needs_s3: bool = False  # writes to the S3 emulator the lab's test kit started


def last_int(pattern: str) -> Callable[[str], int | None]:
    """A stdout parser returning the integer captured by `pattern` (its last match)."""
    rx = re.compile(pattern)

    def parse(text: str) -> int | None:
        found = rx.findall(text)
        return int(found[-1]) if found else None

    return parse


def python_env() -> dict[str, str]:
    """The environment for `python -m sluicebench.workers…` children."""
    env = dict(os.environ)
    bench = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = bench + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
