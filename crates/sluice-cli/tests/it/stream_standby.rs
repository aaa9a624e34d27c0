//! `sluice stream --standby` with the state in Redis, a writer running: a standby waits while
//! the active stream holds the claim, takes over when the active one is killed (`kill -9`),
//! and the change files of both replay exactly to the table; a stream paused (SIGSTOP) past
//! its claim's life, replaced by a standby, and woken finds its writes refused and stops
//! without touching the new holder's state. The same with the state kept with the output: on
//! local disk (the standby takes over when the holder is killed) and on an object store (a
//! paused holder's state write, conditional on the version it last wrote, is refused after a
//! takeover). Without `--standby` a second stream is refused (`stream.rs`). `sluice replicate
//! --standby` takes over a killed replication and the target comes to equal the source.

use crate::common::{self, TestDb, run, tempdir};
use crate::stream::{assert_replay_equals_table, redis_get, stream};
use sluice_testkit::capture::{Engine, start_writer, tables_sql};
use std::process::Child;
use std::time::{Duration, Instant};

/// The state of stream `key` in Redis, as JSON.
fn state(redis: &str, key: &str) -> serde_json::Value {
    serde_json::from_str(&redis_get(redis, key).expect("the state is in Redis")).unwrap()
}

/// `sluice stream` of `url` into `to`, started, logging what a standby says.
fn spawn(url: &str, to: &std::path::Path, args: &[&str]) -> Child {
    common::spawn(stream(url, to, args).env("SLUICE_LOG", "info"))
}

/// The state `now` is not older than `then`: no batch and no save undone.
fn assert_not_back(then: &serde_json::Value, now: &serde_json::Value) {
    assert!(
        now["committed"]["batches"].as_u64() >= then["committed"]["batches"].as_u64()
            && now["updated_at"].as_str() >= then["updated_at"].as_str(),
        "the state went back: {then} → {now}"
    );
}

