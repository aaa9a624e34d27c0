"""Source columns → an Arrow schema, and driver rows → Arrow tables, for the Python strategies.

Every Python strategy converts the same way and writes Parquet with the same settings as
sluice's defaults (zstd level 1), so they differ only in how they read.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

PARQUET_OPTIONS = {"compression": "zstd", "compression_level": 1}

_PG_SIMPLE = {
    "int2": pa.int16(),
    "int4": pa.int32(),
    "int8": pa.int64(),
    "float4": pa.float32(),
    "float8": pa.float64(),
    "bool": pa.bool_(),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "timestamp": pa.timestamp("us"),
    "date": pa.date32(),
}


def pg_schema(conn, table: str) -> pa.Schema:
    """Arrow schema of a PostgreSQL table (psycopg connection); unknown types become text."""
    rows = conn.execute(
        "SELECT a.attname, t.typname, a.atttypmod FROM pg_attribute a "
        "JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (table,),
    ).fetchall()
    fields = []
    for name, typ, typmod in rows:
        if typ == "numeric" and typmod >= 4:
            precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
            fields.append(pa.field(name, pa.decimal128(precision, scale)))
        else:
            fields.append(pa.field(name, _PG_SIMPLE.get(typ, pa.string())))
    return pa.schema(fields)


_MY_SIMPLE = {
    "tinyint": pa.int8(),
    "smallint": pa.int16(),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "datetime": pa.timestamp("us", tz="UTC"),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
}


def mysql_schema(conn, table: str) -> pa.Schema:
    """Arrow schema of a MariaDB/MySQL table (DB-API connection)."""
    with conn.cursor() as c:
        c.execute(
            "SELECT column_name, data_type, column_type, numeric_precision, numeric_scale "
            "FROM information_schema.columns WHERE table_schema = database() AND table_name = %s "
            "ORDER BY ordinal_position",
            (table,),
        )
        rows = c.fetchall()
    fields = []
    for name, typ, coltype, precision, scale in rows:
        if coltype.startswith("tinyint(1)"):
            fields.append(pa.field(name, pa.bool_()))
        elif typ == "decimal":
            fields.append(pa.field(name, pa.decimal128(int(precision), int(scale))))
        else:
            fields.append(pa.field(name, _MY_SIMPLE.get(typ, pa.string())))
    return pa.schema(fields)


def to_table(rows: Sequence[Sequence], schema: pa.Schema) -> pa.Table:
    """Rows (tuples) → an Arrow table of `schema`: the classic transpose, column by column."""
    columns = list(zip(*rows)) if rows else [[] for _ in schema]
    arrays = []
    for values, field in zip(columns, schema):
        if pa.types.is_boolean(field.type):
            values = [None if v is None else bool(v) for v in values]
        arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


class PartWriter:
    """One Parquet file written batch by batch (one row group per batch)."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.schema = schema
        self.writer = pq.ParquetWriter(path, schema, **PARQUET_OPTIONS)

    def write_rows(self, rows: Sequence[Sequence]) -> None:
        """Append rows."""
        if rows:
            self.writer.write_table(to_table(rows, self.schema))

    def close(self) -> None:
        """Finish the file."""
        self.writer.close()
