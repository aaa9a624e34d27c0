//! Who may write a stream's output and state, for as long as a run lasts: the output's lock is
//! taken before anything of the output is inspected or removed (an interrupted snapshot's
//! unfinished parts) and held across the snapshot and the streaming, and a state store's
//! claim (Redis) is kept alive however long the initial snapshot takes.

use super::stream::{assert_replay_equals_table, create_acct, slots_and_publications, stream};
use crate::common::{Failpoints, Run, TestDb, finish, run, tempdir};
use std::path::Path;
use std::process::Child;
use std::time::Duration;

/// The receipts and part files of the output's initial snapshot.
fn snapshot_files(to: &Path) -> Vec<String> {
    crate::common::files_under(to)
        .into_iter()
        .filter(|f| f.contains("part-") && !f.contains("/changes/"))
        .collect()
}

/// A stream of `args` into `to`, paused in its initial snapshot after its first part's
/// receipt (release `export.after_receipt` on `fp`).
async fn paused_in_snapshot(url: &str, to: &Path, args: &[&str], fp: &Failpoints) -> Child {
    let mut first = stream(url, to, args);
    fp.arm(&mut first, "export.after_receipt=wait@1");
    let mut child = crate::common::spawn(&mut first);
    fp.reached("export.after_receipt", &mut child).await;
    child
}

/// A second stream on an output whose first stream is inside its initial snapshot is refused
/// before it touches anything: it used to remove the first one's unfinished parts (they looked
/// like an interrupted snapshot's) and then find the output locked, and the first then failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_stream_on_an_output_is_refused_before_it_touches_it() {
    let db = TestDb::new().await;
    create_acct(&db, 3_000).await;
    let to = tempdir();
    let args = ["--until-current", "--chunk-size", "64KB"];
    let fp = Failpoints::new();
    let child = paused_in_snapshot(&db.url, to.path(), &args, &fp).await;
    let before = snapshot_files(to.path());
    assert!(!before.is_empty());
    let second = run(&mut stream(&db.url, to.path(), &args));
    second.refused(2, &["another sluice run is writing"]);
    assert_eq!(
        snapshot_files(to.path()),
        before,
        "the refused run removed files"
    );
    fp.release("export.after_receipt");
    let r: Run = finish(child).into();
    r.ok();
    assert_replay_equals_table(&db, to.path()).await;
    run(&mut stream(&db.url, to.path(), &["--drop"])).ok();
    assert_eq!(slots_and_publications(&db).await, (0, 0));
}

/// A state claim that lives 3 s (`claim_ttl=3`) outlives an initial snapshot paused for three
/// times that: it is refreshed while the snapshot runs, so another stream on the same state is
/// refused meanwhile and the first goes on into streaming (it used to stop with "the stream's
/// lock … expired" right after its snapshot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_longer_than_the_state_claim_keeps_the_claim() {
    let redis = sluice_testkit::redis::server_url();
    let db = TestDb::new().await;
    create_acct(&db, 3_000).await;
    let to = tempdir();
    let state = format!("{redis}/0?key=claim-{}&claim_ttl=3", db.name);
    let args = ["--until-current", "--chunk-size", "64KB", "--state", &state];
    let fp = Failpoints::new();
    let child = paused_in_snapshot(&db.url, to.path(), &args, &fp).await;
    // Past three lifetimes of the claim.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let second = run(&mut stream(&db.url, to.path(), &args));
    second.refused(2, &["another stream is running"]);
    fp.release("export.after_receipt");
    db.exec("UPDATE acct SET v = v + 1 WHERE id <= 100").await;
    let r: Run = finish(child).into();
    r.ok();
    assert_replay_equals_table(&db, to.path()).await;
    run(&mut stream(
        &db.url,
        to.path(),
        &["--drop", "--state", &state],
    ))
    .ok();
    assert_eq!(slots_and_publications(&db).await, (0, 0));
}

/// An output another run completed (an export, or a stream whose state `--drop` removed) is
/// refused before the capture's slot is made, naming what to do instead; it used to be
/// refused by the snapshot's export after the slot existed, telling to use `--overwrite`,
/// which a stream does not take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_into_a_completed_output_is_refused_before_its_slot() {
    let db = TestDb::new().await;
    create_acct(&db, 100).await;
    let to = tempdir();
    run(&mut stream(&db.url, to.path(), &["--until-current"])).ok();
    run(&mut stream(&db.url, to.path(), &["--drop"])).ok();
    for _ in 0..2 {
        run(&mut stream(&db.url, to.path(), &["--until-current"]))
            .refused(2, &["complete export (manifest.json)", "another --to"]);
        assert_eq!(slots_and_publications(&db).await, (0, 0));
    }
}
