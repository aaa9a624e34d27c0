"""sluice: parallel, consistent reads from relational databases straight into Arrow.

Reads PostgreSQL, MySQL/MariaDB and Firebird with several workers sharing one consistent
snapshot, memory bounded by bytes, and the same engine, options and defaults as the
``sluice`` command line:

>>> import sluice
>>> t = sluice.read_arrow("postgres://app@db/shop", table="public.orders", parallel=4)
>>> df = t.to_pandas()
>>> for batch in sluice.read_batches("mysql://app@db/shop", query="SELECT * FROM orders",
...                                  memory="256MB"):
...     ...
>>> report = sluice.export("postgres://app@db/shop", to="s3://bucket/prefix",
...                        tables=r"sales\\..*", format="parquet")
>>> plan = sluice.plan("postgres://app@db/shop", schema="sales")

Options are the command line's settings with ``_`` for ``-`` (``--chunk-size`` is
``chunk_size=``), keyword-only; sizes are a number of bytes or a text such as ``"64MB"``.
Passwords may come from the environment (PGPASSWORD, ~/.pgpass, MYSQL_PWD, ISC_PASSWORD);
they never appear in errors or reports.

Errors are :class:`SluiceError` subclasses, one per side of a failure (:class:`ConfigError`,
:class:`SourceError`, :class:`DestinationError`, :class:`DataError`, :class:`Interrupted`,
:class:`InternalError`), each with ``retryable`` (whether running again can succeed). Ctrl-C
while reading stops the run, closes its database sessions and raises KeyboardInterrupt.
"""

from __future__ import annotations

import atexit
import json
import os
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Union

import pyarrow as pa

from . import _sluice
from ._sluice import (
    ConfigError,
    DataError,
    DestinationError,
    InternalError,
    Interrupted,
    SluiceError,
    SourceError,
)

__version__ = _sluice.__version__
__all__ = [
    "read_arrow",
    "read_batches",
    "export",
    "plan",
    "SluiceError",
    "ConfigError",
    "SourceError",
    "DestinationError",
    "DataError",
    "Interrupted",
    "InternalError",
]

Size = Union[int, str]
PathLike = Union[str, "os.PathLike[str]"]

# The Firebird client library must be shut down before the interpreter's exit handlers run
# (its own exit-time shutdown can deadlock with an embedded engine); nothing happens when no
# Firebird source was read.
atexit.register(_sluice.shutdown)


def _options(**given: Any) -> Dict[str, Any]:
    """The options that were given (None means: the default)."""
    return {k: v for k, v in given.items() if v is not None and v is not False}


def _one_dataset(
    table: Optional[str], query: Optional[str], columns: Optional[Sequence[str]], config: Any
) -> Dict[str, Any]:
    if columns is not None and (table is None or isinstance(columns, str)):
        raise ConfigError(
            "columns= is a list of column names of table= (e.g. columns=[\"id\", \"amount\"]); "
            "a query selects its own columns."
        )
    if table is None and query is None and config is not None:
        return {}  # the YAML file names it (a second dataset is refused when it is read)
    if (table is None) == (query is None):
        raise ConfigError(
            "name what to read: table=\"schema.table\" or query=\"SELECT …\" (exactly one of them)."
        )
    if table is not None:
        if not isinstance(table, str):
            raise ConfigError("table= is one table name (use sluice.export to write several).")
        if columns is not None:
            # Exact names, as pyarrow takes them: each quoted for the picker.
            picked = ",".join('"' + c.replace('"', '""') + '"' for c in columns)
            return {"table": table, "columns": f"{table}:{picked}"}
        return {"table": table}
    if not isinstance(query, str):
        raise ConfigError("query= is one SQL text (use sluice.export to write several queries).")
    return {"query": {"query": query}}


