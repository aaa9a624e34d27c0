//! Prometheus metrics of a running replication (`sluice replicate --metrics-addr HOST:PORT`),
//! served by the stream's responder (`crate::metrics::serve`) from the run's counters
//! ([`ApplyCounters`]), all under `sluice_replicate_`.

use super::worker::ApplyCounters;
use crate::metrics::Render;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

impl Render for ApplyCounters {
    fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut one = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP sluice_replicate_{name} {help}");
            let _ = writeln!(out, "# TYPE sluice_replicate_{name} {kind}");
            let _ = writeln!(out, "sluice_replicate_{name} {value}");
        };
        let counters: [(&str, &str, &AtomicU64); 9] = [
            (
                "units_total",
                "Units (groups of source transactions) committed on the target.",
                &self.units,
            ),
            (
                "transactions_total",
                "Source transactions committed on the target.",
                &self.transactions,
            ),
            (
                "received_transactions_total",
                "Source transactions received (applied or waiting).",
                &self.received,
            ),
            (
                "changes_total",
                "Row changes committed on the target.",
                &self.changes,
            ),
            (
                "conflicts_total",
                "Units rolled back and run again (a conflict the writesets did not predict).",
                &self.conflicts,
            ),
            (
                "aborts_total",
                "Units rolled back because an earlier one had to run alone.",
                &self.aborts,
            ),
            (
                "unmatched_total",
                "Updates and deletes that matched no row on the target.",
                &self.unmatched,
            ),
            (
                "ignored_changes_total",
                "Changes of tables the run does not capture (a captured table renamed), left out.",
                &self.ignored,
            ),
            (
                "split_units_total",
                "Units that applied their rows free of earlier units first.",
                &self.split,
            ),
        ];
        for (name, help, v) in counters {
            one(name, "counter", help, g(v).to_string());
        }
        // Behind while received transactions wait: the age of the last applied one's commit.
        let waiting = g(&self.received) > g(&self.transactions);
        let last = g(&self.last_commit_ts);
        let lag = if waiting && last > 0 {
            (chrono::Utc::now().timestamp_micros() as u64).saturating_sub(last) as f64 / 1e6
        } else {
            0.0
        };
        one(
            "lag_seconds",
            "gauge",
            "Seconds since the source committed the last applied transaction while others wait; 0 when caught up.",
            format!("{lag:.3}"),
        );
        one(
            "retained_bytes",
            "gauge",
            "Log the source keeps for the replication (PostgreSQL: WAL retained by the slot).",
            g(&self.retained_bytes).to_string(),
        );
        let _ = writeln!(
            out,
            "# HELP sluice_replicate_table_changes_total Row changes of committed units, per table and operation (a streamed transaction's later pieces are in changes_total only).\n# TYPE sluice_replicate_table_changes_total counter"
        );
        let tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        for (table, counts) in tables.iter() {
            for (op, n) in ["insert", "update", "delete", "truncate"]
                .iter()
                .zip(counts)
            {
                let _ = writeln!(
                    out,
                    "sluice_replicate_table_changes_total{{table=\"{}\",op=\"{op}\"}} {n}",
                    crate::metrics::label(table)
                );
            }
        }
        drop(tables);
        self.apply_latency.render(
            &mut out,
            "sluice_replicate_apply_latency_seconds",
            "Per unit: seconds from the source's commit of its last transaction to its commit on the target.",
        );
        out
    }
}
