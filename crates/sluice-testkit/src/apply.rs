//! One suite body for every apply target (`sluice_core::apply::ApplyTarget`): units applied in
//! order with their position, conflicts reported as conflicts, barriers applied twice giving
//! the same table, a unit past the send buffer, and bookkeeping of an earlier release brought
//! up to date — written once ([`suite`]) and run over PostgreSQL, MariaDB and MySQL 9 by
//! `tests/it/apply_suite.rs`, one test per scenario and engine.
//!
//! A [`Target`] is a source database with the suite's two tables (`acct`, keyed, with a unique
//! name; `bag`, without a key), described as a replication describes them (columns and keys
//! read through the engine's own catalog and change source), and an apply target on which
//! they are created. Units are built from text cast to each column's Arrow type, so one table
//! of changes serves every engine; what a scenario checks is read back from the target with
//! SQL, never from what the session reported.

pub mod suite;

pub use crate::source::Engine;

use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch, StringArray, TimestampMicrosecondArray, UInt64Array};
use sluice_core::apply::{
    AppliedPosition, ApplySession, ApplyTarget, ApplyUnit, TableKeys, TargetTable, UnitTable,
};
use sluice_core::change::{ChangeSource, change_schema};
use sluice_core::table::{Dataset, TableRef};
use std::sync::Arc;

enum Db {
    Pg(crate::pg::TestDb),
    My(crate::mysql::TestDb),
}

impl Db {
    async fn exec(&mut self, sql: &str) {
        match self {
            Db::Pg(d) => d.exec(sql).await,
            Db::My(d) => d.exec(sql).await,
        }
    }

    async fn rows(&mut self, sql: &str) -> Vec<String> {
        match self {
            Db::Pg(d) => d.row_strings(sql).await,
            Db::My(d) => d.row_strings(sql).await,
        }
    }
}

/// The suite's source tables on `engine`, in one dialect each.
const TABLES_PG: &str = "CREATE TABLE acct (id int PRIMARY KEY, name varchar(40) NOT NULL UNIQUE,
                                            note text, n int);
                         CREATE TABLE bag (a int, b varchar(10));";
const TABLES_MY: &str = "CREATE TABLE acct (id int PRIMARY KEY, name varchar(40) NOT NULL UNIQUE,
                                            note text, n int) CHARACTER SET utf8mb4;
                         CREATE TABLE bag (a int, b varchar(10)) CHARACTER SET utf8mb4;";

/// A source with the suite's tables and an apply target holding them.
pub struct Target {
    engine: Engine,
    src: Db,
    /// Where the target writes when not on the source's database (PostgreSQL: a database of
    /// its own; MySQL/MariaDB: `None`, the source's server, the tables in database `into`).
    dst: Option<Db>,
    into: String,
    /// The target under test.
    pub target: Box<dyn ApplyTarget>,
    /// `acct` as the target holds it.
    pub acct: TargetTable,
    /// `bag` as the target holds it.
    pub bag: TargetTable,
    /// The replication's name: unique per test, since a MySQL/MariaDB target keeps every
    /// replication's bookkeeping in one server-wide database.
    pub name: String,
}

/// Whether `table` holds any row on `target`, by the target's own check (the one a
/// replication's initial load makes).
pub async fn holds_rows(target: &dyn ApplyTarget, table: &TableRef) -> bool {
    !target
        .non_empty(std::slice::from_ref(table))
        .await
        .expect("asking the target whether a table holds rows")
        .is_empty()
}

/// The datasets of `tables` (`schema.name`) in `source`, as a replication discovers them.
pub async fn discover(source: &dyn sluice_core::Source, tables: &[&str]) -> Vec<Dataset> {
    let options = sluice_core::SourceOptions {
        session_tag: "test".into(),
        consistency: sluice_core::Consistency::Chunk,
        enable_row_security: false,
    };
    let mut c = source
        .open_coordinator(&options)
        .await
        .expect("a coordinator");
    let selection = sluice_core::table::Selection {
        tables: tables
            .iter()
            .map(|t| sluice_core::ident::QualifiedName::parse(t).expect("a table name"))
            .collect(),
        ..Default::default()
    };
    let found = c.discover(&selection).await.expect("discover");
    c.release().await.expect("release");
    found
}

