#![allow(clippy::unwrap_used)]
//! Firebird types → Arrow round trip, on the embedded engine: every type of the types table in
//! one row, NULLs everywhere in another, text in UTF8 and WIN1251 converted to UTF-8.

use crate::common::*;
use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use sluice_testkit::firebird::TestFdb;
use std::sync::Arc;

const TABLE: &str = "CREATE TABLE ALLTYPES (
    ID INTEGER NOT NULL PRIMARY KEY,
    S SMALLINT, I INTEGER, B BIGINT, H INT128,
    N42 NUMERIC(4,2), D93 DECIMAL(9,3), N182 NUMERIC(18,2), N3810 NUMERIC(38,10), N150 NUMERIC(15,0),
    F FLOAT, DP DOUBLE PRECISION, DF16 DECFLOAT(16), DF34 DECFLOAT(34),
    DT DATE, TM TIME, TS TIMESTAMP, TMZ TIME WITH TIME ZONE, TSZ TIMESTAMP WITH TIME ZONE,
    CU CHAR(5) CHARACTER SET UTF8, VU VARCHAR(20) CHARACTER SET UTF8,
    VW VARCHAR(20) CHARACTER SET WIN1251, VO VARCHAR(4) CHARACTER SET OCTETS,
    BT BLOB SUB_TYPE TEXT CHARACTER SET UTF8, BW BLOB SUB_TYPE TEXT CHARACTER SET WIN1251,
    BB BLOB SUB_TYPE BINARY, BO BOOLEAN)
;;
INSERT INTO ALLTYPES VALUES (1, -32768, 2147483647, -9223372036854775808,
    99999999999999999999999999999999999999,
    -327.68, 2147483.647, -92233720368547758.08, 1234567890123456789012345678.0123456789, 123456789012345,
    1.5, 3.141592653589793, 1.234E+300, -0.000001234,
    DATE '2024-02-29', TIME '13:45:06.7891', TIMESTAMP '1999-12-31 23:59:59.9999',
    TIME '13:45:00 +02:00', TIMESTAMP '2024-06-01 12:00:00 Europe/Berlin',
    'ab', 'Grüße €', 'Привет', x'00FF10',
    'long text ', 'Ёлка', x'00FF10', TRUE)
;;
UPDATE ALLTYPES SET BT = BT || LPAD('', 3000, 'xyz') WHERE ID = 1
;;
INSERT INTO ALLTYPES (ID) VALUES (2)";

#[test]
fn every_type_round_trips_with_nulls() {
    let db = TestFdb::new();
    db.exec(TABLE);
    // The WIN1251 columns really hold single-byte text.
    assert_eq!(
        db.row_strings("SELECT OCTET_LENGTH(VW), OCTET_LENGTH(BW) FROM ALLTYPES WHERE ID = 1"),
        ["6|4"]
    );
    let out = tempdir();
    export(&db.url, out.path(), &["--table", "alltypes"]).ok();
    let batches = files::dataset_batches(&out.path().join("ALLTYPES"));
    // Arrow's display of a "UTC" zone needs chrono-tz: show that column as an offset instead.
    let shown: Vec<_> = batches
        .iter()
        .map(|b| {
            let mut cols = b.columns().to_vec();
            let i = b.schema().index_of("TSZ").unwrap();
            cols[i] = arrow_cast::cast(
                &cols[i],
                &DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            )
            .unwrap();
            let fields: Vec<_> = b
                .schema()
                .fields()
                .iter()
                .zip(&cols)
                .map(|(f, c)| Field::new(f.name(), c.data_type().clone(), true))
                .collect();
            RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
        })
        .collect();
    let got = files::row_strings(&shown);
    let long = format!("long text {}", "xyz".repeat(1000));
    assert!(long.len() > 255, "the blob spans several segments");
    let want_full = [
        "1",
        "-32768",
        "2147483647",
        "-9223372036854775808",
        "99999999999999999999999999999999999999",
        "-327.68",
        "2147483.647",
        "-92233720368547758.08",
        "1234567890123456789012345678.0123456789",
        "123456789012345",
        "1.5",
        "3.141592653589793",
        "1.234E+300",
        "-0.000001234",
        "2024-02-29",
        "13:45:06.789100",
        "1999-12-31T23:59:59.999900",
        "13:45:00.0000 +02:00",
        "2024-06-01T10:00:00Z",
        "ab   ",
        "Grüße €",
        "Привет",
        "00ff10",
        long.as_str(),
        "Ёлка",
        "00ff10",
        "true",
    ]
    .join("|");
    let mut want = vec![want_full, format!("2{}", "|∅".repeat(26))];
    want.sort();
    assert_eq!(got.len(), 2);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w);
    }

    // Arrow types and the source types in the manifest.
    let schema = batches[0].schema();
    let dt = |name: &str| {
        schema
            .field_with_name(name)
            .unwrap()
            .data_type()
            .to_string()
    };
    assert_eq!(dt("S"), "Int16");
    assert_eq!(dt("H"), "Decimal128(38, 0)");
    assert_eq!(dt("N42"), "Decimal128(5, 2)");
    assert_eq!(dt("N182"), "Decimal128(19, 2)");
    assert_eq!(dt("F"), "Float32");
    assert_eq!(dt("TSZ"), "Timestamp(µs, \"UTC\")");
    assert_eq!(dt("VO"), "Binary");
    assert!(!schema.field_with_name("ID").unwrap().is_nullable());
    let m = files::manifest(out.path());
    let cols = m["datasets"][0]["columns"].as_array().unwrap();
    let source_type = |name: &str| {
        cols.iter()
            .find(|c| c["name"] == name)
            .map(|c| c["source_type"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(source_type("VW"), "VARCHAR(20) CHARACTER SET WIN1251");
    assert_eq!(source_type("D93"), "DECIMAL(9,3)");
    assert_eq!(source_type("DF34"), "DECFLOAT(34)");
}

#[test]
fn csv_output_has_a_header_and_the_same_values() {
    let db = TestFdb::new();
    db.exec(
        "CREATE TABLE T (ID INTEGER, N NUMERIC(9,2), S VARCHAR(10) CHARACTER SET WIN1251)
         ;;
         INSERT INTO T VALUES (1, 12.5, 'Мир')
         ;;
         INSERT INTO T VALUES (2, NULL, NULL)",
    );
    let out = tempdir();
    export(&db.url, out.path(), &["--table", "T", "--format", "csv"]).ok();
    let text = std::fs::read_to_string(out.path().join("T/part-00000.csv")).unwrap();
    let (header, mut rows) = files::csv_rows(&text, b',', "");
    rows.sort();
    assert_eq!(header, ["ID", "N", "S"]);
    assert_eq!(
        rows,
        [
            vec![Some("1".into()), Some("12.50".into()), Some("Мир".into())],
            vec![Some("2".to_string()), None, None],
        ]
    );
}
