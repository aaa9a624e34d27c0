//! Schema versions as the batcher records them: a version starts at the first change written
//! with it, whatever the source announced before.

use super::{Batcher, Budgets};
use crate::files::ChangeFiles;
use crate::metrics::Metrics;
use crate::state::{
    Committed, OutputState, STATE_VERSION, SnapshotState, StateStore, StreamState, TableState,
};
use arrow_schema::{DataType, Field};
use sluice_core::change::{CaptureNames, ChangeOp, ChangeSink, TxMeta};
use sluice_core::table::TableRef;
use sluice_core::{ColumnDesc, StreamPos};
use sluice_sink::{Destination, FormatOptions, LocalDestination};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

fn col(name: &str) -> ColumnDesc {
    ColumnDesc {
        name: name.into(),
        source_type: "bigint".into(),
        field: Field::new(name, DataType::Int64, true),
        cast: None,
        as_text_fallback: false,
    }
}

fn table() -> TableRef {
    TableRef {
        schema: "s".into(),
        name: "t".into(),
    }
}

fn batcher(dir: &std::path::Path) -> Batcher {
    let dest: Arc<dyn Destination> = Arc::new(LocalDestination::new(dir, false));
    let store: Arc<dyn StateStore> = Arc::new(OutputState::new(dest.clone()));
    let state = StreamState {
        version: STATE_VERSION,
        engine: sluice_core::apply::Engine::Mysql,
        source: "test".into(),
        names: CaptureNames {
            name: "n".into(),
            publication: String::new(),
        },
        publication_created: false,
        extension: "jsonl".into(),
        tables: BTreeMap::from([(
            "s.t".to_string(),
            TableState {
                table: table(),
                snapshot_position: None,
                versions: Vec::new(),
                missing: Vec::new(),
                columns: None,
                added: None,
                dropped: None,
            },
        )]),
        snapshot: SnapshotState {
            initial: "none".into(),
            done: true,
            positions: Vec::new(),
        },
        committed: Committed {
            restart_seq: 1,
            ..Committed::default()
        },
        intent: None,
        updated_at: String::new(),
        layout: None,
        ops: None,
        before_images: false,
    };
    let budgets = Budgets {
        batch_bytes: 1 << 30,
        batch_time: Duration::from_secs(3600),
        flush_bytes: 1 << 30,
    };
    Batcher::new(
        dest,
        FormatOptions::Jsonl(Default::default()),
        store,
        state,
        budgets,
        Arc::new(Metrics::default()),
        ChangeFiles::default(),
    )
}

/// One transaction at `pos` announcing each of `announced` in turn, then one insert.
fn change(b: &mut Batcher, pos: &str, announced: &[&[ColumnDesc]]) {
    b.begin(TxMeta {
        pos: StreamPos::from_adapter(pos),
        xid: String::new(),
        commit_ts: Some(0),
    })
    .expect("begin");
    let mut h = 0;
    for columns in announced {
        h = b.relation(&table(), columns).expect("relation");
    }
    let rows = b.row(h, ChangeOp::Insert).expect("row").expect("written");
    for c in rows.columns() {
        c.push_null();
    }
    b.row_done().expect("row done");
    b.commit(&StreamPos::from_adapter(format!("{pos}z")))
        .expect("commit");
}

/// (version, since_seq, column names) of the table's history.
fn history(b: &Batcher) -> Vec<(u32, u64, Vec<String>)> {
    b.state.tables["s.t"]
        .versions
        .iter()
        .map(|v| {
            let names = v.columns.iter().map(|c| c.0.clone()).collect();
            (v.version, v.since_seq, names)
        })
        .collect()
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-batch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn an_announcement_replaced_before_any_change_makes_no_version() {
    let dir = scratch("replaced");
    let mut b = batcher(&dir);
    let (wide, narrow) = ([col("a"), col("b"), col("c")], [col("a"), col("b")]);
    // A source that first announced columns ahead of the change, then the change's own.
    change(&mut b, "p1", &[&wide, &narrow]);
    change(&mut b, "p2", &[&wide]);
    b.cut().expect("cut");
    assert_eq!(
        history(&b),
        [(1, 1, names(&["a", "b"])), (2, 2, names(&["a", "b", "c"]))]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn columns_seen_before_start_a_new_version_when_they_come_back() {
    let dir = scratch("back");
    let mut b = batcher(&dir);
    let (one, two) = ([col("a")], [col("a"), col("b")]);
    change(&mut b, "p1", &[&one]);
    change(&mut b, "p2", &[&two]);
    change(&mut b, "p3", &[&one]);
    b.cut().expect("cut");
    // Version 1's columns again at `_seq` 3 are a third version: the history says which
    // columns each `_seq` was written with.
    assert_eq!(
        history(&b),
        [
            (1, 1, names(&["a"])),
            (2, 2, names(&["a", "b"])),
            (3, 3, names(&["a"]))
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
