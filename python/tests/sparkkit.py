"""Apache Spark for the tests, on loopback: a ``local[2]`` session, or a standalone cluster —
one master and two worker processes started from the pyspark installation, each worker
launching its executor in a JVM and Python workers of its own — so that nothing a test
passes can rely on state in the driver's process.

Ports are free ones picked at random, directories temporary. A missing Java or pyspark fails
the test with the command that installs it; nothing is skipped."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> Path:
    try:
        import pyspark
    except ImportError:
        pytest.fail(
            "pyspark is not installed in the test environment: run ./scripts/test (it installs "
            "pyspark into ~/.cache/sluice/python-venv).",
            pytrace=False,
        )
    if shutil.which("java") is None:
        pytest.fail("no java on PATH: Spark needs Java 17 (apt-get install openjdk-17-jre-headless; ./scripts/test installs it).", pytrace=False)
    return Path(pyspark.__file__).parent


def _env() -> dict:
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_LOCAL_DIRS"] = tempfile.gettempdir()
    return env


def _wait_listening(port: int, proc: subprocess.Popen, what: str, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited ({proc.returncode}): {log.read_text()[-2000:]}", pytrace=False)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"{what} did not listen on 127.0.0.1:{port} within {timeout} s: {log.read_text()[-2000:]}", pytrace=False)


class Cluster:
    """A standalone Spark cluster on loopback: a master and `workers` workers of one core."""

    def __init__(self, workers: int = 2) -> None:
        home = spark_home()
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-spark-"))
        self.procs: List[subprocess.Popen] = []
        self.port = free_port()
        env = _env()
        cls = str(home / "bin" / "spark-class")
        self._start(
            [cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(self.port), "--webui-port", str(free_port())],
            "the Spark master", env, self.port,
        )
        for i in range(workers):
            port = free_port()
            work = self.dir / f"worker{i}"
            work.mkdir()
            self._start(
                [cls, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(free_port()), "--cores", "1",
                 "--memory", "1G", "--work-dir", str(work), self.url],
                f"Spark worker {i}", env, port,
            )

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, cmd: List[str], what: str, env: dict, port: int) -> None:
        log = self.dir / f"{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(proc)
        _wait_listening(port, proc, what, log)

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _fresh_jvm() -> None:
    """End this process's Spark JVM, if one runs: packages (`spark.jars.packages`) are resolved
    onto the classpath when the JVM starts, so a session that needs other packages than an
    earlier test's (Delta's, Iceberg's) must start a JVM of its own."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is not None:
        # The JVM leaves when its standard input closes.
        proc.stdin.close()
        proc.wait(timeout=60)
    SparkContext._gateway = None
    SparkContext._jvm = None


def session(master: str, conf: dict | None = None):
    """A SparkSession on `master` whose executors' Python workers import this test run's
    `sluice` (PYTHONPATH) with this interpreter; `conf`: settings fixed at its start (with
    `spark.jars.packages`, in a JVM of its own)."""
    from pyspark.sql import SparkSession

    import sluice.spark

    if conf and "spark.jars.packages" in conf:
        _fresh_jvm()

    for k, v in _env().items():
        if k in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP"):
            os.environ[k] = v
    b = (
        SparkSession.builder.master(master)
        .appName("sluice-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executor.memory", "768m")
        .config("spark.task.maxFailures", "2")
    )
    if master.startswith("spark://"):
        b = b.config("spark.cores.max", "2").config("spark.executor.cores", "1")
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sluice.spark.register(spark)
    return spark


def spark_for(kind: str) -> Iterator:
    """A session on `kind` ("local" or "cluster"), stopped (and the cluster with it) after."""
    spark_home()
    cluster = Cluster() if kind == "cluster" else None
    try:
        spark = session(cluster.url if cluster else "local[2]")
        try:
            yield spark
        finally:
            spark.stop()
    finally:
        if cluster:
            cluster.stop()
