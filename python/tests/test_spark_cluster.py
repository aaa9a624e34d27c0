"""``spark.read.format("sluice")`` on a standalone Spark cluster on loopback (a master and two
worker processes, executors in JVMs and Python workers of their own): the snapshot a driver
holds is joined by every executor, so nothing relies on state in the driver's process."""

from __future__ import annotations

import pytest

import sparkkit
from test_spark import read_acct, accounts, snapshot_read_under_writer


@pytest.fixture(scope="module")
def spark():
    yield from sparkkit.spark_for("cluster")


def test_cluster_snapshot_is_one_point_in_time_under_a_writer(spark, pg):
    snapshot_read_under_writer(spark, pg)


def test_cluster_read_uses_both_executors(spark, pg):
    accounts(pg)
    df = read_acct(spark, pg.url)
    hosts = df.rdd.mapPartitions(lambda _: [__import__("os").getpid()]).distinct().count()
    assert hosts >= 2, "the two workers' executors both read partitions"
    assert df.count() == 20_000