def read_arrow(
    source: str,
    *,
    table: Optional[str] = None,
    query: Optional[str] = None,
    columns: Optional[Sequence[str]] = None,
    parallel: Optional[int] = None,
    consistency: Optional[str] = None,
    chunk_by: Optional[str] = None,
    chunk_size: Optional[Size] = None,
    memory: Optional[Size] = None,
    batch_size: Optional[Size] = None,
    enable_row_security: bool = False,
    lock_wait_timeout: Optional[int] = None,
    long_query_guard: Optional[int] = None,
    long_query_wait: Optional[int] = None,
    lock_non_transactional: bool = False,
    report_html: Optional[PathLike] = None,
    harm_budget: Optional[str] = None,
    max_replica_lag: Optional[str] = None,
    max_latency: Optional[str] = None,
    max_xmin_age: Optional[str] = None,
    max_active: Optional[int] = None,
    max_rate: Optional[str] = None,
    replica: Optional[Union[str, Sequence[str]]] = None,
    probe_sql: Optional[str] = None,
    config: Optional[PathLike] = None,
) -> pa.Table:
    """Read one table or query into a ``pyarrow.Table``.

    The rows are read as ``sluice export`` reads them: split into chunks (by key ranges or
    pages) read by ``parallel`` workers that all share one snapshot, so the table is one point
    in time even while the source is being written. Parts come back in chunk order (key order
    when chunked by key). Arrow data is handed over without copying; the GIL is released
    while reading; Ctrl-C stops the run, closes its sessions and raises KeyboardInterrupt.

    Args:
        source: Database URL: ``postgres://user@host:5432/db``, ``mysql://user@host/db``
            (MySQL and MariaDB), ``firebird:///abs/path/db.fdb`` (embedded) or
            ``firebird://user@host:port//abs/path/db.fdb``. TLS and passwords as for the
            command line (``?sslmode=verify-full``, PGPASSWORD, ~/.pgpass, MYSQL_PWD).
        table: The table, view or materialized view, as ``name`` or ``schema.name``
            (double-quote a part to match its case exactly).
        query: A SELECT to read instead of a table (one worker: a query cannot be chunked).
        columns: Only these columns of ``table`` (exact names), in the table's order; the
            others are not read.
        parallel: Workers, each with its own connection (default: chosen from the table's
            size and the cores).
        consistency: ``"snapshot"`` (default: every worker reads one snapshot) or ``"chunk"``
            (each chunk in its own short transaction: less harm, not one point in time).
        chunk_by: ``"auto"`` (default), ``"ctid"`` (PostgreSQL pages), ``"key"``,
            ``"key:col[,col…]"`` or ``"none"``.
        chunk_size: Target chunk size in source bytes (default: chosen, 64–256 MB).
        memory: Memory target for the data in flight (default ``"64MB"``); batch sizes are
            derived from it and the worker count. The returned table is on top of it.
        batch_size: Bytes per Arrow batch, overriding the size derived from ``memory``.
        enable_row_security: PostgreSQL: read only the rows row-level security lets this
            user see instead of refusing a policed table.
        lock_wait_timeout: MySQL/MariaDB: longest wait, in seconds, for the global lock that
            lines the workers' snapshots up, and for metadata locks (default 10).
        long_query_guard: MySQL/MariaDB: do not take the global lock while another
            statement that would make it wait has run this many seconds (default 10; 0: off).
        long_query_wait: MySQL/MariaDB: wait up to this many seconds for such statements
            (default 0: refuse at once).
        lock_non_transactional: MySQL/MariaDB: hold READ locks on MyISAM/Aria/MEMORY tables
            for the run so they match the snapshot.
        config: A YAML file with the same settings (keywords given here win over it).

    Returns:
        pyarrow.Table: every row, with sluice's type mapping (the same Arrow schema the
        Parquet export writes).

    Raises:
        ConfigError: a bad option, URL, or unknown table (``retryable`` False).
        SourceError: the database refused or failed (``retryable`` says whether trying again
            can help).
        DataError: a value cannot be represented in Arrow.
    """
    opts = _options(
        source=source,
        parallel=parallel,
        consistency=consistency,
        chunk_by=chunk_by,
        chunk_size=chunk_size,
        memory=memory,
        batch_size=batch_size,
        enable_row_security=enable_row_security,
        lock_wait_timeout=lock_wait_timeout,
        long_query_guard=long_query_guard,
        long_query_wait=long_query_wait,
        lock_non_transactional=lock_non_transactional,
        report_html=None if report_html is None else os.fspath(report_html),
        harm_budget=harm_budget,
        max_replica_lag=max_replica_lag,
        max_latency=max_latency,
        max_xmin_age=max_xmin_age,
        max_active=max_active,
        max_rate=max_rate,
        replica=replica,
        probe_sql=probe_sql,
        config=config,
    )
    opts.update(_one_dataset(table, query, columns, config))
    result, _report = _sluice.read(**opts)
    # Not pa.table(result): it first checks for a pandas DataFrame, which imports pandas
    # (half a second) when it is installed.
    return pa.RecordBatchReader.from_stream(result).read_all()


