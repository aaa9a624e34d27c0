//! The planner over a toy dialect: what it buffers, when it sends, what it counts.

use super::*;
use crate::apply::Engine;
use crate::columns::field;
use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_schema::DataType;
use async_trait::async_trait;

/// Statements as short tokens: `I t(id,v)`, rows `(1,a)`, `U v=a W id=1`, `UM v [1,2]`, ….
struct Toy;

type P<'a> = Prepared<'a, ()>;

fn val(p: &P<'_>, c: usize, r: usize) -> String {
    let a = p.t.batch.column(c);
    if a.is_null(r) {
        return "N".into();
    }
    match a.data_type() {
        DataType::Int32 => a
            .as_primitive::<arrow_array::types::Int32Type>()
            .value(r)
            .to_string(),
        _ => a.as_string::<i32>().value(r).to_string(),
    }
}

fn name<'a>(p: &'a P<'_>, c: usize) -> &'a str {
    &p.t.columns[c].name
}

/// `c=v,…` of row `r`'s columns `cols`.
fn pairs(p: &P<'_>, cols: &[usize], r: usize) -> String {
    let s: Vec<String> = cols
        .iter()
        .map(|&c| format!("{}={}", name(p, c), val(p, c, r)))
        .collect();
    s.join(",")
}

impl ApplyDialect for Toy {
    type Columns = ();
    const QUOTE: char = '"';
    const UPDATE_ROWS: usize = 2;
    const DELETE_ROWS: usize = 3;
    const BEGIN: &'static str = "B";
    const COMMIT: &'static str = "C";

    fn columns(&self, _t: &UnitTable) -> Result<()> {
        Ok(())
    }
    fn text(&mut self, text: &str, buf: &mut String) {
        buf.push_str(text);
    }
    fn on_conflict(&mut self, _key: &[&str], _set: &[&str], _buf: &mut String) {}
    fn value(&mut self, p: &P<'_>, c: usize, r: usize, buf: &mut String) -> Result<()> {
        buf.push_str(&val(p, c, r));
        Ok(())
    }
    fn insert_head(&mut self, p: &P<'_>, cols: &[usize], buf: &mut String) {
        let names: Vec<&str> = cols.iter().map(|&c| name(p, c)).collect();
        buf.push_str(&format!("I {}({})", p.t.table.name, names.join(",")));
    }
    fn insert_row(&mut self, p: &P<'_>, cols: &[usize], r: usize, buf: &mut String) -> Result<()> {
        let v: Vec<String> = cols.iter().map(|&c| val(p, c, r)).collect();
        buf.push_str(&format!("({})", v.join(",")));
        Ok(())
    }
    fn default_values(&mut self, p: &P<'_>) -> Option<String> {
        Some(format!("DV {}", p.t.table.name))
    }
    fn update_head(&mut self, p: &P<'_>, set: &[usize], r: usize, buf: &mut String) -> Result<()> {
        buf.push_str(&format!("U {}", pairs(p, set, r)));
        Ok(())
    }
    fn delete_head(&mut self, _p: &P<'_>, buf: &mut String) {
        buf.push('D');
    }
    fn row_where(&mut self, p: &P<'_>, cols: &[usize], r: usize, buf: &mut String) -> Result<()> {
        let star = if p.key.is_empty() { "*" } else { "" };
        buf.push_str(&format!(" W{star} {}", pairs(p, cols, r)));
        Ok(())
    }
    fn update_many(&mut self, p: &P<'_>, many: Many<'_>, b: &mut String) -> Result<()> {
        let s: Vec<&str> = many.set.iter().map(|&c| name(p, c)).collect();
        let k: Vec<String> = many.rows.iter().map(|&r| val(p, p.key[0], r)).collect();
        b.push_str(&format!("UM {} [{}]", s.join(","), k.join(",")));
        Ok(())
    }
    fn delete_many(&mut self, p: &P<'_>, many: Many<'_>, buf: &mut String) -> Result<()> {
        let k: Vec<String> = many.rows.iter().map(|&r| val(p, p.key[0], r)).collect();
        buf.push_str(&format!("DM [{}]", k.join(",")));
        Ok(())
    }
    fn position(&mut self, name: &str, worker: u32, position: &AppliedPosition, buf: &mut String) {
        buf.push_str(&format!("P {name} {worker} {}", position.unit));
    }
    fn followed(&mut self, name: &str, table: &TableRef, columns_json: &str, buf: &mut String) {
        buf.push_str(&format!("F {name} {} {columns_json}", table.name));
    }
}

