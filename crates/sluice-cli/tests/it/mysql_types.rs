#![allow(clippy::unwrap_used)]
//! MariaDB type round trip: a table with every supported type, extremes, 4-byte UTF-8, zero
//! dates and a NULL row, exported to Parquet and CSV, read back and compared value by value with
//! what MariaDB itself says about the same rows (an oracle SQL expression per column). Plus the
//! zero-date policy (NULL + count, or an error in strict mode).
//!
//! Length: one case table per MariaDB type family with the expected value of each; the cases
//! and the comparison they share read best together.

use crate::common::{all_types_ddl, export, files, tempdir, with_report};
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use mysql_async::prelude::Queryable;
use sluice_testkit::mysql::TestDb;

/// How a Parquet value is compared with the oracle text.
#[derive(Clone, Copy, Debug)]
enum Pq {
    /// Arrow's display form equals the oracle text.
    Display,
    /// Both parse to the same f64.
    Float,
    /// Within f32 precision.
    Float32,
    /// Lowercase hex of the bytes (oracle: HEX()).
    Hex,
    /// Integer microseconds of a timestamp or duration.
    Micros,
}

pub(crate) struct Col {
    pub(crate) name: &'static str,
    ty: &'static str,
    /// SQL literals for rows 1..=5; row 6 is all NULL.
    values: [&'static str; 5],
    arrow: DataType,
    pq: Pq,
    /// Oracle SQL, `{c}` is the column.
    pub(crate) oracle: &'static str,
}

const CHAR: &str = "CAST({c} AS CHAR)";

pub(crate) fn columns() -> Vec<Col> {
    let c = |name, ty, values, arrow, pq, oracle| Col {
        name,
        ty,
        values,
        arrow,
        pq,
        oracle,
    };
    use DataType as D;
    vec![
        c(
            "c_tinyint",
            "tinyint",
            ["1", "-128", "127", "0", "-1"],
            D::Int8,
            Pq::Display,
            CHAR,
        ),
        c(
            "c_utinyint",
            "tinyint unsigned",
            ["0", "255", "1", "128", "7"],
            D::UInt8,
            Pq::Display,
            CHAR,
        ),
        c(
            "c_smallint",
            "smallint",
            ["-32768", "32767", "0", "1", "-1"],
            D::Int16,
            Pq::Display,
            CHAR,
        ),
        c(
            "c_usmallint",
            "smallint unsigned",
            ["65535", "0", "1", "2", "3"],
            D::UInt16,
            Pq::Display,
            CHAR,
        ),
        c(
            "c_mediumint",
            "mediumint",
            ["-8388608", "8388607", "0", "5", "-5"],
            D::Int32,
            Pq::Display,
            CHAR,
        ),
        c(
            "c_umediumint",
            "mediumint unsigned",
            ["16777215", "0", "1", "2", "3"],
            D::UInt32,
            Pq::Display,
            CHAR,
        ),
        c(
            "c_int",
            "int",
            ["-2147483648", "2147483647", "0", "42", "-42"],
            D::Int32,
            Pq::Display,
            CHAR,
        ),
        c(
            "c_uint",
            "int unsigned",
            ["4294967295", "0", "1", "2", "3"],
            D::UInt32,
            Pq::Display,
            CHAR,
        ),
        c(
            "c_bigint",
            "bigint",
            [
                "-9223372036854775808",
                "9223372036854775807",
                "0",
                "1",
                "-1",
            ],
            D::Int64,
            Pq::Display,
            CHAR,
        ),
        c(
            "c_ubigint",
            "bigint unsigned",
            ["18446744073709551615", "0", "9223372036854775808", "1", "2"],
            D::UInt64,
            Pq::Display,
            CHAR,
        ),
        c(
            "c_bool",
            "bool",
            ["0", "1", "2", "-1", "127"],
            D::Int8,
            Pq::Display,
            CHAR,
        ),
        c(
            "c_decimal",
            "decimal(12,2)",
            [
                "1234567890.12",
                "-0.01",
                "0",
                "9999999999.99",
                "-9999999999.99",
            ],
            D::Decimal128(12, 2),
            Pq::Display,
            CHAR,
        ),
        c(
            "c_decimal_wide",
            "decimal(65,30) unsigned",
            [
                "12345678901234567890123456789012345.123456789012345678901234567890",
                "0.000000000000000000000000000001",
                "0",
                "99999999999999999999999999999999999.999999999999999999999999999999",
                "1",
            ],
            D::Decimal256(65, 30),
            Pq::Display,
            CHAR,
        ),
        c(
            "c_float",
            "float",
            ["1.5", "-3.40282e38", "1.17549e-38", "0", "-0.1"],
            D::Float32,
            Pq::Float32,
            "CAST({c} AS DOUBLE)",
        ),
        c(
            "c_double",
            "double",
            ["0.1", "-1e300", "5e-324", "1.7976931348623157e308", "-2.5"],
            D::Float64,
            Pq::Float,
            CHAR,
        ),
        c(
            "c_bit1",
            "bit(1)",
            ["b'0'", "b'1'", "b'1'", "b'0'", "b'1'"],
            D::Boolean,
            Pq::Display,
            "CASE {c} WHEN 1 THEN 'true' WHEN 0 THEN 'false' END",
        ),
        c(
            "c_bit64",
            "bit(64)",
            [
                "b'1111111111111111111111111111111111111111111111111111111111111111'",
                "b'0'",
                "b'101'",
                "b'10000000'",
                "b'1'",
            ],
            D::UInt64,
            Pq::Display,
            "CAST({c} + 0 AS CHAR)",
        ),
        c(
            "c_year",
            "year",
            ["1901", "2155", "2024", "0", "1970"],
            D::UInt16,
            Pq::Display,
            "CAST({c} + 0 AS CHAR)",
        ),
        c(
            "c_date",
            "date",
            [
                "'2024-02-29'",
                "'1000-01-01'",
                "'9999-12-31'",
                "'0000-00-00'",
                "'1970-01-01'",
            ],
            D::Date32,
            Pq::Display,
            "IF({c} = '0000-00-00', NULL, DATE_FORMAT({c}, '%Y-%m-%d'))",
        ),
        c(
            "c_datetime",
            "datetime(6)",
            [
                "'2024-01-02 03:04:05.123456'",
                "'1000-01-01 00:00:00'",
                "'9999-12-31 23:59:59.999999'",
                "'0000-00-00 00:00:00'",
                "'1970-01-01 00:00:00.000001'",
            ],
            D::Timestamp(TimeUnit::Microsecond, None),
            Pq::Micros,
            "IF({c} = '0000-00-00', NULL, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {c}))",
        ),
        c(
            "c_timestamp",
            "timestamp(6) NULL",
            [
                "'2024-01-02 03:04:05.5'",
                "'1970-01-01 00:00:01'",
                "'2038-01-19 03:14:07.999999'",
                "'0000-00-00 00:00:00'",
                "'2000-02-29 12:00:00'",
            ],
            D::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            Pq::Micros,
            "IF({c} = '0000-00-00', NULL, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {c}))",
        ),
        c(
            "c_time",
            "time(6)",
            [
                "'-838:59:59'",
                "'838:59:59'",
                "'00:00:00'",
                "'-00:00:01.5'",
                "'100:00:00.000001'",
            ],
            D::Duration(TimeUnit::Microsecond),
            Pq::Micros,
            "CAST(TIME_TO_SEC({c}) * 1000000 AS SIGNED)",
        ),
        c(
            "c_char",
            "char(10)",
            ["'abc'", "''", "'ü'", "'😀'", "'x y'"],
            D::Utf8,
            Pq::Display,
            "{c}",
        ),
        c(
            "c_varchar",
            "varchar(100)",
            [
                "'it''s \"q\"'",
                "'😀𝄞 four-byte'",
                "''",
                "'line\\nbreak'",
                "'tab\\tback\\\\slash'",
            ],
            D::Utf8,
            Pq::Display,
            "{c}",
        ),
        c(
            "c_text",
            "mediumtext",
            ["REPEAT('é😀', 5000)", "'t'", "''", "'NULL'", "'ü'"],
            D::Utf8,
            Pq::Display,
            "{c}",
        ),
        c(
            "c_binary",
            "binary(4)",
            ["X'00010203'", "X'FFFFFFFF'", "X'00000000'", "'ab'", "X'7F'"],
            D::Binary,
            Pq::Hex,
            "HEX({c})",
        ),
        c(
            "c_varbinary",
            "varbinary(10)",
            ["X'00'", "X''", "X'DEADBEEF'", "'text'", "X'FF00FF'"],
            D::Binary,
            Pq::Hex,
            "HEX({c})",
        ),
        c(
            "c_blob",
            "longblob",
            ["REPEAT(X'00FF', 40000)", "X''", "X'01'", "'blob'", "X'80'"],
            D::Binary,
            Pq::Hex,
            "HEX({c})",
        ),
        c(
            "c_enum",
            "enum('a','b','c d')",
            ["'a'", "'c d'", "'b'", "'a'", "'b'"],
            D::Utf8,
            Pq::Display,
            "{c}",
        ),
        c(
            "c_set",
            "set('x','y','z')",
            ["'x,y'", "''", "'z'", "'x,y,z'", "'y'"],
            D::Utf8,
            Pq::Display,
            "{c}",
        ),
        c(
            "c_json",
            "json",
            [
                "'{\"a\": 1}'",
                "'[1, 2, \"😀\"]'",
                "'null'",
                "'\"s\"'",
                "'{}'",
            ],
            D::Utf8,
            Pq::Display,
            "{c}",
        ),
        c(
            "c_geom",
            "geometry",
            [
                "ST_GeomFromText('POINT(1 2)')",
                "ST_GeomFromText('LINESTRING(0 0, 1 1, 2 0)')",
                "ST_GeomFromText('POLYGON((0 0, 4 0, 4 4, 0 0))')",
                "ST_GeomFromText('POINT(10 20)', 4326)",
                "ST_GeomFromText('MULTIPOINT(1 1, 2 2)')",
            ],
            D::Binary,
            Pq::Hex,
            "HEX(ST_AsBinary({c}))",
        ),
        c(
            "c_inet6",
            "inet6",
            [
                "'::1'",
                "'2001:db8::1'",
                "'::ffff:1.2.3.4'",
                "'::'",
                "'fe80::1'",
            ],
            D::Utf8,
            Pq::Display,
            CHAR,
        ),
    ]
}

/// A database with table `all_types`: every type, extremes, zero dates and a NULL row (also
/// the source of the MySQL/MariaDB apply tests).
pub(crate) async fn setup() -> (TestDb, Vec<Col>) {
    let mut db = TestDb::new().await;
    let cols = columns();
    db.exec(&all_types_ddl(cols.iter().map(|c| (c.name, c.ty))))
        .await;
    // Zero dates need a permissive sql_mode; timestamps are written in UTC.
    db.exec("SET SESSION sql_mode = '', time_zone = '+00:00'")
        .await;
    for row in 0..5 {
        let vals: Vec<&str> = cols.iter().map(|c| c.values[row]).collect();
        db.exec(&format!(
            "INSERT INTO all_types VALUES ({}, {})",
            row + 1,
            vals.join(", ")
        ))
        .await;
    }
    let nulls = vec!["NULL"; cols.len()].join(", ");
    db.exec(&format!("INSERT INTO all_types VALUES (6, {nulls})"))
        .await;
    (db, cols)
}

/// Per row (by id), per column, the oracle's text (None for NULL).
async fn oracle(db: &mut TestDb, cols: &[Col]) -> Vec<Vec<Option<String>>> {
    oracle_of(&mut db.conn, "all_types", cols).await
}

/// [`oracle`] of table `table` (a qualified name may be given) on `conn`.
pub(crate) async fn oracle_of(
    conn: &mut mysql_async::Conn,
    table: &str,
    cols: &[Col],
) -> Vec<Vec<Option<String>>> {
    let exprs: Vec<String> = cols
        .iter()
        .map(|c| c.oracle.replace("{c}", c.name))
        .collect();
    let sql = format!("SELECT {} FROM {table} ORDER BY id", exprs.join(", "));
    let rows: Vec<mysql_async::Row> = conn.query(sql).await.unwrap();
    rows.into_iter()
        .map(|r| {
            r.unwrap()
                .into_iter()
                .map(|v| match v {
                    mysql_async::Value::NULL => None,
                    mysql_async::Value::Bytes(b) => Some(String::from_utf8(b).unwrap()),
                    other => Some(format!("{other:?}")),
                })
                .collect()
        })
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02X}")).collect()
}

