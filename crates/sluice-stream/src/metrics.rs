//! Prometheus metrics of a running stream (`--metrics-addr HOST:PORT`, path `/metrics`).
//!
//! A plain HTTP/1.1 responder on a Tokio listener: monitoring scrapes a handful of counters
//! and gauges every few seconds, which needs no web framework. Every request gets the metrics,
//! whatever its path.

use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Counters and gauges, updated by the runner as it goes.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Changes written.
    pub changes: AtomicU64,
    /// Transactions seen.
    pub transactions: AtomicU64,
    /// Batches committed.
    pub batches: AtomicU64,
    /// Change files committed.
    pub files: AtomicU64,
    /// Bytes of change files committed.
    pub bytes_written: AtomicU64,
    /// Last `_seq` committed.
    pub committed_seq: AtomicU64,
    /// The committed restart position as a number (`ChangeSource::position_number`:
    /// PostgreSQL's LSN; MySQL/MariaDB file sequence × 2^40 + offset).
    pub committed_position: AtomicU64,
    /// Log the source keeps for the stream, bytes.
    pub retained_bytes: AtomicU64,
    /// Log between the confirmed position and the source's end, bytes.
    pub lag_bytes: AtomicU64,
    /// Seconds between the last transaction's commit and now (milliseconds stored).
    pub lag_millis: AtomicU64,
    /// Seconds since the source was last told a position is durable (milliseconds stored).
    pub since_confirm_millis: AtomicU64,
    /// Errors that ended or interrupted streaming.
    pub errors: AtomicU64,
    /// Changes the source sent for tables the stream does not capture (a captured table
    /// renamed on the source: its changes arrive under the new name), left out.
    pub ignored_changes: AtomicU64,
    /// Changes of operations `--ops` leaves out of the change files.
    pub filtered_changes: AtomicU64,
    /// Reconnects after transient errors.
    pub retries: AtomicU64,
    /// The largest lag seen, milliseconds.
    pub peak_lag_millis: AtomicU64,
    /// 1 once the initial snapshot is done and changes are read (not exported).
    pub streaming: AtomicU64,
}

impl Metrics {
    /// The metrics in Prometheus' text format.
    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut one = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP sluice_stream_{name} {help}");
            let _ = writeln!(out, "# TYPE sluice_stream_{name} {kind}");
            let _ = writeln!(out, "sluice_stream_{name} {value}");
        };
        one(
            "changes_total",
            "counter",
            "Changes written.",
            g(&self.changes).to_string(),
        );
        one(
            "transactions_total",
            "counter",
            "Source transactions seen.",
            g(&self.transactions).to_string(),
        );
        one(
            "batches_total",
            "counter",
            "Batches committed.",
            g(&self.batches).to_string(),
        );
        one(
            "files_total",
            "counter",
            "Change files committed.",
            g(&self.files).to_string(),
        );
        one(
            "bytes_written_total",
            "counter",
            "Bytes of change files committed.",
            g(&self.bytes_written).to_string(),
        );
        one(
            "committed_seq",
            "gauge",
            "Last _seq committed.",
            g(&self.committed_seq).to_string(),
        );
        one(
            "committed_position",
            "gauge",
            "Committed restart position as a number (PostgreSQL: the LSN; MySQL/MariaDB: binary log file sequence * 2^40 + offset).",
            g(&self.committed_position).to_string(),
        );
        one(
            "retained_bytes",
            "gauge",
            "Log the source keeps for this stream (PostgreSQL: WAL retained by the slot).",
            g(&self.retained_bytes).to_string(),
        );
        one(
            "lag_bytes",
            "gauge",
            "Log between the confirmed position and the source's current end.",
            g(&self.lag_bytes).to_string(),
        );
        one(
            "lag_seconds",
            "gauge",
            "Seconds from the last transaction's commit to now while behind; 0 when caught up.",
            format!("{:.3}", g(&self.lag_millis) as f64 / 1000.0),
        );
        one(
            "seconds_since_confirm",
            "gauge",
            "Seconds since the source was last told a position is durable.",
            format!("{:.3}", g(&self.since_confirm_millis) as f64 / 1000.0),
        );
        one(
            "errors_total",
            "counter",
            "Errors.",
            g(&self.errors).to_string(),
        );
        one(
            "retries_total",
            "counter",
            "Reconnects after transient errors.",
            g(&self.retries).to_string(),
        );
        one(
            "ignored_changes_total",
            "counter",
            "Changes of tables the stream does not capture (a captured table renamed on the \
             source), left out.",
            g(&self.ignored_changes).to_string(),
        );
        one(
            "filtered_changes_total",
            "counter",
            "Changes of operations --ops leaves out of the change files.",
            g(&self.filtered_changes).to_string(),
        );
        out
    }
}

/// Serve `metrics` on `addr` until the runtime ends. Binding fails with a configuration error.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> sluice_core::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        sluice_core::Error::config(format!(
            "--metrics-addr {addr}: cannot listen there ({e}). Choose a free HOST:PORT."
        ))
    })?;
    let bound = listener.local_addr().unwrap_or(addr);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let m = metrics.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let _ =
                    tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf)).await;
                let body = m.render();
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    Ok(bound)
}