def read_batches(
    source: str,
    *,
    table: Optional[str] = None,
    query: Optional[str] = None,
    columns: Optional[Sequence[str]] = None,
    parallel: Optional[int] = None,
    consistency: Optional[str] = None,
    chunk_by: Optional[str] = None,
    chunk_size: Optional[Size] = None,
    memory: Optional[Size] = None,
    batch_size: Optional[Size] = None,
    enable_row_security: bool = False,
    lock_wait_timeout: Optional[int] = None,
    long_query_guard: Optional[int] = None,
    long_query_wait: Optional[int] = None,
    lock_non_transactional: bool = False,
    report_html: Optional[PathLike] = None,
    harm_budget: Optional[str] = None,
    max_replica_lag: Optional[str] = None,
    max_latency: Optional[str] = None,
    max_xmin_age: Optional[str] = None,
    max_active: Optional[int] = None,
    max_rate: Optional[str] = None,
    replica: Optional[Union[str, Sequence[str]]] = None,
    probe_sql: Optional[str] = None,
    config: Optional[PathLike] = None,
) -> pa.RecordBatchReader:
    """Stream one table or query as a ``pyarrow.RecordBatchReader``.

    Same options and snapshot as :func:`read_arrow`, but batches are returned as the workers
    read them, so memory stays within ``memory`` (plus the batch you hold) whatever the table
    size: workers wait while you process a batch. With ``parallel`` above 1, batches of
    different chunks interleave (row order is not kept; use ``parallel=1`` and
    ``chunk_by="none"`` for the source's order).

    The reader starts the run at once (the schema is known when this returns); workers wait
    while the reader is not read. Dropping the reader before its end (``del reader``, or
    leaving the scope that holds it), or Ctrl-C while waiting for a batch (KeyboardInterrupt),
    stops the run and closes its sessions. (pyarrow's ``reader.close()`` does not reach the
    iterator a reader built from Python batches wraps: drop the reader instead.) A chunk that fails after some of its batches were returned is not
    read again silently: the reader raises a retryable :class:`SourceError` instead of
    returning rows twice.

    Returns:
        pyarrow.RecordBatchReader: ``for batch in reader`` or ``reader.read_all()``.
    """
    opts = _options(
        source=source,
        parallel=parallel,
        consistency=consistency,
        chunk_by=chunk_by,
        chunk_size=chunk_size,
        memory=memory,
        batch_size=batch_size,
        enable_row_security=enable_row_security,
        lock_wait_timeout=lock_wait_timeout,
        long_query_guard=long_query_guard,
        long_query_wait=long_query_wait,
        lock_non_transactional=lock_non_transactional,
        report_html=None if report_html is None else os.fspath(report_html),
        harm_budget=harm_budget,
        max_replica_lag=max_replica_lag,
        max_latency=max_latency,
        max_xmin_age=max_xmin_age,
        max_active=max_active,
        max_rate=max_rate,
        replica=replica,
        probe_sql=probe_sql,
        config=config,
    )
    opts.update(_one_dataset(table, query, columns, config))
    stream = _sluice.stream(**opts)
    schema = pa.schema(stream.schema)
    return pa.RecordBatchReader.from_batches(schema, _batches(stream))


def _batches(stream: Any) -> Iterator[pa.RecordBatch]:
    """The stream's batches as pyarrow batches; closing the generator stops the run."""
    try:
        for batch in stream:
            yield pa.record_batch(batch)
    finally:
        stream.close()


