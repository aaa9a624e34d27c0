"""Type hints for sluice (the implementation and docstrings are in __init__.py)."""

import os
from typing import Any, Dict, Literal, Mapping, Optional, Sequence, Union

import pyarrow as pa

__version__: str

Size = Union[int, str]
PathLike = Union[str, os.PathLike[str]]
Consistency = Literal["snapshot", "chunk"]

class SluiceError(Exception):
    """Base class of every sluice error."""

    retryable: bool
    """Whether running the same call again can succeed (a dropped connection, a deadlock)."""
    kind: str
    """``config``, ``source``, ``destination``, ``data``, ``interrupted`` or ``internal``."""

class ConfigError(SluiceError):
    """The request is wrong (an option, the URL, an unknown table): fix the call."""

class SourceError(SluiceError):
    """The source database refused or failed."""

class DestinationError(SluiceError):
    """The output location refused or failed."""

class DataError(SluiceError):
    """A value cannot be represented in the output as asked."""

class Interrupted(SluiceError):
    """The run was stopped before it finished (its reader was closed early)."""

class InternalError(SluiceError):
    """A bug in sluice: please report it."""

def read_arrow(
    source: str,
    *,
    table: Optional[str] = None,
    query: Optional[str] = None,
    columns: Optional[Sequence[str]] = None,
    parallel: Optional[int] = None,
    consistency: Optional[Consistency] = None,
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
    """Read one table or query into a pyarrow.Table (parallel, one snapshot)."""

def read_batches(
    source: str,
    *,
    table: Optional[str] = None,
    query: Optional[str] = None,
    columns: Optional[Sequence[str]] = None,
    parallel: Optional[int] = None,
    consistency: Optional[Consistency] = None,
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
    """Stream one table or query as a pyarrow.RecordBatchReader, memory bounded by `memory`."""

def export(
    source: str,
    *,
    to: PathLike,
    table: Union[str, Sequence[str], None] = None,
    tables: Union[str, Sequence[str], None] = None,
    schema: Union[str, Sequence[str], None] = None,
    query: Optional[Mapping[str, str]] = None,
    columns: Union[str, Sequence[str], None] = None,
    format: Optional[Literal["parquet", "csv"]] = None,
    parallel: Optional[int] = None,
    consistency: Optional[Consistency] = None,
    chunk_by: Optional[str] = None,
    chunk_size: Optional[Size] = None,
    memory: Optional[Size] = None,
    batch_size: Optional[Size] = None,
    compression: Optional[Literal["zstd", "snappy", "none"]] = None,
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
    """Export to Parquet or CSV files (sluice export); returns the report."""

def plan(
    source: str,
    *,
    table: Union[str, Sequence[str], None] = None,
    tables: Union[str, Sequence[str], None] = None,
    schema: Union[str, Sequence[str], None] = None,
    query: Optional[Mapping[str, str]] = None,
    columns: Union[str, Sequence[str], None] = None,
    to: Optional[PathLike] = None,
    format: Optional[Literal["parquet", "csv"]] = None,
    parallel: Optional[int] = None,
    consistency: Optional[Consistency] = None,
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
    """What an export would do, without reading rows (sluice plan --json)."""