fn cell(a: &ArrayRef, i: usize, kind: Pq) -> Option<String> {
    if a.is_null(i) {
        return None;
    }
    Some(match kind {
        Pq::Display => {
            arrow_cast::display::ArrayFormatter::try_new(a.as_ref(), &Default::default())
                .unwrap()
                .value(i)
                .to_string()
        }
        Pq::Float | Pq::Float32 => match a.data_type() {
            DataType::Float32 => (a.as_primitive::<Float32Type>().value(i) as f64).to_string(),
            _ => a.as_primitive::<Float64Type>().value(i).to_string(),
        },
        Pq::Hex => hex(a.as_binary::<i32>().value(i)),
        Pq::Micros => match a.data_type() {
            DataType::Duration(_) => a
                .as_primitive::<DurationMicrosecondType>()
                .value(i)
                .to_string(),
            _ => a
                .as_primitive::<TimestampMicrosecondType>()
                .value(i)
                .to_string(),
        },
    })
}

fn same(got: &Option<String>, want: &Option<String>, kind: Pq) -> bool {
    match (got, want, kind) {
        (Some(g), Some(w), Pq::Float) => g.parse::<f64>().unwrap() == w.parse::<f64>().unwrap(),
        (Some(g), Some(w), Pq::Float32) => {
            let (g, w) = (g.parse::<f64>().unwrap(), w.parse::<f64>().unwrap());
            g == w || ((g - w) / w).abs() < 1e-6
        }
        _ => got == want,
    }
}