/// A link that answers each statement with `rows` affected rows, or fails with `fail`.
#[derive(Default)]
struct Link {
    sent: Vec<String>,
    rows: u64,
    fail: Option<Error>,
    rollbacks: usize,
}

#[async_trait]
impl ApplyLink for Link {
    async fn send(&mut self, sql: &str, tables: &[TableRef]) -> Result<Vec<u64>> {
        self.sent.push(sql.to_string());
        if let Some(e) = self.fail.take() {
            let names: Vec<String> = tables.iter().map(|t| t.to_string()).collect();
            return Err(Error::apply_blocked(format!(
                "{} on {}",
                e.message(),
                names.join(",")
            )));
        }
        Ok(vec![self.rows; sql.split(';').count()])
    }
    async fn rollback(&mut self) -> Result<()> {
        self.rollbacks += 1;
        Ok(())
    }
    async fn holders(&mut self, _tables: &[TableRef]) -> String {
        "held by pid 7.".into()
    }
}

/// Table `d.t (id int, v text)` keyed by `key`: rows of (op, id, v, absent columns).
fn table(key: &[&str], rows: &[(&str, i32, Option<&str>, &[&str])]) -> UnitTable {
    let rows: Vec<fixture::Row<'_>> = rows.iter().map(|r| (r.0, Some(r.1), r.2, r.3)).collect();
    fixture::table(
        key,
        "text",
        field("v", DataType::Utf8),
        Engine::Postgres,
        &rows,
    )
    .unwrap()
}

use fixture::unit;