def export(
    source: str,
    *,
    to: PathLike,
    table: Union[str, Sequence[str], None] = None,
    tables: Union[str, Sequence[str], None] = None,
    schema: Union[str, Sequence[str], None] = None,
    query: Optional[Mapping[str, str]] = None,
    columns: Union[str, Sequence[str], None] = None,
    format: Optional[str] = None,
    parallel: Optional[int] = None,
    consistency: Optional[str] = None,
    chunk_by: Optional[str] = None,
    chunk_size: Optional[Size] = None,
    memory: Optional[Size] = None,
    batch_size: Optional[Size] = None,
    compression: Optional[str] = None,
    zstd_level: Optional[int] = None,
    parquet_encodings: Optional[str] = None,
    row_group_size: Optional[Size] = None,
    csv_delimiter: Optional[str] = None,
    csv_null: Optional[str] = None,
    csv_no_header: bool = False,
    merge: bool = False,
    resume: bool = False,
    overwrite: bool = False,
    report_json: Optional[PathLike] = None,
    no_fsync: bool = False,
    enable_row_security: bool = False,
    slot_wait: Optional[str] = None,
    lock_wait_timeout: Optional[int] = None,
    long_query_guard: Optional[int] = None,
    long_query_wait: Optional[int] = None,
    lock_non_transactional: bool = False,
    part_size: Optional[Size] = None,
    upload_concurrency: Optional[int] = None,
    storage_option: Optional[Mapping[str, str]] = None,
    catalog: Optional[str] = None,
    namespace: Optional[str] = None,
    report_html: Optional[PathLike] = None,
    harm_budget: Optional[str] = None,
    max_replica_lag: Optional[str] = None,
    max_latency: Optional[str] = None,
    max_xmin_age: Optional[str] = None,
    max_active: Optional[int] = None,
    max_rate: Optional[str] = None,
    replica: Optional[Union[str, Sequence[str]]] = None,
    probe_sql: Optional[str] = None,
    config: Optional[PathLike] = None,
) -> Dict[str, Any]:
    """Export tables, views or queries to Parquet or CSV files: ``sluice export``.

    Writes ``<to>/<schema>.<table>/part-00000.parquet …`` and ``<to>/manifest.json`` last,
    each file committed atomically; ``resume=True`` finishes an interrupted export. ``to`` is
    a directory, ``file://``, or an object store (``s3://``, ``gs://``, ``az://``; client
    settings in ``storage_option={"endpoint": …, "region": …}``).

    Args:
        table: One name or a list (``schema.name``).
        tables: Regular expression(s) matched against ``schema.table``.
        schema: Every table of these schemas.
        query: ``{"name": "SELECT …"}``: each query exported as dataset ``name``.
        columns: ``"table:col,col"`` (or a list of them, one per table): read only these
            columns of a selected table, as ``--columns``.
        format: ``"parquet"`` (default), ``"csv"``, ``"jsonl"``, ``"avro"``, or a table per
            dataset: ``"delta"``, ``"iceberg"`` (with ``namespace``).
        compression: Parquet: ``"zstd"`` (default), ``"snappy"``, ``"none"``.
        zstd_level: 1 to 22, for every column (default: 1, and 3 for Parquet's text and
            binary columns).
        parquet_encodings: ``"compatible"`` (default: what every Parquet reader decodes) or
            ``"delta"`` (integer, date and timestamp columns delta-encoded: smaller files,
            for readers that decode it; refused for ``format="iceberg"``).
        row_group_size: Parquet row-group memory, overriding the size derived from
            ``memory``.
        csv_delimiter, csv_null, csv_no_header: CSV form (default ``,``, empty, header on).
        merge: One file per dataset instead of one per chunk.
        resume: Finish an interrupted export in ``to``.
        overwrite: Replace an export already in ``to``.
        report_json: Also write the report to this file.
        no_fsync: Skip fsync (faster, not crash-safe).
        slot_wait: PostgreSQL, ``consistency="converged"``: the longest the replication
            slot's creation waits for running transactions (``"5min"``; default: no limit).
        part_size, upload_concurrency: Object stores: multipart part size (default 5MB) and
            parts uploading at once (default 2).
        storage_option: Object-store client settings (keys of the object_store crate).
        catalog: ``format="iceberg"``: the SQL catalog, ``"sqlite:///path/catalog.db"`` or
            ``"postgres://user@host/db"`` (default: ``catalog.db`` in ``to``).
        namespace: ``format="iceberg"``: the catalog namespace of the tables.
        report_html: Also write the report as a self-contained HTML page to this file.
        harm_budget, max_replica_lag, max_latency, max_xmin_age, max_active, max_rate,
            replica, probe_sql: The harm budget (``"gentle"``, ``"normal"``, ``"none"``;
            ``max_latency="20ms"`` …): limits the read keeps to between chunks (see the
            README's Harm budget).

    The other options are :func:`read_arrow`'s.

    Returns:
        dict: the report (``sluice export --report-json``): rows, bytes, files, phases, the
        harm done to the source, peak memory.
    """
    opts = _options(
        source=source,
        to=os.fspath(to),
        table=table,
        tables=tables,
        schema=schema,
        query=query,
        columns=columns,
        format=format,
        parallel=parallel,
        consistency=consistency,
        chunk_by=chunk_by,
        chunk_size=chunk_size,
        memory=memory,
        batch_size=batch_size,
        compression=compression,
        zstd_level=zstd_level,
        parquet_encodings=parquet_encodings,
        row_group_size=row_group_size,
        csv_delimiter=csv_delimiter,
        csv_null=csv_null,
        csv_no_header=csv_no_header,
        merge=merge,
        resume=resume,
        overwrite=overwrite,
        report_json=report_json,
        no_fsync=no_fsync,
        enable_row_security=enable_row_security,
        slot_wait=slot_wait,
        lock_wait_timeout=lock_wait_timeout,
        long_query_guard=long_query_guard,
        long_query_wait=long_query_wait,
        lock_non_transactional=lock_non_transactional,
        part_size=part_size,
        upload_concurrency=upload_concurrency,
        storage_option=storage_option,
        catalog=catalog,
        namespace=namespace,
        report_html=None if report_html is None else os.fspath(report_html),
        harm_budget=harm_budget,
        max_replica_lag=max_replica_lag,
        max_latency=max_latency,
        max_xmin_age=max_xmin_age,
        max_active=max_active,
        max_rate=max_rate,
        replica=replica,
        probe_sql=probe_sql,
        config=config,
    )
    return json.loads(_sluice.export(**opts))