/// The MySQL/MariaDB description of `schema.name`, as the export reads it.
pub async fn describe_mysql(url: &str, schema: &str, name: &str) -> Dataset {
    let target = sluice_mysql::MyTarget::parse(url).expect("a MySQL URL");
    let mut conn = target
        .connect(&sluice_mysql::Sessions::default())
        .await
        .expect("a session");
    let server = sluice_mysql::catalog::server_info(&mut conn, target.display())
        .await
        .expect("server info");
    let obj = sluice_mysql::catalog::Resolved {
        table: TableRef::new(schema, name),
        view: false,
    };
    sluice_mysql::catalog::describe(&mut conn, &obj, &server, target.display())
        .await
        .expect("describe")
        .dataset
}

/// `acct` and `bag` of the source as a replication describes them, named as on the target.
async fn describe(engine: Engine, src: &Db, url: &str, into: &str) -> Vec<TargetTable> {
    let (datasets, keys, source_engine) = match src {
        Db::Pg(_) => {
            let source = sluice_postgres::PgSource::new(url).expect("a PostgreSQL source");
            let ds = discover(&source, &["public.acct", "public.bag"]).await;
            let keys = sluice_postgres::replication::PgCapture::new(url)
                .expect("a change source")
                .table_keys(&ds)
                .await
                .expect("table keys");
            (ds, keys, sluice_core::apply::Engine::Postgres)
        }
        Db::My(d) => {
            let ds = vec![
                describe_mysql(url, &d.name, "acct").await,
                describe_mysql(url, &d.name, "bag").await,
            ];
            let keys = sluice_mysql::replication::MyCapture::new(url, None)
                .expect("a change source")
                .table_keys(&ds)
                .await
                .expect("table keys");
            (ds, keys, sluice_core::apply::Engine::Mysql)
        }
    };
    assert_ne!(engine, Engine::Firebird);
    datasets
        .into_iter()
        .zip(keys)
        .map(|(d, keys)| {
            let table = TableRef::new(into, &d.object.expect("a table").name);
            TargetTable {
                table: table.clone(),
                columns: d.columns,
                keys: TableKeys { table, ..keys },
                source_engine,
            }
        })
        .collect()
}

impl Target {
    /// The suite's tables on a fresh source database of `engine`, created on its target.
    pub async fn new(engine: Engine) -> Target {
        Self::open(engine, false).await
    }

    /// [`Target::new`] on a MySQL/MariaDB server taken alone: for a scenario that changes the
    /// server-wide bookkeeping database every other target uses.
    pub async fn alone(engine: Engine) -> Target {
        Self::open(engine, true).await
    }

    async fn open(engine: Engine, alone: bool) -> Target {
        let (mut src, dst, into, url) = match engine {
            Engine::Postgres => {
                let src = crate::pg::TestDb::new().await;
                let dst = crate::pg::TestDb::new().await;
                let url = dst.url.clone();
                (Db::Pg(src), Some(Db::Pg(dst)), "public".to_string(), url)
            }
            Engine::Mariadb | Engine::Mysql9 => {
                let src = match (engine, alone) {
                    (Engine::Mariadb, true) => crate::mysql::TestDb::alone().await,
                    (Engine::Mariadb, false) => crate::mysql::TestDb::new().await,
                    (_, true) => crate::mysql9::test_db_alone().await,
                    (_, false) => crate::mysql9::test_db().await,
                };
                let into = format!("{}_target", src.name);
                let url = src.url.clone();
                (Db::My(src), None, into, url)
            }
            other => panic!("no apply target in the suite for {other:?}"),
        };
        src.exec(if engine == Engine::Postgres {
            TABLES_PG
        } else {
            TABLES_MY
        })
        .await;
        let src_url = match &src {
            Db::Pg(d) => d.url.clone(),
            Db::My(d) => d.url.clone(),
        };
        let mut tables = describe(engine, &src, &src_url, &into).await;
        let target: Box<dyn ApplyTarget> = match engine {
            Engine::Postgres => {
                Box::new(sluice_postgres::PgApplyTarget::new(&url).expect("a target"))
            }
            _ => Box::new(sluice_mysql::MyApplyTarget::new(&url).expect("a target")),
        };
        let name = format!("r_{:08x}", rand::random::<u32>());
        let bag = tables.pop().expect("bag");
        let acct = tables.pop().expect("acct");
        Target {
            engine,
            src,
            dst,
            into,
            target,
            acct,
            bag,
            name,
        }
    }

