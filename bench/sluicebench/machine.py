"""The machine and the versions of every tool, for the report's header."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata

from sluicebench.settings import REPO_DIR


def _run(argv: list[str]) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return (
            (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else ""
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total() -> int:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _os() -> str:
    try:
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


def describe(sluice: str, rivet: str | None) -> dict:
    """Machine facts and tool versions (server versions are added by the lab)."""
    packages = {}
    for name in (
        "connectorx",
        "duckdb",
        "pyarrow",
        "psycopg",
        "psycopg-binary",
        "asyncpg",
        "pymysql",
        "matplotlib",
    ):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = "not installed"
    git = _run(["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"])
    dirty = _run(["git", "-C", str(REPO_DIR), "status", "--porcelain", "--", "crates"])
    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_bytes": _mem_total(),
        "os": _os(),
        "kernel": platform.release(),
        "versions": {
            "sluice": f"{_run([sluice, '--version'])} — {sluice}",
            "working tree": f"git {git}"
            + (" + uncommitted changes under crates/" if dirty else ""),
            "rivet": _run([rivet, "--version"]) if rivet else "not installed",
            "psql": _run(["psql", "--version"]),
            "mariadb client": _run(["mariadb", "--version"]) or "not installed",
            "python": platform.python_version(),
            **packages,
            "GNU time": _run(["dpkg-query", "-W", "-f=${Version}", "time"]) or "unknown",
        },
    }