fn concat(batches: &[RecordBatch]) -> RecordBatch {
    arrow_select::concat::concat_batches(&batches[0].schema(), batches).unwrap()
}

#[tokio::test]
async fn every_type_round_trips_through_parquet_and_csv() {
    let (mut db, cols) = setup().await;
    let want = oracle(&mut db, &cols).await;
    let out = tempdir();
    let report = out.path().join("report.json");
    let run = export(
        &db.url,
        &out.path().join("pq"),
        &with_report("--table all_types", &report),
    );
    run.ok();
    let batch = concat(&files::dataset_batches(
        &out.path().join(format!("pq/{}.all_types", db.name)),
    ));
    assert_eq!(batch.num_rows(), 6);
    let ids = batch.column(0).as_primitive::<Int32Type>();
    for (ci, col) in cols.iter().enumerate() {
        let a = batch.column(ci + 1);
        assert_eq!(a.data_type(), &col.arrow, "{}: Arrow type", col.name);
        for row in 0..6 {
            let id = ids.value(row) as usize;
            let got = cell(a, row, col.pq);
            let w = &want[id - 1][ci];
            assert!(
                same(&got, w, col.pq),
                "{} row {id}: exported {got:?}, MariaDB says {w:?}",
                col.name
            );
        }
    }
    // Extension types and the manifest's source types.
    let schema = batch.schema();
    let meta = |n: &str| schema.field_with_name(n).unwrap().metadata().clone();
    assert_eq!(meta("c_json")["ARROW:extension:name"], "arrow.json");
    assert_eq!(meta("c_geom")["ARROW:extension:name"], "geoarrow.wkb");
    let m = files::manifest(&out.path().join("pq"));
    let cols_json = m["datasets"][0]["columns"].as_array().unwrap();
    let ubig = cols_json.iter().find(|c| c["name"] == "c_ubigint").unwrap();
    assert_eq!(ubig["source_type"], "bigint(20) unsigned");
    let inet = cols_json.iter().find(|c| c["name"] == "c_inet6").unwrap();
    assert_eq!(inet["text_fallback"], true);
    assert_eq!(m["source"]["engine"], "mysql");
    assert!(
        m["source"]["server_version"]
            .as_str()
            .unwrap()
            .starts_with("MariaDB 10.")
    );

    // Zero dates and stripped SRIDs are counted in the report.
    let r = files::json(&report);
    let notes: Vec<String> = r["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    for col in ["c_date", "c_datetime", "c_timestamp"] {
        assert!(
            notes
                .iter()
                .any(|n| n.contains(&format!(".{col}: 1 zero or invalid date"))),
            "{col}: {notes:?}"
        );
    }
    assert!(
        notes
            .iter()
            .any(|n| n.contains("c_geom") && n.contains("SRID 4326: 1")),
        "{notes:?}"
    );
    assert!(
        r["text_fallback_columns"][0]
            .as_str()
            .unwrap()
            .contains("c_inet6")
    );

    // CSV: the same values as text.
    export(
        &db.url,
        &out.path().join("csv"),
        &["--table", "all_types", "--format", "csv"],
    )
    .ok();
    let text = std::fs::read_to_string(
        out.path()
            .join(format!("csv/{}.all_types/part-00000.csv", db.name)),
    )
    .unwrap();
    let (header, rows) = files::csv_rows(&text, b',', "");
    assert_eq!(header.len(), cols.len() + 1);
    assert_eq!(rows.len(), 6);
    let exact_csv = [
        "c_tinyint",
        "c_ubigint",
        "c_bigint",
        "c_decimal",
        "c_decimal_wide",
        "c_varchar",
        "c_char",
        "c_enum",
        "c_set",
        "c_json",
        "c_date",
        "c_year",
        "c_bit64",
    ];
    for row in &rows {
        let id: usize = row[0].as_deref().unwrap().parse().unwrap();
        for (ci, col) in cols.iter().enumerate() {
            if !exact_csv.contains(&col.name) {
                continue;
            }
            let w = &want[id - 1][ci];
            let got = &row[ci + 1];
            // CSV writes NULL and the empty string differently only by quoting; compare text.
            assert_eq!(
                got.clone().filter(|_| w.is_some()),
                w.clone(),
                "csv {} row {id}",
                col.name
            );
        }
    }
}