    /// `prepare` the target's bookkeeping and create the tables.
    pub async fn create(&self) {
        create(self.target.as_ref(), &[self.acct.clone(), self.bag.clone()]).await;
    }

    /// The engine.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// `pg` on PostgreSQL, `my` on MySQL/MariaDB: the suite's SQL where dialects differ.
    pub fn sql<'a>(&self, pg: &'a str, my: &'a str) -> &'a str {
        if self.engine == Engine::Postgres {
            pg
        } else {
            my
        }
    }

    /// `table` of the target, qualified as SQL names it.
    pub fn on_target(&self, table: &str) -> String {
        format!("{}.{table}", self.into)
    }

    /// `SELECT what FROM <target's table> [rest]` as sorted `v1|v2|…` rows (NULL as `∅`).
    pub async fn target_rows(&mut self, what: &str, table: &str, rest: &str) -> Vec<String> {
        let sql = format!("SELECT {what} FROM {} {rest}", self.on_target(table));
        self.dst().rows(&sql).await
    }

    fn dst(&mut self) -> &mut Db {
        match &mut self.dst {
            Some(d) => d,
            None => &mut self.src,
        }
    }

    /// Run `sql` on the target's server.
    pub async fn target_exec(&mut self, sql: &str) {
        self.dst().exec(sql).await
    }

    /// Rows of `sql` on the target's server.
    pub async fn target_query(&mut self, sql: &str) -> Vec<String> {
        self.dst().rows(sql).await
    }

    /// Run `sql` on the source.
    pub async fn source_exec(&mut self, sql: &str) {
        self.src.exec(sql).await
    }

    /// Rows of `sql` on the source.
    pub async fn source_query(&mut self, sql: &str) -> Vec<String> {
        self.src.rows(sql).await
    }

    /// `table`'s columns as the source describes them now (after a change of its columns).
    pub async fn describe_again(&mut self, table: &str) -> Vec<sluice_core::table::ColumnDesc> {
        let url = match &self.src {
            Db::Pg(d) => d.url.clone(),
            Db::My(d) => d.url.clone(),
        };
        let all = describe(self.engine, &self.src, &url, &self.into).await;
        all.into_iter()
            .find(|t| t.table.name == table)
            .expect("the table")
            .columns
    }

    /// `acct`'s columns and their types (sorted rows), on the target or on the source.
    pub async fn shape(&mut self, on_target: bool) -> Vec<String> {
        let sql = match (&self.src, on_target) {
            (Db::Pg(_), _) => "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute \
                               WHERE attrelid = 'public.acct'::regclass AND attnum > 0 \
                                 AND NOT attisdropped"
                .to_string(),
            (Db::My(d), _) => format!(
                "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = '{}' AND TABLE_NAME = 'acct'",
                if on_target { &self.into } else { &d.name }
            ),
        };
        if on_target {
            self.target_query(&sql).await
        } else {
            self.source_query(&sql).await
        }
    }

    /// End every session the target has open, as a dropped network would.
    pub async fn kill_target_sessions(&mut self) {
        let into = self.into.clone();
        match self.dst() {
            Db::Pg(d) => {
                d.exec(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid() \
                       AND application_name = 'sluice'",
                )
                .await
            }
            Db::My(d) => {
                let ids = d
                    .row_strings(&format!(
                        "SELECT ID FROM information_schema.PROCESSLIST \
                         WHERE ID <> CONNECTION_ID() AND DB IN ('{}', '{}')",
                        d.name, into
                    ))
                    .await;
                for id in ids {
                    d.exec(&format!("KILL {id}")).await;
                }
            }
        }
    }

    /// A session of worker `worker` of the suite's replication.
    pub async fn session(&self, worker: u32) -> Box<dyn ApplySession> {
        self.target
            .session(&self.name, worker)
            .await
            .expect("a session")
    }

    /// The applied position of the suite's replication.
    pub async fn applied(&self) -> Option<AppliedPosition> {
        self.target.applied(&self.name).await.expect("applied")
    }
}

