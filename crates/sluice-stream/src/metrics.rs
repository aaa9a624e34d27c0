//! Prometheus metrics of a running stream (`--metrics-addr HOST:PORT`, path `/metrics`).
//!
//! A plain HTTP/1.1 responder on a Tokio listener: monitoring scrapes a handful of counters,
//! gauges and histograms every few seconds, which needs no web framework. Every request gets
//! the metrics, whatever its path.
//!
//! What a table's changes do is labelled by `table` (the dataset name, `schema.table`) and,
//! where it applies, `op` (`insert`, `update`, `delete`, `truncate`): `changes_total`,
//! `filtered_changes_total`, `ignored_changes_total`, `files_total`, `bytes_written_total`
//! (`sum without (table, op)` gives the stream's total). What belongs to the stream as a whole
//! (positions, lag, retained log, errors) has no label. Histograms: `commit_to_file_seconds`
//! (per batch, from the commit of its oldest change to its files being committed — the batch's
//! worst latency), `batch_changes` and `batch_bytes`. The dashboard and alert rules in
//! `deploy/` use these names; `tests/it/stream_metrics.rs` checks each exists.

use sluice_core::change::ChangeOp;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Counters and gauges, updated by the runner as it goes.
#[derive(Debug)]
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
    /// Tables that joined the stream while it ran (created on the source, matching the
    /// selection), their snapshot taken.
    pub tables_added: AtomicU64,
    /// Captured tables dropped on the source, their final marker written.
    pub tables_dropped: AtomicU64,
    /// Table versions the merges committed (`--format delta`).
    pub table_versions: AtomicU64,
    /// Data files those versions added and removed.
    pub table_files_added: AtomicU64,
    /// See [`Metrics::table_files_added`].
    pub table_files_removed: AtomicU64,
    /// Data files no table version needs any more, deleted (`--vacuum-retention`).
    pub table_files_vacuumed: AtomicU64,
    /// Per table (dataset name), registered as the batcher meets them.
    tables: Mutex<BTreeMap<String, Arc<TableMetrics>>>,
    /// Per batch: commit of its oldest change → its files committed, seconds.
    pub commit_to_file: Histogram,
    /// Per batch: changes written.
    pub batch_changes: Histogram,
    /// Per batch: bytes of change files written.
    pub batch_bytes: Histogram,
}

/// The operations in label order ([`op_index`]).
const OPS: [ChangeOp; 4] = [
    ChangeOp::Insert,
    ChangeOp::Update,
    ChangeOp::Delete,
    ChangeOp::Truncate,
];

/// The slot of `op` in the per-operation counters.
pub fn op_index(op: ChangeOp) -> usize {
    match op {
        ChangeOp::Insert => 0,
        ChangeOp::Update => 1,
        ChangeOp::Delete => 2,
        ChangeOp::Truncate => 3,
    }
}

/// One table's counters.
#[derive(Debug, Default)]
pub struct TableMetrics {
    /// Changes written (committed), per operation ([`op_index`]).
    pub changes: [AtomicU64; 4],
    /// Changes `--ops` left out, per operation.
    pub filtered: [AtomicU64; 4],
    /// Changes of a table the stream does not capture (arriving under a new name).
    pub ignored: AtomicU64,
    /// Change files committed.
    pub files: AtomicU64,
    /// Bytes of change files committed.
    pub bytes: AtomicU64,
}

/// A Prometheus histogram with fixed upper bounds, updated without locks.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative), the last one above every bound.
    counts: Vec<AtomicU64>,
    /// Sum of the observations, an `f64`'s bits (a byte histogram's sum outgrows any fixed
    /// scale in an integer).
    sum_bits: AtomicU64,
}

impl Histogram {
    /// A histogram with these upper bounds (ascending; `+Inf` is added).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Count one observation of `v` (negative values count as 0).
    pub fn observe(&self, v: f64) {
        let v = v.max(0.0);
        let i = self
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
    }

