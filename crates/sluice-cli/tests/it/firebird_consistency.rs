#![allow(clippy::unwrap_used)]
//! Firebird snapshot consistency under a writer in another process.
//!
//! Firebird shows a session that joins snapshot `n` (`SET TRANSACTION SNAPSHOT AT NUMBER n`)
//! every transaction numbered below that session's oldest interesting transaction as
//! committed, including one that committed after `n` was taken (see the documentation of
//! `sluice_firebird::snapshot`). The first test pins that behaviour down with attachments of
//! this process and shows that sluice's check of a join tells an exact join from an inexact
//! one. The second runs dozens of exports, pointer-page and key chunks, while a writer
//! process moves money between accounts, and checks that each export is one point in time:
//! every account once, the total unchanged. In half of them a transfer of the test's is
//! running when the snapshot is taken and commits between the joins of the first and the
//! second worker session (failpoint `firebird.before_join`): the moment that made exports
//! inconsistent, here made certain, after which sluice must take the snapshot again.
//!
//! Length: the writer process, the snapshot checks and the lost-coordinator scenario share one
//! setup.

use crate::common::*;
use sluice_core::{Consistency, Coordinator};
use sluice_firebird::FbTarget;
use sluice_firebird::read::{FbReader, JoinCheck};
use sluice_firebird::snapshot::FbCoordinator;
use sluice_testkit::firebird::{FbConn, TestFdb, Tx};
use sluice_testkit::firebird_writer::{BALANCE, create_accounts};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[test]
fn a_late_join_sees_a_later_commit_and_the_join_check_catches_it() {
    let db = TestFdb::new();
    create_accounts(&db.path, 2);
    let (mut writer, mut other) = (db.attach(), db.attach());
    // A transfer is running when the snapshot is taken.
    let mut transfer = writer.begin("SET TRANSACTION READ WRITE WAIT ISOLATION LEVEL SNAPSHOT");
    writer.exec_in(&mut transfer, "UPDATE ACC SET BAL = BAL - 5 WHERE ID = 1");
    writer.exec_in(&mut transfer, "UPDATE ACC SET BAL = BAL + 5 WHERE ID = 2");
    let transfer_id: u64 = writer.query_in(
        &mut transfer,
        "SELECT CURRENT_TRANSACTION FROM RDB$DATABASE",
    )[0]
    .parse()
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let target = FbTarget::parse(&db.url).unwrap();
        let mut coordinator =
            FbCoordinator::open(target.clone(), "t".into(), Consistency::Snapshot)
                .await
                .unwrap();
        let snapshot = coordinator.shared_snapshot().unwrap();
        assert!(snapshot.coordinator > transfer_id + 1, "{snapshot:?}");
        let join = format!(
            "SET TRANSACTION READ ONLY ISOLATION LEVEL SNAPSHOT AT NUMBER {}",
            snapshot.number
        );
        let accounts = "SELECT ID, BAL FROM ACC ORDER BY ID";
        let mut early = db.attach();
        let mut early_tx = early.begin(&join);
        let mut early_reader = FbReader::attach(&target, "t", true).await.unwrap();
        early_reader.join(snapshot).await.unwrap();

        writer.commit(transfer);
        // Read-write transactions move the oldest interesting transaction on the header page
        // past the transfer.
        for _ in 0..3 {
            other.row_strings_in(
                Some("SET TRANSACTION READ WRITE ISOLATION LEVEL SNAPSHOT"),
                "SELECT 1 FROM RDB$DATABASE",
            );
        }
        let mut late = db.attach();
        let mut late_tx = late.begin(&join);
        let mut late_reader = FbReader::attach(&target, "t", true).await.unwrap();
        late_reader.join(snapshot).await.unwrap();

        // Firebird: the snapshot does not have the transfer, a session joining it now does.
        assert_eq!(
            early.query_in(&mut early_tx, accounts),
            ["1|1000", "2|1000"]
        );
        assert_eq!(late.query_in(&mut late_tx, accounts), ["1|995", "2|1005"]);
        // sluice: the early join is exact, the late one names the transfer.
        assert_eq!(
            early_reader.check(snapshot).await.unwrap(),
            JoinCheck::Exact
        );
        match late_reader.check(snapshot).await.unwrap() {
            JoinCheck::Late { first, count, .. } => {
                assert_eq!((first, count), (transfer_id, 1));
            }
            JoinCheck::Exact => panic!("the late join was taken for exact"),
        }
        early.commit(early_tx);
        late.commit(late_tx);
        drop((early_reader, late_reader));
        coordinator.release().await.unwrap();
    });
}

