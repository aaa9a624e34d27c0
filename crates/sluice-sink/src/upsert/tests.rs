use super::*;
use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{Int64Array, StringArray, UInt64Array};
use arrow_schema::{DataType, Field, Schema};

const ID: &str = "id";

/// Change rows `(op, seq, id, v, big, absent columns)`.
type Change<'a> = (
    &'a str,
    u64,
    i64,
    Option<&'a str>,
    Option<&'a str>,
    &'a [&'a str],
);

fn changes(rows: &[Change]) -> RecordBatch {
    let mut absent = ListBuilder::new(StringBuilder::new());
    for (.., a) in rows {
        for c in *a {
            absent.values().append_value(c);
        }
        absent.append(true);
    }
    let schema = Schema::new(vec![
        Field::new(ID, DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
        Field::new("big", DataType::Utf8, true),
        Field::new(OP, DataType::Utf8, false),
        Field::new(SEQ, DataType::UInt64, false),
        Field::new(
            ABSENT,
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        ),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.3))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.4))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(absent.finish()),
        ],
    )
    .unwrap()
}

/// A table file of rows `(id, v, big)`.
fn table_file(up: &Upserts, rows: &[(i64, &str, &str)]) -> Bytes {
    let batch = RecordBatch::try_new(
        up.schema().clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
        ],
    )
    .unwrap();
    let mut w = ArrowWriter::try_new(Vec::new(), up.schema().clone(), None).unwrap();
    w.write(&batch).unwrap();
    Bytes::from(w.into_inner().unwrap())
}

/// The rows of a Parquet file, sorted, as `id|v|big`.
fn read(bytes: Vec<u8>) -> Vec<String> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(Bytes::from(bytes))
        .unwrap()
        .build()
        .unwrap();
    let mut out = Vec::new();
    for b in reader {
        let b = b.unwrap();
        for r in 0..b.num_rows() {
            let cells: Vec<String> = (0..b.num_columns())
                .map(|c| arrow_cast::display::array_value_to_string(b.column(c), r).unwrap())
                .collect();
            out.push(cells.join("|"));
        }
    }
    out.sort();
    out
}

fn reduce(rows: &[Change]) -> Upserts {
    Upserts::new(
        "public.t",
        &[changes(rows)],
        &[ID.to_string()],
        &ParquetOptions::default(),
    )
    .unwrap()
}

#[test]
fn the_last_change_of_a_key_wins_and_absent_columns_keep_the_rows_values() {
    let mut up = reduce(&[
        ("update", 1, 2, Some("b2"), None, &["big"]),
        ("delete", 2, 3, None, None, &["v", "big"]),
        // A key update: 4 becomes 40, its large value unchanged.
        ("delete", 3, 4, None, None, &["v", "big"]),
        ("insert", 4, 40, Some("b40"), None, &["big"]),
        ("insert", 5, 6, Some("b6"), Some("t6"), &[]),
        ("update", 6, 6, Some("c6"), None, &["big"]),
        ("insert", 7, 7, Some("b7"), Some("t7"), &[]),
        ("delete", 8, 7, None, None, &["v", "big"]),
    ]);
    assert_eq!(up.touched(), 6);
    let file = table_file(
        &up,
        &[
            (1, "a1", "t1"),
            (2, "a2", "t2"),
            (3, "a3", "t3"),
            (4, "a4", "t4"),
            (5, "a5", "t5"),
        ],
    );
    let Rewrite::Replaced { bytes, rows } = up.rewrite(file).unwrap() else {
        panic!("the file holds touched keys");
    };
    assert_eq!(rows, 2);
    assert_eq!(read(bytes), ["1|a1|t1", "5|a5|t5"]);
    let other = table_file(&up, &[(8, "a8", "t8")]);
    assert!(matches!(up.rewrite(other).unwrap(), Rewrite::Untouched));
    let (bytes, rows) = up.finish().unwrap().unwrap();
    assert_eq!(rows, 3);
    assert_eq!(read(bytes), ["2|b2|t2", "40|b40|t4", "6|c6|t6"]);
}

#[test]
fn a_truncate_removes_every_earlier_row_and_every_file() {
    let mut up = reduce(&[
        ("update", 1, 1, Some("b1"), Some("u1"), &[]),
        ("truncate", 2, 0, None, None, &["v", "big"]),
        ("insert", 3, 9, Some("b9"), Some("t9"), &[]),
    ]);
    assert!(up.truncated());
    let file = table_file(&up, &[(1, "a1", "t1")]);
    assert!(matches!(up.rewrite(file).unwrap(), Rewrite::Removed));
    let (bytes, _) = up.finish().unwrap().unwrap();
    assert_eq!(read(bytes), ["9|b9|t9"]);
}

#[test]
fn a_file_whose_every_row_is_deleted_is_removed_and_nothing_is_written() {
    let mut up = reduce(&[("delete", 1, 1, None, None, &["v", "big"])]);
    let file = table_file(&up, &[(1, "a1", "t1")]);
    assert!(matches!(up.rewrite(file).unwrap(), Rewrite::Removed));
    assert!(up.finish().unwrap().is_none());
}

#[test]
fn a_table_without_a_key_is_refused_naming_the_fix() {
    let e = Upserts::new("public.t", &[changes(&[])], &[], &ParquetOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("no primary key") && e.contains("--format parquet"),
        "{e}"
    );
}

#[test]
fn absorbed_files_go_into_the_final_file_without_the_touched_keys() {
    let mut up = reduce(&[
        ("update", 1, 2, Some("b2"), None, &["big"]),
        ("insert", 2, 9, Some("b9"), Some("t9"), &[]),
    ]);
    let small = table_file(&up, &[(1, "a1", "t1"), (2, "a2", "t2")]);
    up.absorb(small).unwrap();
    let other = table_file(&up, &[(5, "a5", "t5")]);
    up.absorb(other).unwrap();
    let (bytes, rows) = up.finish().unwrap().unwrap();
    assert_eq!(rows, 4);
    assert_eq!(read(bytes), ["1|a1|t1", "2|b2|t2", "5|a5|t5", "9|b9|t9"]);
}

/// The footer of a Parquet file's bytes.
fn footer(file: &Bytes) -> &[u8] {
    let n = file.len();
    let len = u32::from_le_bytes(file[n - 8..n - 4].try_into().unwrap()) as usize;
    &file[n - 8 - len..n - 8]
}

#[test]
fn a_file_whose_key_range_holds_no_touched_key_is_passed_over_by_its_statistics() {
    let up = reduce(&[
        ("update", 1, 2, Some("b2"), Some("u2"), &[]),
        ("delete", 2, 40, None, None, &["v", "big"]),
    ]);
    let low = table_file(&up, &[(1, "a1", "t1"), (3, "a3", "t3")]);
    let between = table_file(&up, &[(10, "a", "t"), (20, "a", "t")]);
    let high = table_file(&up, &[(35, "a", "t"), (45, "a", "t")]);
    assert!(up.may_hold(footer(&low)).unwrap(), "2 is within 1..3");
    assert!(
        !up.may_hold(footer(&between)).unwrap(),
        "neither 2 nor 40 is within 10..20"
    );
    assert!(up.may_hold(footer(&high)).unwrap(), "40 is within 35..45");
    assert!(
        up.may_hold(b"not a footer").unwrap(),
        "unreadable statistics cannot exclude"
    );
}
