"""Running one strategy as a child process and measuring it.

The child runs under GNU `/usr/bin/time -v` (or, where that is not installed, as in the
stand-alone lab, is waited for with `wait4`, whose resource usage is the same figures), which
reports CPU user and system time of the
whole process tree (children are waited for, so their time is included) and the maximum
resident set size of the largest single process. A strategy that spawns processes (the
multiprocessing fan-out, a shell pipeline) is larger than its largest process, so a thread
here also sums the RSS of every process in the tree every 50 ms; the run's peak RSS is the
larger of the two figures. The sampled sum can miss a spike shorter than the period, and it
counts pages shared between processes (forked Python workers share the interpreter) once per
process — an upper bound, as `ps` would show.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
GNU_TIME = "/usr/bin/time"


@dataclass
class Measured:
    """What the process tree cost."""

    exit_code: int
    wall_seconds: float
    user_seconds: float
    system_seconds: float
    max_rss_single_bytes: int  # GNU time: the largest single process
    peak_rss_tree_bytes: int  # sampled sum over the process tree
    processes_seen: int
    stdout: str
    stderr_tail: str

    @property
    def peak_rss_bytes(self) -> int:
        """The figure the report shows."""
        return max(self.max_rss_single_bytes, self.peak_rss_tree_bytes)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


class TreeRssSampler(threading.Thread):
    """Peak of the summed RSS of every descendant of `root` (not `root` itself)."""

    def __init__(self, root: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peak = 0
        self.seen: set[int] = set()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            total, stack = 0, _children(self.root)
            while stack:
                pid = stack.pop()
                self.seen.add(pid)
                total += _rss(pid)
                stack.extend(_children(pid))
            self.peak = max(self.peak, total)
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def _parse_time_v(text: str) -> dict[str, float]:
    fields = {
        "user": r"User time \(seconds\): ([\d.]+)",
        "system": r"System time \(seconds\): ([\d.]+)",
        "maxrss_kb": r"Maximum resident set size \(kbytes\): (\d+)",
    }
    out: dict[str, float] = {}
    for key, pat in fields.items():
        m = re.search(pat, text)
        out[key] = float(m.group(1)) if m else 0.0
    return out


def run_measured(
    argv: list[str],
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
    on_start=None,
) -> Measured:
    """Run argv under `/usr/bin/time -v`; `on_start()` is called right after the spawn."""
    if not os.access(GNU_TIME, os.X_OK):
        return _run_wait4(argv, env, cwd, timeout, on_start)
    with tempfile.TemporaryDirectory(prefix="sluicebench-") as tmp:
        time_out = Path(tmp) / "time.txt"
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            started = time.monotonic()
            proc = subprocess.Popen(
                [GNU_TIME, "-v", "-o", str(time_out), *argv],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
            )
            if on_start:
                on_start()
            sampler = TreeRssSampler(proc.pid)
            sampler.start()
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
                code = 124 if code == 0 else code
            wall = time.monotonic() - started
            sampler.stop()
        t = _parse_time_v(time_out.read_text(errors="replace") if time_out.exists() else "")
        stdout = out_path.read_text(errors="replace")[-20000:]
        stderr = err_path.read_text(errors="replace")
        return Measured(
            exit_code=code,
            wall_seconds=wall,
            user_seconds=t["user"],
            system_seconds=t["system"],
            max_rss_single_bytes=int(t["maxrss_kb"]) * 1024,
            peak_rss_tree_bytes=sampler.peak,
            processes_seen=len(sampler.seen),
            stdout=stdout,
            stderr_tail=stderr[-4000:],
        )


def _run_wait4(argv, env, cwd, timeout, on_start) -> Measured:
    """`run_measured` without GNU time: the child's resource usage from `wait4` (its waited-for
    children included, like GNU time's), the same tree RSS sampling."""
    with tempfile.TemporaryDirectory(prefix="sluicebench-") as tmp:
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            started = time.monotonic()
            proc = subprocess.Popen(
                argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=cwd
            )
            if on_start:
                on_start()
            sampler = TreeRssSampler(os.getpid())
            sampler.start()
            deadline = None if timeout is None else started + timeout
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    proc.kill()
                    pid, status, usage = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.01)
            wall = time.monotonic() - started
            sampler.stop()
            proc.returncode = os.waitstatus_to_exitcode(status)
        return Measured(
            exit_code=proc.returncode,
            wall_seconds=wall,
            user_seconds=usage.ru_utime,
            system_seconds=usage.ru_stime,
            max_rss_single_bytes=usage.ru_maxrss * 1024,
            peak_rss_tree_bytes=sampler.peak,
            processes_seen=len(sampler.seen),
            stdout=out_path.read_text(errors="replace")[-20000:],
            stderr_tail=err_path.read_text(errors="replace")[-4000:],
        )
