"""One JSON file per measured run, and reading them back."""

from __future__ import annotations

import datetime as dt
import json
import platform
import re
from dataclasses import dataclass
from pathlib import Path

SCHEMA = 1


_PASSWORD = re.compile(r"(\w+://[^:/@\s]+:)\S+@")


def redact(text: str) -> str:
    """Passwords in URLs → `***`, so results and reports can be shared."""
    return _PASSWORD.sub(r"\1***@", text)


def new_results_dir(root: Path) -> Path:
    """bench/results/<date>-<host>, with -2, -3… when that already exists."""
    base = f"{dt.date.today().isoformat()}-{platform.node() or 'host'}"
    d, n = root / base, 1
    while d.exists():
        n += 1
        d = root / f"{base}-{n}"
    d.mkdir(parents=True)
    return d


def run_path(results: Path, engine: str, dataset_table: str, strategy: str, run: int) -> Path:
    """Where one run's JSON goes."""
    return results / engine / dataset_table / f"{strategy}.run{run}.json"


def write_json(path: Path, data: dict) -> None:
    """Write atomically (a .tmp file renamed), so a killed run leaves no half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


@dataclass
class Loaded:
    """A results directory read back."""

    lab: dict
    runs: list[dict]


def load(results: Path) -> Loaded:
    """Read lab.json and every run JSON under `results`."""
    lab = json.loads((results / "lab.json").read_text())
    runs = [json.loads(p.read_text()) for p in sorted(results.rglob("*.run*.json"))]
    return Loaded(lab, [r for r in runs if r.get("schema") == SCHEMA])
