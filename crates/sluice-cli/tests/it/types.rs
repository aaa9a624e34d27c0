#![allow(clippy::unwrap_used, clippy::needless_range_loop)]
//! Type round trip: a table with every supported type, NULLs in every column, and extremes,
//! exported to Parquet and CSV, read back, and compared value by value with what PostgreSQL
//! says about the same rows (oracle SQL per column).
//!
//! Length: one case table per PostgreSQL type family with the oracle SQL for each column; the
//! cases and the comparison they share read best together.

use crate::common::*;
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;

/// How a Parquet value is compared.
#[derive(Clone, Copy)]
enum Pq {
    /// Arrow's display form equals the oracle text.
    Display,
    /// Both parse to the same f64 (NaN equals NaN).
    Float,
    /// Lowercase hex of the bytes.
    Hex,
    /// Days since 1970 (or infinity).
    Days,
    /// Integer microseconds (or infinity).
    Micros,
    /// `months days microseconds` of the interval struct.
    Interval,
    /// The list as compact JSON.
    Json,
}

/// How a CSV field is compared.
#[derive(Clone, Copy)]
enum Csv {
    Exact,
    Float,
}

pub(crate) struct Col {
    pub(crate) name: &'static str,
    pub(crate) ty: &'static str,
    /// SQL literals for rows 1..=5; row 6 is all NULL.
    values: [&'static str; 5],
    pq: Pq,
    pq_oracle: &'static str,
    csv: Csv,
    csv_oracle: &'static str,
}

const TEXT: &str = "{c}::text";
const TS_MICROS: &str = "CASE WHEN isfinite({c}) THEN (extract(epoch FROM {c}) * 1000000)::numeric(30,0)::text ELSE {c}::text END";

pub(crate) fn columns() -> Vec<Col> {
    let c = |name, ty, values, pq, pq_oracle, csv, csv_oracle| Col {
        name,
        ty,
        values,
        pq,
        pq_oracle,
        csv,
        csv_oracle,
    };
    vec![
        c(
            "c_int2",
            "int2",
            ["1", "-32768", "32767", "0", "-1"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_int4",
            "int4",
            ["42", "-2147483648", "2147483647", "0", "-1"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_int8",
            "int8",
            [
                "7",
                "-9223372036854775808",
                "9223372036854775807",
                "0",
                "-1",
            ],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_oid",
            "oid",
            ["0", "12345", "4294967295", "1", "2"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_float4",
            "float4",
            ["1.5", "'-Infinity'", "3.4028235e38", "'NaN'", "1e-45"],
            Pq::Float,
            TEXT,
            Csv::Float,
            TEXT,
        ),
        c(
            "c_float8",
            "float8",
            ["0.1", "'Infinity'", "-1e300", "'NaN'", "5e-324"],
            Pq::Float,
            TEXT,
            Csv::Float,
            TEXT,
        ),
        c(
            "c_numeric",
            "numeric(38,10)",
            [
                "12345.6789",
                "-9999999999999999999999999999.9999999999",
                "9999999999999999999999999999.9999999999",
                "0",
                "-0.0000000001",
            ],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_numeric_wide",
            "numeric(60,5)",
            [
                "1.5",
                "-1234567890123456789012345678901234567890123456789012345.12345",
                "0.00001",
                "0",
                "7",
            ],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_numeric_neg_scale",
            "numeric(5,-2)",
            ["12300", "-9999900", "100", "0", "400"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_numeric_free",
            "numeric",
            ["3.14159", "1e100", "-0.000000001", "'NaN'", "'Infinity'"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_money",
            "money",
            [
                "12.34",
                "-92233720368547758.08",
                "92233720368547758.07",
                "0",
                "-1",
            ],
            Pq::Display,
            "{c}::numeric::text",
            Csv::Exact,
            "{c}::numeric::text",
        ),
        c(
            "c_bool",
            "bool",
            ["true", "false", "true", "false", "true"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_text",
            "text",
            [
                "'hello'",
                "''",
                "'multi-byte ✓ ü 日本語 🎉'",
                "E'quote \" comma , newline \\n tab \\t cr \\r'",
                "'NULL'",
            ],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_varchar",
            "varchar(20)",
            ["'a'", "''", "'ü'", "'x y'", "' lead'"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_bpchar",
            "char(5)",
            ["'ab'", "''", "'abcde'", "'ü'", "' '"],
            Pq::Display,
            "CASE WHEN {c} IS NOT NULL THEN format('%s', {c}) END",
            Csv::Exact,
            "CASE WHEN {c} IS NOT NULL THEN format('%s', {c}) END",
        ),
        c(
            "c_name",
            "name",
            ["'n1'", "'pg_class'", "'ü'", "'x'", "'y'"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_citext",
            "citext",
            ["'MiXeD'", "''", "'ü'", "'x'", "'Y'"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_bytea",
            "bytea",
            [
                "'\\x00ff'",
                "''",
                "decode(repeat('0123456789abcdef', 655360), 'hex')",
                "'\\x0a0d'",
                "'\\x22'",
            ],
            Pq::Hex,
            "encode({c}, 'hex')",
            Csv::Exact,
            "'\\x' || encode({c}, 'hex')",
        ),
        c(
            "c_uuid",
            "uuid",
            [
                "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
                "'00000000-0000-0000-0000-000000000000'",
                "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
                "gen_random_uuid()",
                "'123e4567-e89b-12d3-a456-426614174000'",
            ],
            Pq::Hex,
            "replace({c}::text, '-', '')",
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_date",
            "date",
            [
                "'2024-02-29'",
                "'1900-01-01'",
                "'2200-12-31'",
                "'infinity'",
                "'-infinity'",
            ],
            Pq::Days,
            "CASE WHEN isfinite({c}) THEN ({c} - date '1970-01-01')::text ELSE {c}::text END",
            Csv::Exact,
            "CASE WHEN isfinite({c}) THEN to_char({c}, 'YYYY-MM-DD') ELSE {c}::text END",
        ),
        c(
            "c_time",
            "time",
            [
                "'13:45:10.123456'",
                "'00:00:00'",
                "'23:59:59.999999'",
                "'24:00:00'",
                "'00:00:00.5'",
            ],
            Pq::Micros,
            // 24:00:00 is past the end of Arrow's time of day: it is written as the last
            // microsecond before midnight (and counted in the report).
            "(CASE WHEN {c} = '24:00:00' THEN 86399999999 \
              ELSE (extract(epoch FROM {c}) * 1000000)::bigint END)::text",
            Csv::Exact,
            "CASE WHEN {c} = '24:00:00' THEN '23:59:59.999999' \
             ELSE rtrim(rtrim(to_char({c}, 'HH24:MI:SS.US'), '0'), '.') END",
        ),
        c(
            "c_timetz",
            "timetz",
            [
                "'13:45:00+02'",
                "'00:00:00-12:30'",
                "'23:59:59.999999+14'",
                "'12:00:00+00'",
                "'01:02:03.5-01'",
            ],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_ts",
            "timestamp",
            [
                "'2024-01-01 10:00:00'",
                "'1900-01-01 00:00:00.000001'",
                "'2200-06-01 12:00:00'",
                "'infinity'",
                "'-infinity'",
            ],
            Pq::Micros,
            TS_MICROS,
            Csv::Exact,
            "CASE WHEN isfinite({c}) THEN rtrim(rtrim(to_char({c}, 'YYYY-MM-DD HH24:MI:SS.US'), '0'), '.') ELSE {c}::text END",
        ),
        c(
            "c_tstz",
            "timestamptz",
            [
                "'2024-01-01 10:00:00+02'",
                "'1900-01-01 00:00:00.000001+00'",
                "'2200-06-01 12:00:00-05'",
                "'infinity'",
                "'-infinity'",
            ],
            Pq::Micros,
            TS_MICROS,
            Csv::Exact,
            "CASE WHEN isfinite({c}) THEN rtrim(rtrim(to_char({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), '0'), '.') || 'Z' ELSE {c}::text END",
        ),
        c(
            "c_interval",
            "interval",
            [
                "'1 year 2 months 3 days 04:05:06.789'",
                "'-1 months -2 days -03:00:00'",
                "'0'",
                "'1000000 hours'",
                "'-178000000 years'",
            ],
            Pq::Interval,
            "(extract(year FROM {c}) * 12 + extract(month FROM {c}))::text || ' ' || extract(day FROM {c})::text || ' ' || (extract(hour FROM {c}) * 3600000000 + extract(minute FROM {c}) * 60000000 + extract(microseconds FROM {c}))::bigint::text",
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_json",
            "json",
            [
                "'{\"a\": 1}'",
                "'[]'",
                "'\"x\"'",
                "'null'",
                "'{\"ü\": [1.5, true]}'",
            ],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_jsonb",
            "jsonb",
            ["'{\"b\": [1, 2]}'", "'{}'", "'\"✓\"'", "'null'", "'[1e3]'"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_enum",
            "mood",
            ["'happy'", "'sad'", "'ok'", "'happy'", "'sad'"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_domain",
            "posint",
            ["1", "2", "2147483647", "3", "4"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_domain_num",
            "price",
            ["1.5", "99999999.99", "0.01", "0", "2"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_int_arr",
            "int4[]",
            [
                "'{1,2,NULL}'",
                "'{}'",
                "'{-2147483648,2147483647}'",
                "'{NULL}'",
                "'{5}'",
            ],
            Pq::Json,
            "array_to_json({c})::text",
            Csv::Exact,
            "array_to_json({c})::text",
        ),
        c(
            "c_text_arr",
            "text[]",
            [
                "'{\"a\",\"b,c\",\"q\\\"uote\"}'",
                "'{}'",
                "'{NULL,\"ü\"}'",
                "'{\"\"}'",
                "'{x}'",
            ],
            Pq::Json,
            "array_to_json({c})::text",
            Csv::Exact,
            "array_to_json({c})::text",
        ),
        c(
            "c_num_arr",
            "numeric(6,2)[]",
            ["'{1.50,-2}'", "'{}'", "'{9999.99}'", "'{NULL,0}'", "'{3}'"],
            Pq::Json,
            "array_to_json({c})::text",
            Csv::Exact,
            "array_to_json({c})::text",
        ),
        c(
            "c_inet_arr",
            "inet[]",
            [
                "'{192.168.1.1/24,::1}'",
                "'{}'",
                "'{10.0.0.1}'",
                "'{NULL}'",
                "'{fe80::1}'",
            ],
            Pq::Json,
            "array_to_json({c}::text[])::text",
            Csv::Exact,
            "array_to_json({c}::text[])::text",
        ),
        c(
            "c_inet",
            "inet",
            [
                "'192.168.1.1/24'",
                "'::1'",
                "'255.255.255.255'",
                "'10.0.0.1'",
                "'fe80::1/64'",
            ],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_cidr",
            "cidr",
            [
                "'10.0.0.0/8'",
                "'::/0'",
                "'192.168.0.0/16'",
                "'10.1.0.0/16'",
                "'2001:db8::/32'",
            ],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_macaddr",
            "macaddr",
            [
                "'08:00:2b:01:02:03'",
                "'00:00:00:00:00:00'",
                "'ff:ff:ff:ff:ff:ff'",
                "'01:02:03:04:05:06'",
                "'0a:0b:0c:0d:0e:0f'",
            ],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_point",
            "point",
            ["'(1,2)'", "'(-1.5,0)'", "'(0,0)'", "'(1e300,1)'", "'(3,4)'"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
        c(
            "c_range",
            "int4range",
            ["'[1,10)'", "'empty'", "'(,5]'", "'[3,)'", "'[1,2]'"],
            Pq::Display,
            TEXT,
            Csv::Exact,
            TEXT,
        ),
    ]
}

/// The table `all_types` with every type the export supports (the apply tests reuse it).
pub(crate) async fn setup() -> (TestDb, Vec<Col>) {
    let db = TestDb::new().await;
    db.exec(
        "CREATE EXTENSION citext; CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
         CREATE DOMAIN posint AS int4 CHECK (VALUE > 0); CREATE DOMAIN price AS numeric(10,2);",
    )
    .await;
    let cols = columns();
    db.exec(&all_types_ddl(cols.iter().map(|c| (c.name, c.ty))))
        .await;
    for row in 0..5 {
        let names: Vec<&str> = cols.iter().map(|c| c.name).collect();
        let vals: Vec<String> = cols
            .iter()
            .map(|c| format!("({})::{}", c.values[row], c.ty))
            .collect();
        db.exec(&format!(
            "INSERT INTO all_types (id, {}) VALUES ({}, {})",
            names.join(", "),
            row + 1,
            vals.join(", ")
        ))
        .await;
    }
    db.exec("INSERT INTO all_types (id) VALUES (6)").await;
    (db, cols)
}

/// PostgreSQL's oracle text for every column and row, ordered by id.
async fn oracle(db: &TestDb, cols: &[Col], csv: bool) -> Vec<Vec<Option<String>>> {
    let exprs: Vec<String> = cols
        .iter()
        .map(|c| (if csv { c.csv_oracle } else { c.pq_oracle }).replace("{c}", c.name))
        .collect();
    db.exec("SET IntervalStyle = iso_8601; SET extra_float_digits = 3")
        .await;
    let rows = db
        .client
        .query(
            &format!("SELECT {} FROM all_types ORDER BY id", exprs.join(", ")),
            &[],
        )
        .await
        .expect("oracle query");
    rows.iter()
        .map(|r| {
            (0..cols.len())
                .map(|i| r.get::<_, Option<String>>(i))
                .collect()
        })
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn json_of(values: &ArrayRef, i: usize) -> String {
    if values.is_null(i) {
        return "null".into();
    }
    match values.data_type() {
        DataType::Utf8 => serde_json::to_string(values.as_string::<i32>().value(i)).unwrap(),
        _ => arrow_cast::display::ArrayFormatter::try_new(values.as_ref(), &Default::default())
            .unwrap()
            .value(i)
            .to_string(),
    }
}

/// The comparable text of a Parquet value.
fn parquet_text(a: &ArrayRef, i: usize, kind: Pq) -> Option<String> {
    if a.is_null(i) {
        return None;
    }
    Some(match kind {
        Pq::Display | Pq::Float => {
            arrow_cast::display::ArrayFormatter::try_new(a.as_ref(), &Default::default())
                .unwrap()
                .value(i)
                .to_string()
        }
        Pq::Hex => match a.data_type() {
            DataType::Binary => hex(a.as_binary::<i32>().value(i)),
            _ => hex(a.as_fixed_size_binary().value(i)),
        },
        Pq::Days => match a.as_primitive::<Date32Type>().value(i) {
            i32::MAX => "infinity".into(),
            i32::MIN => "-infinity".into(),
            d => d.to_string(),
        },
        Pq::Micros => {
            let v = match a.data_type() {
                DataType::Time64(_) => a.as_primitive::<Time64MicrosecondType>().value(i),
                _ => a.as_primitive::<TimestampMicrosecondType>().value(i),
            };
            match v {
                i64::MAX => "infinity".into(),
                i64::MIN => "-infinity".into(),
                v => v.to_string(),
            }
        }
        Pq::Interval => {
            let s = a.as_struct();
            format!(
                "{} {} {}",
                s.column(0).as_primitive::<Int32Type>().value(i),
                s.column(1).as_primitive::<Int32Type>().value(i),
                s.column(2).as_primitive::<Int64Type>().value(i)
            )
        }
        Pq::Json => {
            let list = a.as_list::<i32>();
            let values = list.values();
            let o = list.value_offsets();
            let items: Vec<String> = (o[i] as usize..o[i + 1] as usize)
                .map(|j| json_of(values, j))
                .collect();
            format!("[{}]", items.join(","))
        }
    })
}

fn same_float(a: &str, b: &str) -> bool {
    let (x, y): (f64, f64) = (
        a.parse().unwrap_or_else(|_| panic!("{a}")),
        b.parse().unwrap_or_else(|_| panic!("{b}")),
    );
    (x.is_nan() && y.is_nan()) || x == y
}

fn check(
    col: &Col,
    row: usize,
    expected: &Option<String>,
    got: &Option<String>,
    float: bool,
    what: &str,
) {
    let ok = match (expected, got) {
        (Some(e), Some(g)) if float => same_float(e, g),
        (e, g) => e == g,
    };
    let show = |v: &Option<String>| {
        v.as_ref().map(|s| {
            if s.len() > 80 {
                format!("{}… ({} chars)", &s[..80], s.len())
            } else {
                s.clone()
            }
        })
    };
    assert!(
        ok,
        "{what}: column {} ({}) row {}: PostgreSQL says {:?}, export has {:?}",
        col.name,
        col.ty,
        row + 1,
        show(expected),
        show(got)
    );
}

#[tokio::test]
async fn every_type_round_trips_through_parquet_and_csv() {
    let (db, cols) = setup().await;
    let expected_pq = oracle(&db, &cols, false).await;
    let expected_csv = oracle(&db, &cols, true).await;

    // Parquet.
    let out = tempdir();
    let report_path = out.path().join("report.json");
    let run = export(
        &db.url,
        &out.path().join("pq"),
        &with_report("--table public.all_types", &report_path),
    );
    run.ok();
    assert!(
        run.stderr.contains(
            "public.all_types.c_time: 1 time value(s) 24:00:00 written as 23:59:59.999999"
        ),
        "{}",
        run.stderr
    );
    let batches: Vec<RecordBatch> = files::dataset_batches(&out.path().join("pq/public.all_types"));
    let batch = arrow_select_concat(&batches);
    assert_eq!(batch.num_rows(), 6);
    let ids = batch.column(0).as_primitive::<Int32Type>();
    assert_eq!(
        (0..6).map(|i| ids.value(i)).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    for (ci, col) in cols.iter().enumerate() {
        let array = batch.column(ci + 1);
        for row in 0..6 {
            let got = parquet_text(array, row, col.pq);
            check(
                col,
                row,
                &expected_pq[row][ci],
                &got,
                matches!(col.pq, Pq::Float),
                "parquet",
            );
        }
    }
    // Parquet carries the canonical logical types.
    let schema = batch.schema();
    assert_eq!(
        schema
            .field_with_name("c_uuid")
            .unwrap()
            .extension_type_name(),
        Some("arrow.uuid")
    );
    assert_eq!(
        schema.field_with_name("c_numeric").unwrap().data_type(),
        &DataType::Decimal128(38, 10)
    );
    assert_eq!(
        schema
            .field_with_name("c_numeric_wide")
            .unwrap()
            .data_type(),
        &DataType::Decimal256(60, 5)
    );
    assert_eq!(
        schema
            .field_with_name("c_tstz")
            .unwrap()
            .data_type()
            .to_string(),
        "Timestamp(µs, \"UTC\")"
    );

    // The report and manifest list the columns read as text.
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    let fallback: Vec<String> = report["text_fallback_columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        fallback,
        [
            "public.all_types.c_point (point)",
            "public.all_types.c_range (int4range)"
        ]
    );
    let manifest = files::manifest(&out.path().join("pq"));
    let mcols = manifest["datasets"][0]["columns"].as_array().unwrap();
    let money = mcols.iter().find(|c| c["name"] == "c_money").unwrap();
    assert_eq!(money["source_type"], "money");
    assert_eq!(money["arrow_type"], "Decimal128(19, 2)");

    // CSV.
    let run = export(
        &db.url,
        &out.path().join("csv"),
        &["--table", "public.all_types", "--format", "csv"],
    );
    run.ok();
    let text =
        std::fs::read_to_string(out.path().join("csv/public.all_types/part-00000.csv")).unwrap();
    let (header, rows) = files::csv_rows(&text, b',', "");
    assert_eq!(header[0], "id");
    assert_eq!(
        &header[1..],
        cols.iter().map(|c| c.name).collect::<Vec<_>>().as_slice()
    );
    assert_eq!(rows.len(), 6);
    for (row, fields) in rows.iter().enumerate() {
        assert_eq!(fields[0].as_deref(), Some((row + 1).to_string().as_str()));
        for (ci, col) in cols.iter().enumerate() {
            check(
                col,
                row,
                &expected_csv[row][ci],
                &fields[ci + 1],
                matches!(col.csv, Csv::Float),
                "csv",
            );
        }
    }
}

#[tokio::test]
async fn csv_options_change_delimiter_and_null() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE t (id int, s text); INSERT INTO t VALUES (1, 'a;b'), (2, NULL), (3, ''), (4, 'NULL')").await;
    let out = tempdir();
    export(
        &db.url,
        out.path(),
        &words("--table t --format csv --csv-delimiter ; --csv-null NULL"),
    )
    .ok();
    let text = std::fs::read_to_string(out.path().join("public.t/part-00000.csv")).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[1..].sort();
    assert_eq!(
        lines,
        ["id;s", "1;\"a;b\"", "2;NULL", "3;\"\"", "4;\"NULL\""]
    );
    // A number equal to the NULL text is quoted too, so it stays a number.
    let out = tempdir();
    export(
        &db.url,
        out.path(),
        &["--table", "t", "--format", "csv", "--csv-null", "3"],
    )
    .ok();
    let text = std::fs::read_to_string(out.path().join("public.t/part-00000.csv")).unwrap();
    let (_, rows) = files::csv_rows(&text, b',', "3");
    assert!(
        rows.contains(&vec![Some("3".to_string()), Some(String::new())]),
        "{text}"
    );
    assert!(rows.contains(&vec![Some("2".to_string()), None]), "{text}");
    // A NULL text CSV gives meaning to would make NULLs unreadable (or break rows): refused.
    for (null, delimiter) in [(",", ","), ("a;b", ";"), ("\"", ","), ("x\ny", ",")] {
        let out = tempdir();
        let run = export(
            &db.url,
            out.path(),
            &[
                "--table",
                "t",
                "--format",
                "csv",
                "--csv-delimiter",
                delimiter,
                "--csv-null",
                null,
            ],
        );
        assert_eq!(run.code, 2, "{null:?}: {}", run.stderr);
        assert!(run.stderr.contains("--csv-null"), "{}", run.stderr);
        assert!(files_under(out.path()).is_empty(), "nothing written");
    }
}

fn arrow_select_concat(batches: &[RecordBatch]) -> RecordBatch {
    assert!(!batches.is_empty(), "no batches");
    arrow_select::concat::concat_batches(&batches[0].schema(), batches).expect("concat")
}