/// The child's stderr as it is written, collected by a thread of its own.
fn tail(child: &mut Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (mut err, into) = (child.stderr.take().unwrap(), log.clone());
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = std::io::Read::read(&mut err, &mut buf) {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    log
}

/// Wait until `done` holds, failing after a minute or when `alive` ended.
async fn until(what: &str, alive: &mut Child, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not in time");
        if alive.try_wait().unwrap().is_some() {
            let mut err = String::new();
            if let Some(e) = alive.stderr.as_mut() {
                let _ = std::io::Read::read_to_string(e, &mut err);
            }
            panic!("{what}: the stream ended:\n{err}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_from_a_killed_stream_with_no_change_lost_or_repeated() {
    let redis = sluice_testkit::redis::server_url();
    let db = TestDb::new().await;
    db.exec(&tables_sql(Engine::Postgres, 2_000)).await;
    let to = tempdir();
    let key = format!("standby-{}", db.name);
    let st = format!("{redis}/0?key={key}&claim_ttl=3");
    let args = ["--state", st.as_str()];
    let writer = start_writer(Engine::Postgres, &db.url, 2_000, 10_000_000).await;
    let mut active = spawn(&db.url, to.path(), &args);
    until("the active stream's snapshot", &mut active, || {
        redis_get(&redis, &key).is_some_and(|s| s.contains("\"done\":true"))
    })
    .await;
    let standby_args = [&args[..], &["--standby"]].concat();
    let mut standby = spawn(&db.url, to.path(), &standby_args);
    let batches = |s: &serde_json::Value| s["committed"]["batches"].as_u64().unwrap();
    let before = batches(&state(&redis, &key));
    until(
        "the active stream commits while the standby waits",
        &mut standby,
        || batches(&state(&redis, &key)) >= before + 3,
    )
    .await;
    common::signal(&active, libc::SIGKILL);
    let _ = active.wait();
    // The standby holds the claim and commits batches of its own.
    let lock = format!("{key}:lock");
    let pid = format!("stream-{}", standby.id());
    until("the standby takes the claim", &mut standby, || {
        redis_get(&redis, &lock).is_some_and(|h| h.contains(&pid))
    })
    .await;
    let taken = batches(&state(&redis, &key));
    writer.wait_for(30).await;
    until("the standby commits", &mut standby, || {
        batches(&state(&redis, &key)) > taken
    })
    .await;
    writer.stop().await;
    let err = common::stop(standby);
    assert!(err.contains("standby: took over"), "{err}");
    // What the standby had not drained when stopped, then the replay against the table.
    run(&mut stream(
        &db.url,
        to.path(),
        &[&args[..], &["--until-current"]].concat(),
    ))
    .ok();
    assert_replay_equals_table(&db, to.path()).await;
    run(&mut stream(&db.url, to.path(), &["--state", &st, "--drop"])).ok();
}

/// On MariaDB, whose binary log any number of sessions may read (a PostgreSQL slot stays busy
/// with the paused stream's session until the server's wal_sender_timeout ends it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_stream_replaced_by_a_standby_cannot_write_state_when_it_wakes() {
    let redis = sluice_testkit::redis::server_url();
    let mut db = sluice_testkit::mysql::TestDb::new().await;
    db.exec(
        "CREATE TABLE acct (id bigint PRIMARY KEY, v int NOT NULL);
         INSERT INTO acct VALUES (1, 0), (2, 0), (3, 0);",
    )
    .await;
    // Two outputs on one state: the paused stream's output lock (a flock it still holds)
    // would keep the standby waiting; its state is what fencing protects.
    let (old_out, new_out) = (tempdir(), tempdir());
    let key = format!("fence-{}", db.name);
    let st = format!("{redis}/0?key={key}&claim_ttl=3");
    let args = ["--state", st.as_str()];
    let fp = common::Failpoints::new();
    let mut cmd = crate::mysql_stream::stream(&db.url, &["acct"], old_out.path(), &args);
    fp.arm(&mut cmd, "stream.before_intent=wait@1");
    let mut old = common::spawn(&mut cmd);
    until("the first stream's snapshot", &mut old, || {
        redis_get(&redis, &key).is_some_and(|s| s.contains("\"done\":true"))
    })
    .await;
    // The first stream stops just before recording a batch's intent, and is paused there past
    // its claim's life.
    db.exec("UPDATE acct SET v = v + 1").await;
    fp.reached("stream.before_intent", &mut old).await;
    common::signal(&old, libc::SIGSTOP);
    let mut new = common::spawn(&mut crate::mysql_stream::stream(
        &db.url,
        &["acct"],
        new_out.path(),
        &[&args[..], &["--standby"]].concat(),
    ));
    let lock = format!("{key}:lock");
    let pid = format!("stream-{}", new.id());
    until("the standby takes the expired claim", &mut new, || {
        redis_get(&redis, &lock).is_some_and(|h| h.contains(&pid))
    })
    .await;
    until("the standby commits the update", &mut new, || {
        state(&redis, &key)["committed"]["changes"]
            .as_u64()
            .unwrap()
            >= 3
    })
    .await;
    let then = state(&redis, &key);
    // The paused stream wakes and goes on to record its intent: refused, it stops.
    common::signal(&old, libc::SIGCONT);
    fp.release("stream.before_intent");
    let out = common::finish(old);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the woken stream went on:\n{err}");
    assert!(err.contains("claim") || err.contains("lock"), "{err}");
    assert!(
        new.try_wait().unwrap().is_none(),
        "the standby is still streaming"
    );
    // Its batch was never committed: no change file of it (the standby wrote those changes).
    let dataset = format!("{}.acct", db.name);
    let written = sluice_testkit::changes::change_files(&old_out.path().join(&dataset));
    assert!(
        written.is_empty(),
        "the paused stream committed {written:?}"
    );
    let theirs = sluice_testkit::changes::change_files(&new_out.path().join(&dataset));
    assert!(!theirs.is_empty(), "the standby wrote the update");
    let now = state(&redis, &key);
    assert_not_back(&then, &now);
    common::stop(new);
    let r = common::run(&mut crate::mysql_stream::stream(
        &db.url,
        &["acct"],
        new_out.path(),
        &["--state", &st, "--drop"],
    ));
    r.ok();
}

/// The state kept with a local output: the standby waits on the output's lock (a `flock`),
/// which the kernel releases when the active stream is killed, and takes over from its last
/// committed batch under a writer; the replay equals the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_on_a_local_output_takes_over_from_a_killed_stream() {
    let db = TestDb::new().await;
    db.exec(&tables_sql(Engine::Postgres, 2_000)).await;
    let to = tempdir();
    let local = |to: &std::path::Path| {
        std::fs::read(to.join("_sluice/stream.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
    };
    let batches = |to: &std::path::Path| {
        local(to).map_or(0, |s| s["committed"]["batches"].as_u64().unwrap_or(0))
    };
    let writer = start_writer(Engine::Postgres, &db.url, 2_000, 10_000_000).await;
    let mut active = spawn(&db.url, to.path(), &[]);
    until("the active stream's snapshot", &mut active, || {
        local(to.path()).is_some_and(|s| s["snapshot"]["done"] == true)
    })
    .await;
    let mut standby = spawn(&db.url, to.path(), &["--standby"]);
    let before = batches(to.path());
    until(
        "the active stream commits while the standby waits",
        &mut standby,
        || batches(to.path()) >= before + 3,
    )
    .await;
    common::signal(&active, libc::SIGKILL);
    let _ = active.wait();
    let log = tail(&mut standby);
    until("the standby takes the output", &mut standby, || {
        log.lock().unwrap().contains("standby: took over")
    })
    .await;
    let taken = batches(to.path());
    writer.wait_for(30).await;
    until("the standby commits", &mut standby, || {
        batches(to.path()) > taken
    })
    .await;
    writer.stop().await;
    common::stop(standby);
    run(&mut stream(&db.url, to.path(), &["--until-current"])).ok();
    assert_replay_equals_table(&db, to.path()).await;
    run(&mut stream(&db.url, to.path(), &["--drop"])).ok();
}

/// The stream state kept in an object-store output, as JSON.
async fn remote(store: &sluice_sink::ObjectStoreDestination) -> Option<serde_json::Value> {
    use sluice_sink::Destination;
    store
        .get("_sluice/stream.json")
        .await
        .unwrap()
        .map(|b| serde_json::from_slice(&b).unwrap())
}

/// The state kept with an object-store output: a stream paused (SIGSTOP) just before
/// recording a batch's intent loses the output (its lock, gone stale, is taken: the test
/// removes it rather than wait the two minutes), a standby takes over and commits the batch's
/// changes; the woken stream's state write names a version the standby replaced, is refused,
/// and the stream stops without committing a file or moving the state back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_stream_on_an_object_store_cannot_write_state_after_a_takeover() {
    use sluice_sink::Destination;
    use sluice_testkit::objstore::{Store, test_url};
    let mut db = sluice_testkit::mysql::TestDb::new().await;
    db.exec(
        "CREATE TABLE acct (id bigint PRIMARY KEY, v int NOT NULL);
         INSERT INTO acct VALUES (1, 0), (2, 0), (3, 0);",
    )
    .await;
    let url = test_url(Store::S3);
    let to = std::path::Path::new(&url);
    let store = crate::objstore_common::open(&url);
    let fp = common::Failpoints::new();
    let mut cmd = crate::mysql_stream::stream(&db.url, &["acct"], to, &[]);
    fp.arm(&mut cmd, "stream.before_intent=wait@1");
    let mut old = common::spawn(&mut cmd);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !remote(&store)
        .await
        .is_some_and(|s| s["snapshot"]["done"] == true)
    {
        assert!(
            Instant::now() < deadline,
            "the first stream's snapshot: not in time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    db.exec("UPDATE acct SET v = v + 1").await;
    fp.reached("stream.before_intent", &mut old).await;
    common::signal(&old, libc::SIGSTOP);
    store.delete("_sluice/lock.json").await.unwrap();
    let mut new = common::spawn(
        crate::mysql_stream::stream(&db.url, &["acct"], to, &["--standby"])
            .env("SLUICE_LOG", "info"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while remote(&store)
        .await
        .is_none_or(|s| s["committed"]["changes"].as_u64().unwrap_or(0) < 3)
    {
        assert!(
            Instant::now() < deadline,
            "the standby commits the update: not in time"
        );
        assert!(new.try_wait().unwrap().is_none(), "the standby ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let then = remote(&store).await.unwrap();
    common::signal(&old, libc::SIGCONT);
    fp.release("stream.before_intent");
    let out = common::finish(old);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the woken stream went on:\n{err}");
    assert!(err.contains("another run"), "{err}");
    assert!(
        new.try_wait().unwrap().is_none(),
        "the standby is still streaming"
    );
    let now = remote(&store).await.unwrap();
    assert_not_back(&then, &now);
    common::stop(new);
    let local = tempdir();
    crate::objstore_common::download(&url, local.path()).await;
    let want = db.row_strings("SELECT id, v FROM acct").await;
    let dataset = format!("{}.acct", db.name);
    let r = sluice_testkit::changes::assert_replay_equals(local.path(), &dataset, &["id"], &want);
    assert_eq!(
        r.changes.len(),
        3,
        "the three updates, written once (by the standby)"
    );
    run(&mut crate::mysql_stream::stream(
        &db.url,
        &["acct"],
        to,
        &["--drop"],
    ))
    .ok();
}

/// `sluice replicate --standby`: a standby waits while the running replication holds its lock
/// on the target, takes over when that run is killed, and the target comes to equal the source
/// (the writer's tables, changed before, during and after the kill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replication_standby_takes_over_from_a_killed_run() {
    let (source, target) = (TestDb::new().await, TestDb::new().await);
    source.exec(&tables_sql(Engine::Postgres, 2_000)).await;
    let writer = start_writer(Engine::Postgres, &source.url, 2_000, 10_000_000).await;
    let replicate = |extra: &[&str]| {
        common::spawn(
            common::replicate(&source.url, &target.url)
                .args(["--table", "public.acct", "--table", "public.hist"])
                .args(extra)
                .env("SLUICE_LOG", "info"),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut active = replicate(&[]);
    let active_log = tail(&mut active);
    // The initial load is done once its last phase is logged; the run then applies changes.
    while !active_log.lock().unwrap().contains("phase 8/8") {
        assert!(Instant::now() < deadline, "the initial load did not finish");
        assert!(
            active.try_wait().unwrap().is_none(),
            "the replication ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut standby = replicate(&["--standby"]);
    let standby_log = tail(&mut standby);
    while !standby_log.lock().unwrap().contains("standby: ") {
        assert!(
            Instant::now() < deadline,
            "the standby did not start waiting"
        );
        assert!(standby.try_wait().unwrap().is_none(), "the standby ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    writer.wait_for(20).await;
    assert!(standby.try_wait().unwrap().is_none(), "the standby waits");
    common::signal(&active, libc::SIGKILL);
    let _ = active.wait();
    writer.stop_after(30).await;
    let same = || async {
        let mut equal = true;
        for sql in [
            "SELECT id, v, pad FROM public.acct",
            "SELECT id, acct, amount FROM public.hist",
        ] {
            equal &= source.row_strings(sql).await == target.row_strings(sql).await;
        }
        equal
    };
    while !same().await {
        assert!(
            Instant::now() < deadline + Duration::from_secs(60),
            "the target never caught up"
        );
        if standby.try_wait().unwrap().is_some() {
            let out = common::finish(standby);
            panic!(
                "the standby ended:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    common::signal(&standby, libc::SIGTERM);
    assert!(standby.wait().unwrap().success());
    let log = standby_log.lock().unwrap().clone();
    assert!(log.contains("standby: took over replication"), "{log}");
    assert!(
        !log.contains("initial load"),
        "the standby went on from the applied position:\n{log}"
    );
    run(common::replicate(&source.url, &target.url).args([
        "--table",
        "public.acct",
        "--table",
        "public.hist",
        "--drop",
    ]))
    .ok();
}
