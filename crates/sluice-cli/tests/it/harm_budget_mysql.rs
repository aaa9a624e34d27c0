//! The harm budget on MariaDB: a foreign lock holds the canary (`--probe-sql`) past
//! `--max-latency`, new chunks wait and the run says why, then goes on once the lock is gone,
//! and the output is the table; the kit's replica (`--mariadb-replica`) with its SQL thread
//! stopped has an unknown lag, which pauses new chunks until replication runs again; an
//! unreachable `--replica` pauses the run and says so, and `sluice plan` says it could not be
//! read. Moments are placed with the `budget.before_chunk`
//! failpoint and the run's log lines (see `harm_budget.rs`).

use crate::common::{Failpoints, files, tempdir};
use crate::harm_budget::{Watched, export_cmd, plan_with_replica};
use mysql_async::prelude::Queryable;
use sluice_testkit::mysql::{TestDb, connect, replica_url};

async fn table(db: &mut TestDb) {
    db.exec(
        "CREATE TABLE t (id int PRIMARY KEY, v varchar(40)) ENGINE=InnoDB;
         INSERT INTO t SELECT seq, md5(seq) FROM seq_1_to_20000;
         CREATE TABLE canary (x int) ENGINE=InnoDB;
         INSERT INTO canary VALUES (1);
         ANALYZE TABLE t;",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_on_the_canary_pauses_new_chunks_until_it_is_gone() {
    let mut db = TestDb::new().await;
    table(&mut db).await;
    let out = tempdir();
    let to = out.path().join("out");
    let fp = Failpoints::new();
    let args = [
        "--parallel",
        "2",
        "--max-latency",
        "300ms",
        "--probe-sql",
        "SELECT COUNT(*) FROM canary",
    ];
    let cmd = export_cmd(&db.url, &to, &args, &fp, Some("budget.before_chunk=wait"));
    let mut run = Watched::spawn(cmd);
    fp.reached("budget.before_chunk", run.child.as_mut().unwrap())
        .await;
    let mut locker = connect(&db.url).await;
    locker.query_drop("LOCK TABLES canary WRITE").await.unwrap();
    run.wait_for("harm budget: paused: canary latency p95")
        .await;
    locker.query_drop("UNLOCK TABLES").await.unwrap();
    run.wait_for("harm budget: resumed").await;
    fp.release("budget.before_chunk");
    let (code, stderr) = run.finish().await;
    assert_eq!(code, 0, "{stderr}");
    let got = files::row_strings(&files::dataset_batches(&to.join(format!("{}.t", db.name))));
    files::assert_same_rows(&got, &db.row_strings("SELECT id, v FROM t").await, "t");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_replica_pauses_and_says_so() {
    let mut db = TestDb::new().await;
    table(&mut db).await;
    let nowhere = "mysql://root@127.0.0.1:1/mysql";
    let plan = plan_with_replica(&db.url, nowhere);
    plan.ok();
    assert!(
        plan.stdout.contains(
            "signal       replica lag (mysql://root@127.0.0.1:1/mysql): could not be read"
        ),
        "{}",
        plan.stdout
    );
    let out = tempdir();
    let fp = Failpoints::new();
    let args = ["--max-replica-lag", "5s", "--replica", nowhere];
    let mut run = Watched::spawn(export_cmd(&db.url, out.path(), &args, &fp, None));
    run.wait_for("harm budget: paused: replica lag (mysql://root@127.0.0.1:1/mysql) unreadable")
        .await;
    let stderr = run.kill();
    assert!(!out.path().join("manifest.json").exists(), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_replica_pauses_new_chunks_until_it_replicates_again() {
    let mut db = TestDb::new().await;
    table(&mut db).await;
    let mut replica = connect(&replica_url()).await;
    replica.query_drop("START SLAVE").await.unwrap();
    let out = tempdir();
    let to = out.path().join("out");
    let fp = Failpoints::new();
    let at = replica_url();
    let args = [
        "--parallel",
        "2",
        "--max-replica-lag",
        "2s",
        "--replica",
        &at,
    ];
    let cmd = export_cmd(&db.url, &to, &args, &fp, Some("budget.before_chunk=wait"));
    let mut run = Watched::spawn(cmd);
    fp.reached("budget.before_chunk", run.child.as_mut().unwrap())
        .await;
    replica.query_drop("STOP SLAVE SQL_THREAD").await.unwrap();
    run.wait_for("replication is stopped").await;
    fp.release("budget.before_chunk");
    replica.query_drop("START SLAVE SQL_THREAD").await.unwrap();
    let (code, stderr) = run.finish().await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("harm budget: paused: replica lag ("),
        "{stderr}"
    );
    assert!(stderr.contains("harm budget: resumed"), "{stderr}");
    let got = files::row_strings(&files::dataset_batches(&to.join(format!("{}.t", db.name))));
    files::assert_same_rows(&got, &db.row_strings("SELECT id, v FROM t").await, "t");
}
