//! The suites every source must pass (`sluice_testkit::scenario`), run over PostgreSQL,
//! MariaDB and Firebird: killed at a commit point and resumed, died after the last part and
//! resumed, a worker's session killed mid-chunk and retried.

use crate::common::harness;
use sluice_testkit::scenario::{self, Engine, Source};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_kill_then_resume() {
    scenario::kill_then_resume(&harness(), Source::new(Engine::Postgres).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_kill_then_resume() {
    scenario::kill_then_resume(&harness(), Source::new(Engine::Mariadb).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firebird_kill_then_resume() {
    scenario::kill_then_resume(&harness(), Source::new(Engine::Firebird).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_resume_after_the_last_part() {
    scenario::resume_after_the_last_part(&harness(), Source::new(Engine::Postgres).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_resume_after_the_last_part_takes_no_lock() {
    scenario::resume_after_the_last_part(&harness(), Source::new(Engine::Mariadb).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firebird_resume_after_the_last_part() {
    scenario::resume_after_the_last_part(&harness(), Source::new(Engine::Firebird).await).await;
}

/// PostgreSQL: the worker rejoins the exported snapshot on a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_killed_worker_is_retried() {
    scenario::killed_worker_is_retried(&harness(), Source::new(Engine::Postgres).await, &[]).await;
}

/// MariaDB: the worker continues on the spare session that began the snapshot under the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_killed_worker_continues_on_a_spare_session() {
    scenario::killed_worker_is_retried(&harness(), Source::new(Engine::Mariadb).await, &[]).await;
}

/// MariaDB, chunk consistency: the chunk is read again on a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_killed_worker_in_chunk_mode_is_retried() {
    scenario::killed_worker_is_retried(
        &harness(),
        Source::new(Engine::Mariadb).await,
        &["--consistency", "chunk"],
    )
    .await;
}

/// Firebird: the worker continues on a spare session joined to the same snapshot number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firebird_killed_worker_continues_on_a_spare_session() {
    scenario::killed_worker_is_retried(&harness(), Source::new(Engine::Firebird).await, &[]).await;
}