/// The concurrent writer: `sluice-testkit firebird-writer` in a process of its own.
struct Writer {
    child: Child,
    commits: Arc<AtomicU64>,
}

impl Writer {
    fn start(db: &Path, accounts: u64) -> Writer {
        let kit = std::env::var_os("SLUICE_TESTKIT").map(PathBuf::from).unwrap_or_else(|| {
            panic!(
                "SLUICE_TESTKIT is not set: run the tests under `sluice-testkit run --firebird -- …` \
                 (./scripts/test does), which names itself there"
            )
        });
        let mut child = Command::new(kit)
            .arg("firebird-writer")
            .arg(db)
            .args(["--accounts", &accounts.to_string(), "--per-commit", "4"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let commits = Arc::new(AtomicU64::new(0));
        let out = BufReader::new(child.stdout.take().unwrap());
        let c = commits.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(|l| l.ok()) {
                if let Some(n) = line.strip_prefix("committed ") {
                    c.store(n.parse().unwrap_or(0), Ordering::Relaxed);
                }
            }
        });
        Writer { child, commits }
    }

    fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Wait until the writer has committed `n` transactions in all.
    fn wait_for(&mut self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.commits() < n {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the writer stopped: {status}");
            }
            assert!(Instant::now() < deadline, "the writer made no progress");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stop after the current transaction; the number of commits.
    fn stop(mut self) -> u64 {
        drop(self.child.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the writer failed: {status}");
        self.commits()
    }
}

/// A transfer the test holds open from before an export starts until its second worker
/// session is about to join the snapshot.
struct HeldTransfer {
    conn: FbConn,
    tx: Tx,
    id: u64,
}

impl HeldTransfer {
    fn start(db: &TestFdb, from: u64, to: u64) -> HeldTransfer {
        let mut conn = db.attach();
        let mut tx = conn.begin("SET TRANSACTION READ WRITE WAIT ISOLATION LEVEL SNAPSHOT");
        conn.exec_in(
            &mut tx,
            &format!("UPDATE ACC SET BAL = BAL - 5 WHERE ID = {from}"),
        );
        conn.exec_in(
            &mut tx,
            &format!("UPDATE ACC SET BAL = BAL + 5 WHERE ID = {to}"),
        );
        let id = conn.query_in(&mut tx, "SELECT CURRENT_TRANSACTION FROM RDB$DATABASE")[0]
            .parse()
            .unwrap();
        HeldTransfer { conn, tx, id }
    }

    /// Commit, then wait until a transaction starting now has an oldest interesting
    /// transaction above the transfer's (each read-write start moves it on the header page,
    /// once every older transaction has ended).
    fn commit_and_pass(mut self, writer: &mut Writer) {
        self.conn.commit(self.tx);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let oit: u64 = self.conn.row_strings_in(
                Some("SET TRANSACTION READ WRITE ISOLATION LEVEL SNAPSHOT"),
                "SELECT MON$OLDEST_TRANSACTION FROM MON$TRANSACTIONS \
                 WHERE MON$TRANSACTION_ID = CURRENT_TRANSACTION",
            )[0]
            .parse()
            .unwrap();
            if oit > self.id {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the oldest interesting transaction stays at {oit}, not past transfer {}",
                self.id
            );
            let n = writer.commits();
            writer.wait_for(n + 1);
        }
    }
}

/// `sluice export` of `ACC` to `out` by two workers, in parts of about 1 MB.
fn export_cmd(db: &TestFdb, out: &Path) -> Command {
    let mut cmd = sluice();
    cmd.args(["export", "--source", &db.url, "--to"])
        .arg(out)
        .args(words(
            "--table ACC --parallel 2 --chunk-size 1MB --batch-size 64KB",
        ));
    cmd
}

/// Export `ACC` and return what sluice printed. With `held`, the second worker session's join
/// waits (failpoint `firebird.before_join`) while the held transfer commits and the oldest
/// interesting transaction moves past it: the first session joined before the commit, the
/// second joins after it.
fn export_acc(
    db: &TestFdb,
    out: &Path,
    chunking: &[&str],
    writer: &mut Writer,
    held: Option<HeldTransfer>,
) -> String {
    let points = tempdir();
    let mut cmd = export_cmd(db, out);
    cmd.env("SLUICE_LOG", "warn,sluice::snapshot=debug")
        .args(chunking)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if held.is_some() {
        cmd.env("SLUICE_FAILPOINTS", "firebird.before_join=wait@2")
            .env("SLUICE_FAILPOINT_DIR", points.path());
    }
    let mut child = cmd.spawn().unwrap();
    if let Some(held) = held {
        let reached = points.path().join("firebird.before_join.reached");
        let deadline = Instant::now() + Duration::from_secs(120);
        while !reached.exists() {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the join failpoint was never reached"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        held.commit_and_pass(writer);
        std::fs::write(points.path().join("firebird.before_join.release"), "").unwrap();
    }
    let output = finish(child);
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{}:\n{printed}", output.status);
    printed
}

/// Ids and balances of an exported `ACC`.
fn accounts(out: &Path) -> Vec<(i64, i64)> {
    use arrow_array::Int64Array;
    let mut rows = Vec::new();
    for b in files::dataset_batches(&out.join("ACC")) {
        let col = |name: &str| {
            b.column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
                .unwrap_or_else(|| panic!("no BIGINT column {name}"))
                .clone()
        };
        let (ids, bals) = (col("ID"), col("BAL"));
        rows.extend(
            ids.values()
                .iter()
                .copied()
                .zip(bals.values().iter().copied()),
        );
    }
    rows
}

#[test]
fn exports_under_a_writer_process_are_one_point_in_time() {
    const ACCOUNTS: u64 = 50_000;
    const ROUNDS: usize = 40;
    let db = TestFdb::new();
    create_accounts(&db.path, ACCOUNTS);
    let mut writer = Writer::start(&db.path, ACCOUNTS);
    writer.wait_for(5);
    let mut failures = Vec::new();
    let mut during = 0;
    for round in 0..ROUNDS {
        let (what, chunking): (&str, &[&str]) = if round % 2 == 0 {
            ("pointer pages", &["--chunk-by", "pages"])
        } else {
            ("key ranges", &["--chunk-by", "key"])
        };
        let hold_join = round % 4 >= 2;
        let out = tempdir();
        let before = writer.commits();
        // The held transfer goes between the first and the last account, which the first and
        // the last chunk read.
        let held = hold_join.then(|| HeldTransfer::start(&db, 1, ACCOUNTS));
        let printed = export_acc(&db, out.path(), chunking, &mut writer, held);
        during += writer.commits() - before;
        if hold_join {
            // The second session's join was not exact; sluice took the snapshot again.
            assert!(
                printed.contains("before every worker could join it exactly"),
                "round {round} ({what}): no new snapshot after an inexact join:\n{printed}"
            );
        }
        let rows = accounts(out.path());
        let mut ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        ids.sort_unstable();
        ids.dedup();
        let total: i64 = rows.iter().map(|r| r.1).sum();
        let m = files::manifest(out.path());
        let parts = m["datasets"][0]["parts"].as_array().map_or(0, Vec::len);
        assert!(parts >= 2, "{what}: only {parts} part(s)");
        assert_eq!(m["snapshots"][0]["position"]["engine"], "firebird");
        let whole = ids.len() == ACCOUNTS as usize
            && rows.len() == ids.len()
            && ids.first() == Some(&1)
            && ids.last() == Some(&(ACCOUNTS as i64));
        if !whole || total != ACCOUNTS as i64 * BALANCE {
            failures.push(format!(
                "round {round} ({what}{}): {} rows, {} distinct ids, total {total} (want {}), \
                 snapshot {}",
                if hold_join { ", transfer held" } else { "" },
                rows.len(),
                ids.len(),
                ACCOUNTS as i64 * BALANCE,
                m["snapshots"][0]["position"]
            ));
        }
    }
    let commits = writer.stop();
    assert!(
        during > 0,
        "the writer committed nothing during the exports"
    );
    assert!(
        failures.is_empty(),
        "{} of {ROUNDS} exports were not one point in time (the writer committed {commits} \
         transactions, {during} during exports):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `(attachment id, open statements reading ACC)` of the run's attachments (those tagged with
/// `SLUICE_TAG`), in attachment order: the coordinator attaches first.
fn run_attachments(db: &TestFdb) -> Vec<(u64, u64)> {
    db.row_strings(
        "SELECT a.MON$ATTACHMENT_ID, (SELECT COUNT(*) FROM MON$STATEMENTS s \
           WHERE s.MON$ATTACHMENT_ID = a.MON$ATTACHMENT_ID AND s.MON$STATE > 0 \
           AND s.MON$SQL_TEXT CONTAINING 'FROM \"ACC\"') \
         FROM MON$ATTACHMENTS a WHERE EXISTS (SELECT 1 FROM MON$CONTEXT_VARIABLES v \
           WHERE v.MON$ATTACHMENT_ID = a.MON$ATTACHMENT_ID AND v.MON$VARIABLE_NAME = 'SLUICE_TAG')",
    )
    .iter()
    .map(|r| {
        let (a, n) = r.split_once('|').unwrap();
        (a.parse().unwrap(), n.parse().unwrap())
    })
    .collect::<std::collections::BTreeMap<_, _>>()
    .into_iter()
    .collect()
}

/// Start an export of `ACC` whose workers stop after their first batch
/// (`export.after_batch=wait`), kill the attachment `pick` chooses once both workers are
/// reading, let the run go on and return what it printed, with its exit code.
fn export_and_kill(db: &TestFdb, out: &Path, pick: impl Fn(&[(u64, u64)]) -> u64) -> (i32, String) {
    let points = tempdir();
    let child = export_cmd(db, out)
        .env("SLUICE_FAILPOINTS", "export.after_batch=wait")
        .env("SLUICE_FAILPOINT_DIR", points.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let attachments = loop {
        let a = run_attachments(db);
        // Both workers are inside a chunk, and none can finish it before the release.
        if a.iter().filter(|(_, reading)| *reading > 0).count() == 2 {
            break a;
        }
        assert!(
            Instant::now() < deadline,
            "the workers never started reading: {a:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let victim = pick(&attachments);
    db.exec(&format!(
        "DELETE FROM MON$ATTACHMENTS WHERE MON$ATTACHMENT_ID = {victim}"
    ));
    std::fs::write(points.path().join("export.after_batch.release"), "").unwrap();
    let output = finish(child);
    (
        output.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

/// Every account once and the total unchanged.
fn assert_one_point(out: &Path, accounts_n: u64, what: &str) {
    let rows = accounts(out);
    let mut ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        (rows.len(), ids.len()),
        (accounts_n as usize, accounts_n as usize),
        "{what}"
    );
    let total: i64 = rows.iter().map(|r| r.1).sum();
    assert_eq!(
        total,
        accounts_n as i64 * BALANCE,
        "{what}: the total moved"
    );
}

#[test]
fn a_worker_whose_attachment_is_killed_continues_on_a_spare_session_of_the_snapshot() {
    const ACCOUNTS: u64 = 50_000;
    let db = TestFdb::new();
    create_accounts(&db.path, ACCOUNTS);
    let mut writer = Writer::start(&db.path, ACCOUNTS);
    writer.wait_for(5);
    let out = tempdir();
    // A worker: an attachment reading ACC.
    let (code, printed) = export_and_kill(&db, out.path(), |a| {
        a.iter().find(|(_, reading)| *reading > 0).unwrap().0
    });
    writer.stop();
    assert_eq!(code, 0, "{printed}");
    assert!(
        printed.contains("replaced by spare sessions of the same snapshot"),
        "{printed}"
    );
    assert_one_point(out.path(), ACCOUNTS, "after a worker was killed");
    let m = files::manifest(out.path());
    assert_eq!(m["snapshots"].as_array().unwrap().len(), 1, "{m}");
}

#[test]
fn a_lost_coordinator_fails_the_run_before_its_snapshot_can_lie_and_resume_finishes() {
    const ACCOUNTS: u64 = 50_000;
    let db = TestFdb::new();
    create_accounts(&db.path, ACCOUNTS);
    let out = tempdir();
    // The coordinator: the run's first attachment, reading nothing.
    let (code, printed) = export_and_kill(&db, out.path(), |a| {
        assert_eq!(a[0].1, 0, "{a:?}");
        a[0].0
    });
    assert_eq!(code, 3, "{printed}");
    assert!(
        printed.contains("ended during the read") && printed.contains("--resume"),
        "{printed}"
    );
    assert!(!out.path().join("manifest.json").exists());
    let same = ["--table", "ACC", "--parallel", "2", "--chunk-size", "1MB"];
    export(
        &db.url,
        out.path(),
        &[&same[..], &["--batch-size", "64KB", "--resume"]].concat(),
    )
    .ok();
    assert_one_point(out.path(), ACCOUNTS, "after --resume");
    let m = files::manifest(out.path());
    assert_eq!(m["snapshots"].as_array().unwrap().len(), 2, "{m}");
}