def plan(
    source: str,
    *,
    table: Union[str, Sequence[str], None] = None,
    tables: Union[str, Sequence[str], None] = None,
    schema: Union[str, Sequence[str], None] = None,
    query: Optional[Mapping[str, str]] = None,
    columns: Union[str, Sequence[str], None] = None,
    to: Optional[PathLike] = None,
    format: Optional[str] = None,
    parallel: Optional[int] = None,
    consistency: Optional[str] = None,
    chunk_by: Optional[str] = None,
    chunk_size: Optional[Size] = None,
    memory: Optional[Size] = None,
    batch_size: Optional[Size] = None,
    row_group_size: Optional[Size] = None,
    part_size: Optional[Size] = None,
    upload_concurrency: Optional[int] = None,
    storage_option: Optional[Mapping[str, str]] = None,
    enable_row_security: bool = False,
    report_html: Optional[PathLike] = None,
    harm_budget: Optional[str] = None,
    max_replica_lag: Optional[str] = None,
    max_latency: Optional[str] = None,
    max_xmin_age: Optional[str] = None,
    max_active: Optional[int] = None,
    max_rate: Optional[str] = None,
    replica: Optional[Union[str, Sequence[str]]] = None,
    probe_sql: Optional[str] = None,
    config: Optional[PathLike] = None,
) -> Dict[str, Any]:
    """What an export would do, without reading rows: ``sluice plan --json``.

    Sizes, chunks, workers and the predicted memory for the selection (the same arguments as
    :func:`export`; ``to`` and the format settings change the memory it predicts).

    Returns:
        dict: the plan, as ``sluice plan --json`` prints it.
    """
    opts = _options(
        source=source,
        table=table,
        tables=tables,
        schema=schema,
        query=query,
        columns=columns,
        to=os.fspath(to) if to is not None else None,
        format=format,
        parallel=parallel,
        consistency=consistency,
        chunk_by=chunk_by,
        chunk_size=chunk_size,
        memory=memory,
        batch_size=batch_size,
        row_group_size=row_group_size,
        part_size=part_size,
        upload_concurrency=upload_concurrency,
        storage_option=storage_option,
        enable_row_security=enable_row_security,
        report_html=None if report_html is None else os.fspath(report_html),
        harm_budget=harm_budget,
        max_replica_lag=max_replica_lag,
        max_latency=max_latency,
        max_xmin_age=max_xmin_age,
        max_active=max_active,
        max_rate=max_rate,
        replica=replica,
        probe_sql=probe_sql,
        config=config,
    )
    return json.loads(_sluice.plan(**opts))