    /// Append the histogram `name` (its full metric name) with its help line.
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut total = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            total += c.load(Ordering::Relaxed);
            let le = self
                .bounds
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {total}");
        }
        let sum = f64::from_bits(self.sum_bits.load(Ordering::Relaxed));
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {total}");
    }
}

/// Upper bounds of latency histograms, seconds.
pub const LATENCY_SECONDS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// A latency histogram ([`LATENCY_SECONDS`]).
impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(LATENCY_SECONDS)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            changes: AtomicU64::default(),
            transactions: AtomicU64::default(),
            batches: AtomicU64::default(),
            files: AtomicU64::default(),
            bytes_written: AtomicU64::default(),
            committed_seq: AtomicU64::default(),
            committed_position: AtomicU64::default(),
            retained_bytes: AtomicU64::default(),
            lag_bytes: AtomicU64::default(),
            lag_millis: AtomicU64::default(),
            since_confirm_millis: AtomicU64::default(),
            errors: AtomicU64::default(),
            ignored_changes: AtomicU64::default(),
            filtered_changes: AtomicU64::default(),
            retries: AtomicU64::default(),
            peak_lag_millis: AtomicU64::default(),
            streaming: AtomicU64::default(),
            tables_added: AtomicU64::default(),
            tables_dropped: AtomicU64::default(),
            table_versions: AtomicU64::default(),
            table_files_added: AtomicU64::default(),
            table_files_removed: AtomicU64::default(),
            table_files_vacuumed: AtomicU64::default(),
            tables: Mutex::default(),
            commit_to_file: Histogram::default(),
            batch_changes: Histogram::new(&[1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6]),
            batch_bytes: Histogram::new(&[1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9]),
        }
    }
}

impl Metrics {
    /// The counters of table `dataset`, registered on first use (a restarted attempt's
    /// batcher gets the same ones).
    pub fn table(&self, dataset: &str) -> Arc<TableMetrics> {
        let mut tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        tables.entry(dataset.to_string()).or_default().clone()
    }

