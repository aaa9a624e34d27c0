"""``export`` and ``plan`` are the CLI's, returning its report and plan as dicts."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

import sluice


def test_export_writes_what_the_cli_writes_and_returns_the_report(pg, tmp_path):
    pg.exec(
        "CREATE SCHEMA sales; CREATE TABLE sales.a (id int PRIMARY KEY, v text);"
        "CREATE TABLE sales.b (id int PRIMARY KEY); CREATE TABLE public.other (id int);"
        "INSERT INTO sales.a SELECT g, 'v' || g FROM generate_series(1, 1000) g;"
        "INSERT INTO sales.b SELECT generate_series(1, 10)"
    )
    out = tmp_path / "out"
    report = sluice.export(
        pg.url, to=out, tables=r"sales\..*", format="parquet", report_json=tmp_path / "r.json"
    )
    assert isinstance(report, dict)
    assert report["rows"] == 1010
    assert json.loads((tmp_path / "r.json").read_text()) == report
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(d["name"] for d in manifest["datasets"]) == ["sales.a", "sales.b"]
    assert pq.read_table(out / "sales.a").num_rows == 1000
    # A finished output is refused, as the CLI refuses it, unless overwrite (or resume).
    with pytest.raises(sluice.ConfigError, match="overwrite") as e:
        sluice.export(pg.url, to=out, tables=r"sales\..*", format="csv")
    assert e.value.retryable is False
    done = sluice.export(pg.url, to=out, tables=r"sales\..*", resume=True)
    assert done["already_complete"] is True
    again = sluice.export(pg.url, to=out, tables=r"sales\..*", overwrite=True, format="csv")
    assert again["rows"] == 1010
    assert (out / "sales.a" / "part-00000.csv").exists()


def test_parquet_encodings_keyword_reaches_the_writer(pg, tmp_path):
    pg.exec(
        "CREATE TABLE enc (id bigint PRIMARY KEY, v text);"
        "INSERT INTO enc SELECT g, 'v' || g FROM generate_series(1, 5000) g"
    )

    def encodings(out):
        meta = pq.ParquetFile(next((out / "public.enc").glob("*.parquet"))).metadata
        columns = meta.row_group(0)
        return {columns.column(i).path_in_schema: set(columns.column(i).encodings)
                for i in range(columns.num_columns)}

    sluice.export(pg.url, to=tmp_path / "plain", table="enc")
    sluice.export(pg.url, to=tmp_path / "delta", table="enc", parquet_encodings="delta")
    assert "DELTA_BINARY_PACKED" not in encodings(tmp_path / "plain")["id"]
    assert "DELTA_BINARY_PACKED" in encodings(tmp_path / "delta")["id"]
    assert "DELTA_BINARY_PACKED" not in encodings(tmp_path / "delta")["v"]
    assert pq.read_table(tmp_path / "delta" / "public.enc").num_rows == 5000
    with pytest.raises(sluice.ConfigError, match="parquet-encodings"):
        sluice.export(pg.url, to=tmp_path / "csv", table="enc", format="csv",
                      parquet_encodings="delta")


def test_plan_is_the_cli_plan(pg):
    pg.exec(
        "CREATE SCHEMA sales; CREATE TABLE sales.a (id int PRIMARY KEY);"
        "INSERT INTO sales.a SELECT generate_series(1, 100)"
    )
    plan = sluice.plan(pg.url, schema="sales")
    assert isinstance(plan, dict)
    text = json.dumps(plan)
    assert "sales.a" in text
    assert "s3cret" not in text


def test_yaml_config_is_the_cli_file(pg, tmp_path):
    pg.exec("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 100)")
    config = tmp_path / "sluice.yaml"
    config.write_text("table: t\nparallel: 2\nchunk_by: key\n")
    assert sluice.read_arrow(pg.url, config=config).num_rows == 100
    # Keywords win over the file, as flags do: a bad keyword is refused over a good file value.
    with pytest.raises(sluice.ConfigError, match="chunk-by"):
        sluice.read_arrow(pg.url, config=config, chunk_by="rows")
    config.write_text("table: t\nbogus_key: 1\n")
    with pytest.raises(sluice.ConfigError, match="bogus_key"):
        sluice.read_arrow(pg.url, config=config)


def test_columns_pick_a_tables_columns_by_exact_name(pg, tmp_path):
    pg.exec(
        'CREATE TABLE people (id int PRIMARY KEY, "Name" text, secret text, amount int);'
        "INSERT INTO people SELECT g, 'n' || g, 'pw', g FROM generate_series(1, 100) g"
    )
    t = sluice.read_arrow(pg.url, table="people", columns=["amount", "Name", "id"])
    assert t.column_names == ["id", "Name", "amount"]
    assert t.num_rows == 100
    assert sorted(t.column("amount").to_pylist()) == [r[0] for r in pg.rows("SELECT amount FROM people ORDER BY 1")]
    with pytest.raises(sluice.ConfigError, match="no column"):
        sluice.read_arrow(pg.url, table="people", columns=["name"])  # exact: "Name" only
    with pytest.raises(sluice.ConfigError, match="list of column names"):
        sluice.read_arrow(pg.url, query="SELECT 1", columns=["id"])
    out = tmp_path / "out"
    sluice.export(pg.url, to=out, table="people", columns="people:id,secret")
    assert pq.read_table(out / "public.people").column_names == ["id", "secret"]
