"""Every type round-trips: ``read_arrow`` returns what the CLI's Parquet export holds for the
same table — the same Arrow types and the same values (NaN equal to NaN), NULLs in every
column and extremes included — on PostgreSQL, MariaDB and Firebird."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import sluice
from conftest import cli_parquet

# (type, five SQL literals); a sixth row is all NULL.
PG_TYPES = [
    ("int2", ["1", "-32768", "32767", "0", "-1"]),
    ("int4", ["42", "-2147483648", "2147483647", "0", "-1"]),
    ("int8", ["7", "-9223372036854775808", "9223372036854775807", "0", "-1"]),
    ("oid", ["0", "12345", "4294967295", "1", "2"]),
    ("float4", ["1.5", "'-Infinity'", "3.4028235e38", "'NaN'", "1e-45"]),
    ("float8", ["0.1", "'Infinity'", "-1e300", "'NaN'", "5e-324"]),
    ("numeric(38,10)", ["12345.6789", "-9999999999999999999999999999.9999999999", "0", "1e-10", "-1"]),
    ("numeric(10,0)", ["1", "-9999999999", "9999999999", "0", "42"]),
    ("numeric", ["1.5", "'NaN'", "123456789012345678901234567890.123", "0", "-0.000001"]),
    ("bool", ["true", "false", "true", "false", "true"]),
    ("text", ["'hello'", "''", "'ünïcödé ✓'", "'line\nbreak'", "repeat('x', 5000)"]),
    ("varchar(20)", ["'a'", "''", "'quote\"s'", "'comma,'", "'é'"]),
    ("char(3)", ["'ab'", "'abc'", "''", "'x'", "'é'"]),
    ("bytea", ["'\\x00ff'", "''", "'\\xdeadbeef'", "'\\x00'", "decode(repeat('ab', 100), 'hex')"]),
    ("date", ["'2024-02-29'", "'0001-01-01'", "'9999-12-31'", "'infinity'", "'1970-01-01'"]),
    ("time", ["'00:00'", "'23:59:59.999999'", "'12:34:56.789'", "'24:00'", "'01:02:03'"]),
    ("timetz", ["'00:00+00'", "'23:59:59.999999-12'", "'12:34:56+05:30'", "'01:00-01'", "'10:00+14'"]),
    ("timestamp", ["'2024-02-29 12:34:56.789012'", "'1900-01-01'", "'infinity'", "'-infinity'", "'2262-04-11 23:47:16'"]),
    ("timestamptz", ["'2024-02-29 12:34:56.789012+02'", "'1900-01-01 00:00+00'", "'infinity'", "'-infinity'", "'1970-01-01 00:00+00'"]),
    ("interval", ["'1 year 2 months 3 days 04:05:06.789'", "'-1 day'", "'0'", "'1000000 hours'", "'1 mon -1 day'"]),
    ("uuid", ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'00000000-0000-0000-0000-000000000000'", "gen_random_uuid()", "'ffffffff-ffff-ffff-ffff-ffffffffffff'", "'12345678-1234-1234-1234-123456789abc'"]),
    ("json", ["'{\"a\": 1}'", "'[]'", "'null'", "'\"text\"'", "'{\"nested\": {\"x\": [1, 2]}}'"]),
    ("jsonb", ["'{\"a\": 1}'", "'[]'", "'null'", "'\"text\"'", "'{\"b\": [true, null]}'"]),
    ("inet", ["'192.168.0.1'", "'::1'", "'10.0.0.0/8'", "'2001:db8::/32'", "'0.0.0.0'"]),
    ("cidr", ["'192.168.0.0/24'", "'::/0'", "'10.0.0.0/8'", "'2001:db8::/32'", "'0.0.0.0/0'"]),
    ("macaddr", ["'08:00:2b:01:02:03'", "'00:00:00:00:00:00'", "'ff:ff:ff:ff:ff:ff'", "'01:23:45:67:89:ab'", "'aa:bb:cc:dd:ee:ff'"]),
    ("int4[]", ["'{1,2,3}'", "'{}'", "'{NULL,1}'", "'{-2147483648}'", "'{0}'"]),
    ("text[]", ["'{a,b}'", "'{}'", "'{NULL,\"\"}'", "'{\"with,comma\"}'", "'{é}'"]),
    ("bit(4)", ["B'1010'", "B'0000'", "B'1111'", "B'0001'", "B'1000'"]),
    ("varbit", ["B'1'", "B''", "B'101010101'", "B'0'", "B'11'"]),
    ("money", ["'12.34'", "'-92233720368547758.08'", "'0'", "'1'", "'-1'"]),
    ("xml", ["'<a>1</a>'", "'<b/>'", "'text'", "'<c x=\"1\"/>'", "'<d></d>'"]),
    ("point", ["'(1,2)'", "'(0,0)'", "'(-1.5,2.5)'", "'(1e10,1)'", "'(3,4)'"]),
    ("mood", ["'happy'", "'sad'", "'ok'", "'happy'", "'sad'"]),
    ("posint", ["1", "2147483647", "5", "6", "7"]),
]


def assert_same(got: pa.Table, want: pa.Table, key: str) -> None:
    """Same columns, types and values (rows matched by `key`; NaN equals NaN)."""
    got = got.sort_by(key)
    want = want.sort_by(key)
    assert got.column_names == want.column_names
    assert got.num_rows == want.num_rows
    for name in want.column_names:
        g, w = got.column(name), want.column(name)
        assert g.type == w.type, f"{name}: {g.type} != {w.type}"
        if pa.types.is_floating(w.type):
            np.testing.assert_array_equal(
                g.to_numpy(zero_copy_only=False), w.to_numpy(zero_copy_only=False), err_msg=name
            )
        else:
            assert g.equals(w), f"{name}: {g} != {w}"
        # Field metadata (extension types such as arrow.uuid and arrow.json) is kept too.
        assert got.schema.field(name).metadata == want.schema.field(name).metadata, name


def pg_all_types(pg) -> list:
    """`all_types`: a column cN per type of PG_TYPES, five rows of its literals and a sixth of
    NULLs (ids 1–6); returns the (column, type) pairs."""
    pg.exec("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy'); CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
    cols = [(f"c{i}", ty) for i, (ty, _) in enumerate(PG_TYPES)]
    pg.exec(f"CREATE TABLE all_types (id int PRIMARY KEY, {', '.join(f'{n} {t}' for n, t in cols)})")
    for row in range(5):
        values = ", ".join(f"({vals[row]})::{ty}" for ty, vals in PG_TYPES)
        pg.exec(f"INSERT INTO all_types VALUES ({row + 1}, {values})")
    pg.exec("INSERT INTO all_types (id) VALUES (6)")
    return cols


def test_postgres_every_type(pg, sluice_bin, tmp_path):
    pg_all_types(pg)

    want = cli_parquet(sluice_bin, pg.url, "all_types", tmp_path / "out")
    got = sluice.read_arrow(pg.url, table="all_types")
    assert got.num_rows == 6
    assert_same(got, want, "id")
    # The stream gives the same rows.
    streamed = sluice.read_batches(pg.url, table="all_types").read_all()
    assert_same(streamed, want, "id")


def test_postgres_query_and_pandas(pg):
    pg.exec("CREATE TABLE t (id int PRIMARY KEY, name text); INSERT INTO t SELECT g, 'n' || g FROM generate_series(1, 1000) g")
    t = sluice.read_arrow(pg.url, query="SELECT id, name FROM t WHERE id % 2 = 0")
    assert t.num_rows == 500
    df = t.to_pandas()
    assert df["id"].sum() == sum(range(2, 1001, 2))
    assert set(df["name"].head(3)) <= {f"n{i}" for i in range(2, 1001, 2)}


def test_postgres_parts_come_back_in_key_order(pg):
    pg.exec(
        "CREATE TABLE k (id bigint PRIMARY KEY, pad text);"
        "INSERT INTO k SELECT g, repeat('p', 200) FROM generate_series(1, 50000) g; ANALYZE k"
    )
    t = sluice.read_arrow(pg.url, table="k", parallel=3, chunk_by="key", chunk_size="1MB")
    ids = t.column("id").to_pylist()
    assert ids == list(range(1, 50001)), "parts of a key-chunked table come back in key order"


MY_TYPES = [
    ("tinyint", ["1", "-128", "127", "0", "-1"]),
    ("smallint unsigned", ["1", "0", "65535", "2", "3"]),
    ("int", ["42", "-2147483648", "2147483647", "0", "-1"]),
    ("bigint", ["7", "-9223372036854775808", "9223372036854775807", "0", "-1"]),
    ("bigint unsigned", ["0", "18446744073709551615", "1", "2", "3"]),
    ("float", ["1.5", "-3.4e38", "0", "1e-30", "-1"]),
    ("double", ["0.1", "-1e300", "5e-324", "0", "1"]),
    ("decimal(38,10)", ["12345.6789", "-9999999999999999999999999999.9999999999", "0", "0.0000000001", "-1"]),
    ("decimal(65,0)", ["1", "-99999999999999999999999999999999999999999999999999999999999999999", "0", "42", "-1"]),
    ("bit(8)", ["b'10101010'", "b'0'", "b'11111111'", "b'1'", "b'10'"]),
    ("char(3)", ["'ab'", "'abc'", "''", "'x'", "'é'"]),
    ("varchar(50)", ["'hello'", "''", "'ünïcödé ✓'", "'a,b'", "'q\"'"]),
    ("text", ["'t'", "''", "REPEAT('x', 5000)", "'line\nbreak'", "'é'"]),
    ("binary(4)", ["x'00ff0000'", "x'00000000'", "x'deadbeef'", "x'01'", "x'ff'"]),
    ("varbinary(10)", ["x'00ff'", "x''", "x'deadbeef'", "x'00'", "x'ab'"]),
    ("blob", ["x'00ff'", "x''", "REPEAT(x'ab', 1000)", "x'00'", "x'01'"]),
    ("date", ["'2024-02-29'", "'1000-01-01'", "'9999-12-31'", "'1970-01-01'", "'2000-01-01'"]),
    ("time(6)", ["'00:00:00'", "'838:59:59'", "'-838:59:59'", "'12:34:56.789012'", "'01:02:03'"]),
    ("datetime(6)", ["'2024-02-29 12:34:56.789012'", "'1000-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'", "'1970-01-01'", "'2000-01-01'"]),
    ("timestamp(3)", ["'2024-02-29 12:34:56.789'", "'1970-01-02 00:00:00'", "'2038-01-19 03:14:07.999'", "'2000-01-01'", "'2001-01-01'"]),
    ("year", ["2024", "1901", "2155", "2000", "1999"]),
    ("enum('a','b','c')", ["'a'", "'b'", "'c'", "'a'", "'b'"]),
    ("set('x','y','z')", ["'x'", "''", "'x,y,z'", "'y'", "'z,x'"]),
    ("json", ["'{\"a\": 1}'", "'[]'", "'null'", "'\"text\"'", "'{\"n\": [1, 2]}'"]),
    ("boolean", ["true", "false", "true", "false", "true"]),
]


def test_mariadb_every_type(my, sluice_bin, tmp_path):
    cols = [(f"c{i}", ty) for i, (ty, _) in enumerate(MY_TYPES)]
    my.exec("SET SESSION time_zone = '+00:00'")
    my.exec(f"CREATE TABLE all_types (id int PRIMARY KEY, {', '.join(f'{n} {t} NULL' for n, t in cols)}) ENGINE=InnoDB")
    for row in range(5):
        values = ", ".join(vals[row] for _, vals in MY_TYPES)
        my.exec(f"INSERT INTO all_types VALUES ({row + 1}, {values})")
    my.exec("INSERT INTO all_types (id) VALUES (6)")

    want = cli_parquet(sluice_bin, my.url, "all_types", tmp_path / "out")
    got = sluice.read_arrow(my.url, table="all_types")
    assert got.num_rows == 6
    assert_same(got, want, "id")


FB_TYPES = [
    ("SMALLINT", ["1", "-32768", "32767", "0", "-1"]),
    ("INTEGER", ["42", "-2147483648", "2147483647", "0", "-1"]),
    ("BIGINT", ["7", "-9223372036854775808", "9223372036854775807", "0", "-1"]),
    ("INT128", ["1", "-99999999999999999999999999999999999999", "99999999999999999999999999999999999999", "0", "-1"]),
    ("FLOAT", ["1.5", "-3.4e38", "0", "1e-30", "-1"]),
    ("DOUBLE PRECISION", ["0.1", "-1e300", "5e-324", "0", "1"]),
    ("NUMERIC(18,4)", ["12345.6789", "-99999999999999.9999", "0", "0.0001", "-1"]),
    ("DECIMAL(38,10)", ["1.5", "-9999999999999999999999999999.9999999999", "0", "0.0000000001", "-1"]),
    ("DECFLOAT(16)", ["1.5", "-1E300", "0", "123456789012345", "-1"]),
    ("BOOLEAN", ["TRUE", "FALSE", "TRUE", "FALSE", "TRUE"]),
    ("CHAR(3)", ["'ab'", "'abc'", "''", "'x'", "'é'"]),
    ("VARCHAR(50)", ["'hello'", "''", "'ünïcödé ✓'", "'a,b'", "'q\"'"]),
    ("VARCHAR(8) CHARACTER SET OCTETS", ["x'00FF'", "x''", "x'DEADBEEF'", "x'00'", "x'AB'"]),
    ("BLOB SUB_TYPE TEXT", ["'t'", "''", "'ünï'", "'line'", "'é'"]),
    ("BLOB SUB_TYPE BINARY", ["x'00FF'", "x''", "x'DEADBEEF'", "x'00'", "x'01'"]),
    ("DATE", ["'2024-02-29'", "'0001-01-01'", "'9999-12-31'", "'1970-01-01'", "'2000-01-01'"]),
    ("TIME", ["'00:00:00'", "'23:59:59.9999'", "'12:34:56.789'", "'01:02:03'", "'10:00'"]),
    ("TIMESTAMP", ["'2024-02-29 12:34:56.7890'", "'0001-01-01 00:00:00'", "'9999-12-31 23:59:59.9999'", "'1970-01-01'", "'2000-01-01'"]),
    ("TIMESTAMP WITH TIME ZONE", ["'2024-02-29 12:34:56.7890 +02:00'", "'1970-01-01 00:00:00 UTC'", "'2000-01-01 10:00 -05:00'", "'2020-06-01 00:00 Europe/Berlin'", "'2001-01-01 UTC'"]),
    ("TIME WITH TIME ZONE", ["'00:00:00 UTC'", "'23:59:59 +14:00'", "'12:34:56 -05:00'", "'01:02:03 UTC'", "'10:00 +01:00'"]),
]


def test_firebird_every_type(fb, sluice_bin, tmp_path):
    cols = [(f"C{i}", ty) for i, (ty, _) in enumerate(FB_TYPES)]
    fb.exec(f"CREATE TABLE ALL_TYPES (ID INTEGER NOT NULL PRIMARY KEY, {', '.join(f'{n} {t}' for n, t in cols)})")
    for row in range(5):
        values = ", ".join(vals[row] for _, vals in FB_TYPES)
        fb.exec(f"INSERT INTO ALL_TYPES VALUES ({row + 1}, {values})")
    fb.exec("INSERT INTO ALL_TYPES (ID) VALUES (6)")

    want = cli_parquet(sluice_bin, fb.url, "ALL_TYPES", tmp_path / "out")
    got = sluice.read_arrow(fb.url, table="ALL_TYPES", parallel=2)
    assert got.num_rows == 6
    assert_same(got, want, want.column_names[0])