/// `prepare` `target`'s bookkeeping and create `tables`; returns the notes it gives (what a
/// created table does not carry, how a type was mapped).
pub async fn create(target: &dyn ApplyTarget, tables: &[TargetTable]) -> Vec<String> {
    target.prepare().await.expect("prepare");
    target.create_tables(tables).await.expect("create_tables")
}

/// One change of a hand-built unit: its operation, its values as text (NULL as `None`), the
/// columns it does not carry.
pub struct Change {
    op: &'static str,
    values: Vec<Option<String>>,
    absent: Vec<&'static str>,
}

fn change(op: &'static str, values: &[Option<&str>], absent: &[&'static str]) -> Change {
    Change {
        op,
        values: values.iter().map(|v| v.map(str::to_string)).collect(),
        absent: absent.to_vec(),
    }
}

/// An insert of `values`.
pub fn ins(values: &[Option<&str>]) -> Change {
    change("insert", values, &[])
}

/// An update to `values`, leaving the columns `absent` as they are.
pub fn upd(values: &[Option<&str>], absent: &[&'static str]) -> Change {
    change("update", values, absent)
}

/// A delete of the row `values` names (its key; every column for a table without one).
pub fn del(values: &[Option<&str>]) -> Change {
    change("delete", values, &[])
}

/// The rows of one table in a unit, as the runner hands them over: each value cast from text
/// to its column's Arrow type, then the change columns.
pub fn rows(t: &TargetTable, key: &[&str], changes: &[Change]) -> UnitTable {
    let schema = change_schema(&t.table, &t.columns).expect("a change schema");
    let mut arrays: Vec<ArrayRef> = Vec::new();
    for (i, c) in t.columns.iter().enumerate() {
        let text: ArrayRef = Arc::new(StringArray::from(
            changes
                .iter()
                .map(|ch| ch.values[i].as_deref())
                .collect::<Vec<_>>(),
        ));
        arrays.push(arrow_cast::cast(&text, c.field.data_type()).expect("a cast value"));
    }
    let n = changes.len();
    arrays.push(Arc::new(StringArray::from(
        changes.iter().map(|c| c.op).collect::<Vec<_>>(),
    )));
    arrays.push(Arc::new(StringArray::from(vec!["0000000001000000"; n])));
    arrays.push(Arc::new(UInt64Array::from_iter_values(0..n as u64)));
    arrays.push(Arc::new(
        TimestampMicrosecondArray::from(vec![Some(1_700_000_000_000_000i64); n])
            .with_timezone("UTC"),
    ));
    arrays.push(Arc::new(StringArray::from(vec![Some("42"); n])));
    let mut absent = ListBuilder::new(StringBuilder::new());
    for c in changes {
        for a in &c.absent {
            absent.values().append_value(a);
        }
        absent.append(true);
    }
    arrays.push(Arc::new(absent.finish()));
    UnitTable {
        table: t.table.clone(),
        columns: Arc::new(t.columns.clone()),
        key: Arc::new(key.iter().map(|k| k.to_string()).collect()),
        batch: RecordBatch::try_new(schema, arrays).expect("a unit batch"),
        source_engine: t.source_engine,
        sole_key: false,
    }
}

/// A unit of the tables' rows in order: every row of table 0, then of table 1, …
pub fn unit(tables: Vec<UnitTable>) -> ApplyUnit {
    let order = tables
        .iter()
        .enumerate()
        .flat_map(|(t, u)| (0..u.batch.num_rows() as u32).map(move |r| (t as u32, r)))
        .collect();
    ApplyUnit {
        tables,
        order,
        batches: Vec::new(),
    }
}

/// The position recorded with unit `unit`.
pub fn position(unit: u64) -> AppliedPosition {
    AppliedPosition {
        unit,
        restart: sluice_core::StreamPos::from_adapter(format!("{unit:016X}")),
        pos: sluice_core::StreamPos::from_adapter(format!("{:016X}", unit + 1)),
        commit_ts: Some(1_700_000_000_000_000 + unit as i64),
        skip: 0,
    }
}

/// Apply `u` and record `unit_no` in one transaction, committed.
pub async fn apply_commit(s: &mut Box<dyn ApplySession>, u: &ApplyUnit, unit_no: u64) {
    s.begin().await.expect("begin");
    s.apply(u).await.expect("apply");
    s.record(&position(unit_no)).await.expect("record");
    s.commit().await.expect("commit");
}
