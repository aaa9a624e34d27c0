"""sluice on Apache Spark: ``spark.read.format("sluice")``, one snapshot across executors, and
a distributed export.

A Spark data source (PySpark 4's Python Data Source API; ``pip install "sluice[spark]"``)
whose partitions are sluice's chunks — PostgreSQL page ranges or key ranges, planned as
``sluice plan`` plans them, without reading a row — and whose tasks read their chunk with
sluice's engine straight into Arrow batches (no per-row Python):

>>> import sluice.spark
>>> sluice.spark.register(spark)
>>> df = (spark.read.format("sluice")
...       .option("source", "postgres://app@db/shop").option("table", "public.orders")
...       .option("chunk_size", "256MB").load())

By default every partition is its own transaction (the guarantee of ``consistency="chunk"``):
rows changed during the read may be seen in either state. Inside a ``snapshot`` block every
partition, on any executor, reads the one snapshot the driver holds (PostgreSQL imports it
with ``SET TRANSACTION SNAPSHOT``, which works from any host while the holder lives):

>>> with sluice.spark.snapshot(spark, "postgres://app@db/shop", tables="public.orders") as snap:
...     df = (spark.read.format("sluice").option("source", "postgres://app@db/shop")
...           .option("table", "public.orders").option("snapshot", snap).load())
...     df.write.parquet("s3://bucket/orders")   # run what reads df inside the block
>>> snap.report["snapshot_held_seconds"]

``export(spark, url, to=…, tables=…)`` is ``sluice export`` with each chunk written by a Spark
task (the driver plans, holds the snapshot and writes the manifest); its output is the one
``sluice export`` writes.

The block holds the snapshot (and on PostgreSQL VACUUM's horizon) until it ends, and locks
its tables in ACCESS SHARE mode as an export does, so no TRUNCATE or ALTER TABLE makes the
snapshot lie; a read of a table the block does not hold is refused. DataFrames are lazy: the
actions that read them must run inside the block. MySQL/MariaDB cannot share a snapshot
between sessions, so they refuse a snapshot block; their reads are consistent per chunk.

Options (``.option(name, value)``) are the Python keywords of :func:`sluice.read_arrow` — the
command line's settings with ``_`` for ``-``: ``source``, ``table`` (or the path given to
``load``), ``query``, ``columns`` (comma-separated), ``chunk_by``, ``chunk_size``,
``parallel`` (sizes chunks as for that many workers), ``memory``, ``batch_size``,
``enable_row_security``, ``config``, … plus ``snapshot``. Every field of the DataFrame's
schema carries the read's guarantee in its metadata (``sluice.consistency``).

Filters: ``register(spark, filter_pushdown=True)`` lets ``df.filter(...)`` reach the database —
integer comparisons and ``isin``, NULL tests of integer columns and ``~`` of those run in every
chunk's ``WHERE`` (a column of PostgreSQL ``oid`` or MySQL ``YEAR`` is refused);
text comparisons (collations differ from Spark's byte order), ``OR`` and the rest stay
Spark's, applied after the read.

Types: Spark SQL's, as ``--format delta`` writes them (decimal(p,s) up to 38 digits,
timestamps with and without time zone, binary, arrays, structs); a type Spark has no
equivalent for (UUID, time of day, decimals wider than 38 digits, unsigned 64-bit) arrives as
text, as the CSV export writes it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import ByteType, IntegerType, LongType, ShortType, StructField, StructType

from . import ConfigError, _one_dataset, _sluice

__all__ = ["register", "snapshot", "Snapshot", "SluiceDataSource", "export"]

# Options whose values are whole numbers or booleans; Spark hands every option over as text.
_WHOLE = {"parallel", "lock_wait_timeout", "long_query_guard", "long_query_wait", "max_active"}
_FLAGS = {"enable_row_security", "lock_non_transactional"}
# Options of a file export, meaningless for a read (refused by the native side anyway, but
# the message should name Spark's way).
_NOT_FOR_READS = {"to", "format", "overwrite", "resume", "merge"}


_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any, filter_pushdown: Optional[bool] = None) -> None:
    """Make ``spark.read.format("sluice")`` available in this Spark session.

    ``filter_pushdown``: whether reads take the filters Spark pushes (``df.filter(...)``)
    to the source, so the rows they drop are never read. ``None`` (the default) follows the
    session's ``spark.sql.python.filterPushdown.enabled`` as it is now (off unless set: Spark
    4.1 fails a Python data source that takes filters while it is off); ``True`` turns it on
    for the session; ``False`` never pushes.
    """
    if filter_pushdown is None:
        filter_pushdown = str(spark.conf.get(_PUSHDOWN_CONF, "false")).lower() == "true"
    elif filter_pushdown:
        spark.conf.set(_PUSHDOWN_CONF, "true")
    spark.dataSource.register(_FilteringDataSource if filter_pushdown else SluiceDataSource)


class Snapshot:
    """A snapshot the driver holds for the reads of a ``with snapshot(…)`` block.

    ``str(snap)`` is its token (what ``.option("snapshot", snap)`` passes to the executors: the
    snapshot's name, the tables it protects, no URL and no secret). ``report`` is filled when
    the block ends: how long the snapshot was held and the harm peaks sampled meanwhile over
    the holder's and every task's sessions.
    """

    def __init__(self, holder: Any) -> None:
        self._holder = holder
        self.token: str = holder.token
        info = json.loads(self.token)
        self.id: str = info["snapshot"]["id"]
        self.position: str = info["position_text"]
        self.taken_at: str = info["snapshot"]["taken_at"]
        self.tables: List[str] = info["datasets"]
        self.report: Optional[Dict[str, Any]] = None

    def __str__(self) -> str:
        return self.token

    def __repr__(self) -> str:
        return f"<sluice.spark.Snapshot at {self.position}, {self.taken_at}>"

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def release(self) -> Optional[Dict[str, Any]]:
        """End the snapshot (reads started later fail); returns and keeps the report."""
        text = self._holder.release()
        if text is not None:
            self.report = json.loads(text)
        return self.report


def snapshot(
    spark: Any,
    source: str,
    *,
    tables: Optional[Union[str, Sequence[str]]] = None,
    schema: Optional[Union[str, Sequence[str]]] = None,
    enable_row_security: bool = False,
    config: Optional[str] = None,
) -> Snapshot:
    """Take one snapshot of ``tables``/``schema`` on ``source`` and hold it for a block.

    Use as ``with sluice.spark.snapshot(spark, url, tables="public.orders") as snap:`` and pass
    ``.option("snapshot", snap)`` to the reads in the block: every partition of every read,
    on any executor, then sees the database as of one point. The tables are selected as
    ``sluice export --tables/--schema`` selects them and locked in ACCESS SHARE mode until
    the block ends. Registers the data source in ``spark``.

    Raises:
        ConfigError: the engine cannot share a snapshot (MySQL/MariaDB), or a bad option.
        SourceError: the database refused or failed.
    """
    if spark is not None:
        register(spark)
    opts: Dict[str, Any] = {"source": source}
    if tables is not None:
        opts["tables"] = tables
    if schema is not None:
        opts["schema"] = schema
    if enable_row_security:
        opts["enable_row_security"] = True
    if config is not None:
        opts["config"] = config
    return Snapshot(_sluice.hold_snapshot(**opts))


def _read_options(options: Dict[str, str]) -> Dict[str, Any]:
    """Spark's options (text, keys in any case) as the native module's keywords."""
    given = {k.lower(): v for k, v in options.items()}
    path = given.pop("path", None)
    if "table" not in given and path:
        given["table"] = path
    for name in _NOT_FOR_READS & given.keys():
        raise ConfigError(
            f"option {name!r} is for sluice.export; a Spark read returns a DataFrame (write it "
            "with df.write)."
        )
    table = given.pop("table", None)
    query = given.pop("query", None)
    columns = given.pop("columns", None)
    picked = None if columns is None else [c.strip() for c in columns.split(",") if c.strip()]
    out: Dict[str, Any] = {}
    for k, v in given.items():
        if k == "snapshot":
            continue
        if k in _WHOLE:
            try:
                out[k] = int(v)
            except ValueError:
                raise ConfigError(f"option {k!r} takes a whole number, not {v!r}.") from None
        elif k in _FLAGS:
            if v.lower() not in ("true", "false"):
                raise ConfigError(f"option {k!r} takes true or false, not {v!r}.")
            out[k] = v.lower() == "true"
        else:
            out[k] = v
    out.update(_one_dataset(table, query, picked, out.get("config")))
    return out


class _Chunks(InputPartition):
    """One Spark partition: chunks of the plan (as the native module's JSON)."""

    def __init__(self, chunks: List[str]) -> None:
        super().__init__(chunks)
        self.chunks = chunks


class SluiceDataSource(DataSource):
    """``spark.read.format("sluice")``: see the module's documentation."""

    @classmethod
    def name(cls) -> str:
        return "sluice"

    def _plan(self) -> Any:
        opts = _read_options(dict(self.options))
        token = _token(self.options)
        return _sluice.plan_read(snapshot=token, **opts)

    def schema(self) -> StructType:
        arrow_schema, _dataset, _chunks, guarantee, _notes = self._plan()
        return _spark_schema(pa.schema(arrow_schema), guarantee)

    def reader(self, schema: StructType) -> "DataSourceReader":
        return _Reader(dict(self.options))


def _token(options: Any) -> Optional[str]:
    for k, v in dict(options).items():
        if k.lower() == "snapshot" and v:
            return str(v)
    return None


def _spark_schema(arrow_schema: pa.Schema, guarantee: str) -> StructType:
    """Spark's schema for the read's Arrow schema, each field carrying the guarantee."""
    plain = from_arrow_schema(arrow_schema, prefer_timestamp_ntz=True)
    consistency, _, detail = guarantee.partition(": ")
    meta = {"sluice.consistency": consistency, "sluice.guarantee": detail}
    return StructType(
        [StructField(f.name, f.dataType, f.nullable, metadata=meta) for f in plain.fields]
    )


class _Reader(DataSourceReader):
    def __init__(self, options: Dict[str, str]) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        opts = _read_options(self.options)
        _schema, _dataset, chunks, _guarantee, _notes = _sluice.plan_read(
            snapshot=_token(self.options), **opts
        )
        return [_Chunks([c]) for c in chunks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        opts = _read_options(self.options)
        filters = getattr(self, "filters", None)
        stream = _sluice.read_chunks(
            partition.chunks,
            snapshot=_token(self.options),
            filters=json.dumps(filters) if filters else None,
            **opts,
        )
        try:
            for batch in stream:
                yield pa.record_batch(batch)
        finally:
            stream.close()


class _FilteringDataSource(SluiceDataSource):
    """The data source with filter pushdown (see :func:`register`)."""

    def reader(self, schema: StructType) -> "DataSourceReader":
        return _FilteringReader(dict(self.options), schema)


class _FilteringReader(_Reader):
    """A reader that takes the filters the source computes exactly as Spark would: integer
    comparisons and ``IN`` lists, NULL tests of integer columns, and ``NOT`` of those (text is not pushed: the
    engines compare it by collation, Spark by bytes). Spark evaluates the others after the
    read, as it does without pushdown."""

    def __init__(self, options: Dict[str, str], schema: StructType) -> None:
        super().__init__(options)
        self.schema = schema
        self.filters: List[Dict[str, Any]] = []

    def pushFilters(self, filters: List[Filter]) -> Iterator[Filter]:  # noqa: N802 (Spark's name)
        for f in filters:
            pushed = _row_filter(f, self.schema)
            if pushed is None:
                yield f
            else:
                self.filters.append(pushed)


_COMPARE = {
    EqualTo: "eq",
    GreaterThan: "gt",
    GreaterThanOrEqual: "ge",
    LessThan: "lt",
    LessThanOrEqual: "le",
}
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63


def _column(path: Sequence[str], schema: StructType, integral: bool) -> Optional[str]:
    """The top-level column ``path`` names (of an integer type where ``integral``)."""
    if len(path) != 1:
        return None
    field = next((f for f in schema.fields if f.name == path[0]), None)
    if field is None or (integral and not isinstance(field.dataType, _INTEGRAL)):
        return None
    return field.name


def _row_filter(f: Filter, schema: StructType) -> Optional[Dict[str, Any]]:
    """``f`` as the engine's row filter, or None when it is not computed at the source."""
    if type(f) in _COMPARE and _whole(f.value):  # type: ignore[attr-defined]
        column = _column(f.attribute, schema, True)  # type: ignore[attr-defined]
        cmp = _COMPARE[type(f)]
        return None if column is None else {
            "op": "compare", "column": column, "cmp": cmp, "value": f.value  # type: ignore
        }
    if isinstance(f, In) and f.value and all(_whole(v) for v in f.value):
        column = _column(f.attribute, schema, True)
        return None if column is None else {"op": "in", "column": column, "values": list(f.value)}
    if isinstance(f, (IsNull, IsNotNull)):
        # Integer columns only: a NULL elsewhere may not be NULL at the source (MySQL's zero
        # dates read as NULL).
        column = _column(f.attribute, schema, True)
        op = "is_null" if isinstance(f, IsNull) else "is_not_null"
        return None if column is None else {"op": op, "column": column}
    if isinstance(f, Not):
        inner = _row_filter(f.child, schema)
        return None if inner is None else {"op": "not", "filter": inner}
    return None


# The harm budget paces one process's workers between chunks; tasks on many executors have no
# such gate, so a distributed export refuses these rather than ignore them.
_UNGOVERNED = {"harm_budget", "max_replica_lag", "max_latency", "max_xmin_age", "max_active",
               "max_rate", "replica", "probe_sql"}


def export(spark: Any, source: str, *, to: str, **options: Any) -> Dict[str, Any]:
    """``sluice export`` with every chunk read and written by a Spark task.

    The driver does what ``sluice export`` does before and after its workers: it locks the
    output, decides fresh, ``resume=True`` or ``overwrite=True``, plans the chunks, takes the
    snapshot (and holds it, with the tables locked, until the manifest is written) and writes
    ``_sluice/run.json``. Each chunk is then one Spark task that imports the snapshot, writes
    its part with sluice's own writer (the driver's batch and row-group sizes) and its
    receipt, and returns its account. The driver writes ``manifest.json`` last, from every
    receipt. The output — layout, part names, receipts, manifest — is the one ``sluice
    export`` writes for the same request and snapshot, and either finishes the other's
    interrupted run with ``resume=True``.

    Takes :func:`sluice.export`'s keywords (``tables``, ``schema``, ``format``, ``parallel``
    — which sizes the plan as for that many workers —, ``chunk_size``, ``consistency``,
    ``storage_option``…), except the harm budget's, which pace one process's workers and
    are refused here. Executors need the ``sluice`` package, the database and the
    destination reachable (a local ``to`` must be a directory every executor shares).

    A task that fails is retried by Spark and rewrites the same part; a job that fails leaves
    no manifest, and ``resume=True`` reads only the chunks without a receipt. MySQL/MariaDB
    cannot share a snapshot with other processes: use ``consistency="chunk"`` there.

    Returns:
        dict: the report, as :func:`sluice.export` returns it.
    """
    refused = sorted(_UNGOVERNED & {k for k, v in options.items() if v is not None})
    if refused:
        raise ConfigError(
            f"{', '.join(refused)}: the harm budget paces the workers of one process between "
            "chunks, and a distributed export's tasks run on many executors with no such gate. "
            "Use sluice.export on one machine to export under a harm budget, or bound the "
            "Spark job's concurrency (spark.cores.max)."
        )
    if str(spark.conf.get("spark.speculation", "false")).lower() == "true":
        raise ConfigError(
            "spark.speculation is on: two attempts of one task would write the same part at "
            "different times, and its receipt could describe the other attempt's file. Run the "
            "export in a session started without it (spark.speculation is fixed when a session "
            "starts)."
        )
    report_json = options.pop("report_json", None)
    opts = {k: v for k, v in options.items() if v is not None and v is not False}
    to = os.fspath(to)
    if "://" not in to:
        # The executors' working directories are not the driver's.
        to = os.path.abspath(to)
    opts.update(source=source, to=to)
    driver, complete = _sluice.begin_export(**opts)
    if driver is None:
        report = json.loads(complete)
    else:
        spec, chunks = driver.spec, driver.chunks
        try:
            results = _run_tasks(spark, chunks, spec, opts) if chunks else []
        except BaseException:
            driver.abandon()
            raise
        report = json.loads(driver.finish(results))
    if report_json is not None:
        with open(report_json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def _run_tasks(spark: Any, chunks: List[str], spec: str, opts: Dict[str, Any]) -> List[str]:
    """One Spark task per chunk, each returning its account as JSON. mapInArrow is a DataFrame
    API, not the RDD one Spark Connect lacks (not tested over Spark Connect)."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from sluice import _sluice as native

        for batch in batches:
            for chunk in batch.column(0).to_pylist():
                account = native.write_chunks([chunk], spec, **opts)
                yield pa.RecordBatch.from_pydict({"account": [account]})

    df = spark.createDataFrame([(c,) for c in chunks], "chunk string").repartition(len(chunks))
    # Tagged, so that a driver that gives up (an error, Ctrl-C) stops the tasks still running
    # before it releases the snapshot and the output's lock: none writes after that.
    tag = f"sluice-export-{json.loads(spec)['run_id']}"
    spark.addTag(tag)
    try:
        return [r["account"] for r in df.mapInArrow(write, "account string").collect()]
    except BaseException:
        spark.interruptTag(tag)
        raise
    finally:
        spark.removeTag(tag)
