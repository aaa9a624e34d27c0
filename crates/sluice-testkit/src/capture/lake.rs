//! The change-capture scenario of a lakehouse table (`sluice stream --format delta`): the
//! stream keeps each table's Delta table equal to the source through kills at every commit
//! point of the table path, read back by a reader sluice did not write (DuckDB's delta
//! extension) and compared with the source table.

use super::{ACCT, Capture, Engine, HIST, assert_writer_changes, state};
use crate::process;
use crate::scenario::Sluice;

const TABLES: [&str; 2] = ["acct", "hist"];

/// A writer commits multi-table transactions (updates, deletes, inserts, key updates) while
/// each run dies at one point of the snapshot's table commit or of a batch's merge (`exit`,
/// as `kill -9` would leave it: change files written, merge files written, table committed,
/// state saved); the next run continues. At the end each Delta table, read by DuckDB, equals
/// its source table (no row lost, none twice), each table version names the `_seq` and the
/// position it holds, and the change files still replay to the same rows.
pub async fn delta_table(sluice: &Sluice, engine: Engine) {
    let mut src = Capture::new(sluice, engine).await;
    src.create_accounts(5_000).await;
    let writer = src.start_writer(5_000).await;
    let to = process::tempdir();
    let args = [
        "--until-current",
        "--format",
        "delta",
        "--batch-bytes",
        "64KB",
    ];
    for spec in crate::lake::TABLE_COMMIT_POINTS {
        writer.wait_for(20).await;
        process::run_dying_at(&mut src.stream(&TABLES, to.path(), &args), spec);
    }
    let commits = writer.stop_after(20).await;
    src.run(&TABLES, to.path(), &args).ok();
    for (table, columns) in [("acct", ACCT), ("hist", HIST)] {
        let want = src.rows(table, columns).await;
        let got = crate::lake::duckdb_delta_strings(&to.path().join(src.dataset(table)));
        assert_eq!(got.len(), want.len(), "{table}: rows in the Delta table");
        assert_eq!(
            got, want,
            "{table}: the Delta table differs from the source"
        );
        let view = crate::lake::delta_view(&to.path().join(src.dataset(table)), None);
        let merges: Vec<u64> = view
            .history
            .iter()
            .filter(|c| c["operation"] == "MERGE")
            .map(|c| {
                c["sluice.seq"]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .expect("a merge names its _seq")
            })
            .collect();
        assert!(merges.len() >= 2, "{table}: {} merges", merges.len());
        assert!(
            merges.windows(2).all(|w| w[0] > w[1]),
            "{table}: each merge's _seq after the one before: {merges:?}"
        );
    }
    // The change files stay a complete log of the same changes.
    let r = src.assert_replay_equals(to.path(), "acct", ACCT).await;
    assert_writer_changes(&r, commits);
    assert_eq!(state(to.path())["snapshot"]["done"], true);
    src.drop_stream(&TABLES, to.path()).await;
}