    /// The per-table families: `name`, its help, and the value per (table, op) — `op` `None`
    /// for a family without it.
    fn per_table(&self, out: &mut String) {
        let tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        type Pick = fn(&TableMetrics) -> &[AtomicU64; 4];
        let by_op: [(&str, &str, Pick); 2] = [
            (
                "changes_total",
                "Changes written, per table and operation.",
                |t| &t.changes,
            ),
            (
                "filtered_changes_total",
                "Changes of operations --ops leaves out of the change files, per table and operation.",
                |t| &t.filtered,
            ),
        ];
        for (name, help, pick) in by_op {
            let _ = writeln!(out, "# HELP sluice_stream_{name} {help}");
            let _ = writeln!(out, "# TYPE sluice_stream_{name} counter");
            for (table, t) in tables.iter() {
                for (op, v) in OPS.iter().zip(pick(t)) {
                    let _ = writeln!(
                        out,
                        "sluice_stream_{name}{{table=\"{}\",op=\"{}\"}} {}",
                        label(table),
                        op.as_str(),
                        g(v)
                    );
                }
            }
        }
        type One = fn(&TableMetrics) -> &AtomicU64;
        let per: [(&str, &str, One); 3] = [
            ("files_total", "Change files committed, per table.", |t| {
                &t.files
            }),
            (
                "bytes_written_total",
                "Bytes of change files committed, per table.",
                |t| &t.bytes,
            ),
            (
                "ignored_changes_total",
                "Changes of tables the stream does not capture (a captured table renamed on the source), left out, per table.",
                |t| &t.ignored,
            ),
        ];
        for (name, help, pick) in per {
            let _ = writeln!(out, "# HELP sluice_stream_{name} {help}");
            let _ = writeln!(out, "# TYPE sluice_stream_{name} counter");
            for (table, t) in tables.iter() {
                let _ = writeln!(
                    out,
                    "sluice_stream_{name}{{table=\"{}\"}} {}",
                    label(table),
                    g(pick(t))
                );
            }
        }
    }

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
            "tables_added_total",
            "counter",
            "Tables created on the source while the stream ran that matched its selection and \
             joined it (snapshot taken).",
            g(&self.tables_added).to_string(),
        );
        one(
            "tables_dropped_total",
            "counter",
            "Captured tables dropped on the source, their final marker written.",
            g(&self.tables_dropped).to_string(),
        );
        let table: [(&str, &str, &AtomicU64); 4] = [
            (
                "table_versions_total",
                "Table versions committed by merging batches (--format delta).",
                &self.table_versions,
            ),
            (
                "table_files_added_total",
                "Data files those table versions added.",
                &self.table_files_added,
            ),
            (
                "table_files_removed_total",
                "Data files those table versions removed (rewritten without touched keys).",
                &self.table_files_removed,
            ),
            (
                "table_files_vacuumed_total",
                "Data files no table version within --vacuum-retention needs, deleted.",
                &self.table_files_vacuumed,
            ),
        ];
        for (name, help, v) in table {
            one(name, "counter", help, g(v).to_string());
        }
        self.per_table(&mut out);
        let hist: [(&str, &str, &Histogram); 3] = [
            (
                "commit_to_file_seconds",
                "Per batch: seconds from the commit of its oldest change to its files committed.",
                &self.commit_to_file,
            ),
            (
                "batch_changes",
                "Per batch: changes written.",
                &self.batch_changes,
            ),
            (
                "batch_bytes",
                "Per batch: bytes of change files written.",
                &self.batch_bytes,
            ),
        ];
        for (name, help, h) in hist {
            h.render(&mut out, &format!("sluice_stream_{name}"), help);
        }
        out
    }
}

/// A label value as Prometheus' text format writes it (`\`, `"` and newlines escaped).
pub(crate) fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// What `/metrics` answers: the Prometheus text of a stream or a replication.
pub trait Render: Send + Sync + 'static {
    /// The metrics in Prometheus' text format.
    fn render(&self) -> String;
}

impl Render for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }
}

/// Serve `metrics` on `addr` until the runtime ends. Binding fails with a configuration error.
pub async fn serve(addr: SocketAddr, metrics: Arc<dyn Render>) -> sluice_core::Result<SocketAddr> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_render_cumulative_buckets_sum_and_count() {
        let m = Metrics::default();
        for v in [0.05, 0.3, 0.3, 7.0, 1e4] {
            m.commit_to_file.observe(v);
        }
        let text = m.render();
        for line in [
            "sluice_stream_commit_to_file_seconds_bucket{le=\"0.1\"} 1",
            "sluice_stream_commit_to_file_seconds_bucket{le=\"0.5\"} 3",
            "sluice_stream_commit_to_file_seconds_bucket{le=\"10\"} 4",
            "sluice_stream_commit_to_file_seconds_bucket{le=\"600\"} 4",
            "sluice_stream_commit_to_file_seconds_bucket{le=\"+Inf\"} 5",
            "sluice_stream_commit_to_file_seconds_sum 10007.65",
            "sluice_stream_commit_to_file_seconds_count 5",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
    }

    #[test]
    fn table_labels_are_escaped_and_every_operation_is_listed() {
        let m = Metrics::default();
        m.table("s.\"odd\"").changes[op_index(ChangeOp::Delete)].fetch_add(2, Ordering::Relaxed);
        let text = m.render();
        assert!(
            text.contains(r#"sluice_stream_changes_total{table="s.\"odd\"",op="delete"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"sluice_stream_changes_total{table="s.\"odd\"",op="truncate"} 0"#));
        assert!(text.contains(r#"sluice_stream_files_total{table="s.\"odd\""} 0"#));
    }
}