#[tokio::test]
async fn binary_and_text_protocols_agree() {
    let (db, cols) = setup().await;
    let out = tempdir();
    export(&db.url, &out.path().join("bin"), &["--table", "all_types"]).ok();
    let text_url = format!("{}?protocol=text", db.url);
    export(
        &text_url,
        &out.path().join("txt"),
        &["--table", "all_types"],
    )
    .ok();
    let a = concat(&files::dataset_batches(
        &out.path().join(format!("bin/{}.all_types", db.name)),
    ));
    let b = concat(&files::dataset_batches(
        &out.path().join(format!("txt/{}.all_types", db.name)),
    ));
    for (ci, col) in cols.iter().enumerate() {
        if col.name == "c_float" {
            // The text protocol prints FLOAT with 6 significant digits; binary is exact.
            continue;
        }
        assert_eq!(a.column(ci + 1), b.column(ci + 1), "{}", col.name);
    }
}

#[tokio::test]
async fn strict_mode_fails_on_a_zero_date_naming_the_column() {
    let mut db = TestDb::new().await;
    db.exec(
        "SET SESSION sql_mode = '';
         CREATE TABLE z (id int PRIMARY KEY, d date NOT NULL);
         INSERT INTO z VALUES (1, '2024-01-01'), (2, '0000-00-00');",
    )
    .await;
    let out = tempdir();
    let strict = format!("{}?zero_dates=error", db.url);
    let run = export(&strict, out.path(), &["--table", "z"]);
    run.refused(5, &["column \"d\"", "0000-00-00"]);
    assert!(!out.path().join("manifest.json").exists());
    // Without strict mode the NOT NULL column becomes nullable and the zero date NULL.
    let run = export(&db.url, &out.path().join("ok"), &["--table", "z"]);
    run.ok();
    let batch = concat(&files::dataset_batches(
        &out.path().join(format!("ok/{}.z", db.name)),
    ));
    let d = batch.column(1);
    assert_eq!(d.null_count(), 1);
    assert!(batch.schema().field(1).is_nullable());
}
