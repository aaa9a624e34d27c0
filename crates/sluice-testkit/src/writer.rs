//! A task that commits transactions in a loop until stopped, counting its commits: the part
//! every test writer shares (PostgreSQL or MySQL/MariaDB, whatever each transaction does). A
//! test waits for a number of commits, never for a time, so "the writer ran meanwhile" holds
//! however slow the machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A running loop of transactions.
pub struct Background {
    stop: Arc<AtomicBool>,
    commits: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Background {
    /// Spawn `body`, given the stop flag to poll and the counter to bump after each commit.
    pub fn spawn<F, Fut>(body: F) -> Background
    where
        F: FnOnce(Arc<AtomicBool>, Arc<AtomicU64>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let commits = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(body(stop.clone(), commits.clone()));
        Background {
            stop,
            commits,
            task,
        }
    }

    /// Wait until the loop has committed `n` more transactions (a stuck writer fails the test
    /// after a minute rather than hanging it).
    pub async fn wait_for(&self, n: u64) {
        let target = self.commits.load(Ordering::Relaxed) + n;
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.commits.load(Ordering::Relaxed) < target {
            assert!(Instant::now() < deadline, "the writer is stuck");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The transactions committed so far.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Let the loop commit `n` more transactions, then stop it; returns the transactions
    /// committed.
    pub async fn stop_after(self, n: u64) -> u64 {
        self.wait_for(n).await;
        self.stop().await
    }

    /// Stop the loop; returns the transactions committed.
    pub async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the writer task");
        self.commits.load(Ordering::Relaxed)
    }
}