fn position(unit: u64) -> AppliedPosition {
    AppliedPosition {
        unit,
        restart: crate::StreamPos::from_adapter("r"),
        pos: crate::StreamPos::from_adapter("p"),
        commit_ts: None,
        skip: 0,
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

/// A planner of worker `worker` with its transaction begun, and a link.
fn begun(worker: u32) -> (Planner<Toy>, Link) {
    let mut p = Planner::new(Toy, "n", worker);
    p.begin();
    (p, Link::default())
}

/// What `rows` of `d.t` keyed by `key`, in `batches`, become in one committed unit.
fn committed(
    key: &[&str],
    rows: &[(&str, i32, Option<&str>, &[&str])],
    batches: &[u32],
) -> Vec<String> {
    block_on(async {
        let (mut p, mut link) = begun(0);
        p.apply(&unit(table(key, rows), batches), &mut link)
            .await
            .unwrap();
        p.commit(&mut link).await.unwrap();
        link.sent
    })
}

#[test]
fn a_unit_is_one_round_trip_with_inserts_merged() {
    block_on(async {
        let (mut p, mut link) = begun(3);
        let t = table(
            &["id"],
            &[
                ("insert", 1, Some("a"), &[]),
                ("insert", 2, None, &[]),
                ("update", 1, None, &["v"]),
                ("update", 2, Some("b"), &[]),
                ("delete", 1, None, &[]),
            ],
        );
        p.apply(&unit(t, &[]), &mut link).await.unwrap();
        // The next piece's inserts extend the open insert.
        let more = table(
            &["id"],
            &[("insert", 3, Some("c"), &[]), ("insert", 4, None, &["v"])],
        );
        p.apply(&unit(more, &[]), &mut link).await.unwrap();
        p.record(&position(9));
        p.commit(&mut link).await.unwrap();
        assert_eq!(
            link.sent,
            ["B;I t(id,v)(1,a),(2,N);U v=b W id=2;D W id=1;I t(id,v)(3,c);I t(id)(4);P n 3 9;C"],
            "an update of its key alone sets nothing and is left out"
        );
    });
}

#[test]
fn batches_group_by_columns_and_chunk() {
    let sent = committed(
        &["id"],
        &[
            ("insert", 1, Some("a"), &[]),
            ("insert", 2, None, &["v"]),
            ("insert", 3, Some("c"), &[]),
            ("update", 1, Some("x"), &[]),
            ("update", 2, None, &["v"]),
            ("update", 3, Some("y"), &[]),
            ("update", 4, Some("z"), &[]),
            ("update", 5, Some("w"), &[]),
            ("delete", 6, None, &[]),
            ("delete", 7, None, &[]),
            ("delete", 8, None, &[]),
            ("delete", 9, None, &[]),
        ],
        &[3, 8, 12],
    );
    assert_eq!(
        sent,
        ["B;I t(id,v)(1,a),(3,c);I t(id)(2);UM v [1,3];UM v [4,5];DM [6,7,8];DM [9];C"]
    );
}

#[test]
fn keyless_rows_match_what_they_carry_and_empty_inserts_use_default_values() {
    let rows: &[(&str, i32, Option<&str>, &[&str])] = &[
        ("update", 1, Some("a"), &[]),
        ("delete", 2, None, &["v"]),
        ("insert", 0, None, &["id", "v"]),
    ];
    assert_eq!(
        committed(&[], rows, &[2, 3]),
        ["B;U id=1,v=a W* id=1,v=a;D W* id=2;DV t;C"]
    );
}

#[test]
fn a_large_unit_is_sent_past_the_flush_bound() {
    block_on(async {
        let (mut p, mut link) = begun(0);
        let big = "x".repeat(FLUSH_BYTES / 2 + 1);
        let rows: Vec<(&str, i32, Option<&str>, &[&str])> = (0..3)
            .map(|i| ("insert", i, Some(big.as_str()), &[][..]))
            .collect();
        p.apply(&unit(table(&["id"], &rows), &[3]), &mut link)
            .await
            .unwrap();
        assert_eq!(link.sent.len(), 1, "sent once past the bound");
        assert!(
            link.sent[0].ends_with(&format!("(1,{big});")),
            "the insert is ended"
        );
        p.commit(&mut link).await.unwrap();
        assert_eq!(link.sent[1], format!("I t(id,v)(2,{big});C"));
    });
}

#[test]
fn unmatched_updates_and_deletes_count_at_commit() {
    block_on(async {
        let (mut p, mut link) = begun(0);
        let t = table(
            &["id"],
            &[
                ("insert", 1, Some("a"), &[]),
                ("update", 2, Some("b"), &[]),
                ("delete", 3, None, &[]),
                ("delete", 4, None, &[]),
            ],
        );
        p.apply(&unit(t, &[1, 2, 4]), &mut link).await.unwrap();
        p.send(&mut link).await.unwrap();
        assert_eq!(p.unmatched(), 0, "counted once committed");
        p.commit(&mut link).await.unwrap();
        assert_eq!(p.unmatched(), 3, "1 update and 2 deletes matched 0 rows");
        p.begin();
        p.commit(&mut link).await.unwrap();
        assert_eq!(p.unmatched(), 0);
    });
}

#[test]
fn a_rollback_reaches_the_server_only_after_a_send() {
    block_on(async {
        let (mut p, mut link) = begun(0);
        let t = table(&["id"], &[("insert", 1, Some("a"), &[])]);
        p.apply(&unit(t.clone(), &[]), &mut link).await.unwrap();
        p.rollback(&mut link).await.unwrap();
        assert_eq!((link.sent.len(), link.rollbacks), (0, 0));
        p.begin();
        p.apply(&unit(t, &[]), &mut link).await.unwrap();
        p.send(&mut link).await.unwrap();
        p.rollback(&mut link).await.unwrap();
        assert_eq!((link.sent.len(), link.rollbacks), (1, 1));
        p.begin();
        p.commit(&mut link).await.unwrap();
        assert_eq!(
            link.sent[1], "B;C",
            "nothing of the rolled-back unit is left"
        );
    });
}

#[test]
fn a_lock_wait_given_up_rolls_back_and_names_the_holder() {
    block_on(async {
        let (mut p, mut link) = begun(0);
        link.fail = Some(Error::apply_blocked("lock wait timeout"));
        let t = table(&["id"], &[("update", 1, Some("a"), &[])]);
        p.apply(&unit(t, &[]), &mut link).await.unwrap();
        let e = p.commit(&mut link).await.unwrap_err();
        assert!(e.is_apply_blocked());
        assert_eq!(e.message(), "lock wait timeout on d.t held by pid 7.");
        assert_eq!(link.rollbacks, 1);
        p.rollback(&mut link).await.unwrap();
        assert_eq!(link.rollbacks, 1, "already rolled back");
    });
}

#[test]
fn a_truncate_row_is_refused() {
    block_on(async {
        let (mut p, mut link) = begun(0);
        let t = table(&["id"], &[("truncate", 1, None, &[])]);
        let e = p.apply(&unit(t, &[]), &mut link).await.unwrap_err();
        assert!(e.message().contains("\"truncate\" change of d.t"), "{e}");
    });
}
