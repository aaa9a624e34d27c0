//! What the user sees on stderr: progress while running, the report at the end, the plan.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sluice_engine::{PhaseRecord, PlanReport, Progress, ProgressStart, ProgressTick, Report};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The warnings a capture's report ends with (`sluice stream`, `sluice replicate`): values
/// that could not be written and went in as NULL (`nulled_as`: how they went in), changes of
/// tables the run does not capture. Empty when there is nothing to warn of.
pub fn capture_warnings(nulled: u64, nulled_as: &str, ignored: u64) -> String {
    let mut s = String::new();
    if nulled > 0 {
        s.push_str(&format!(
            "  WARNING: {nulled} changed value(s) could not be written and were {nulled_as} as \
             NULL (--bad-values null)\n"
        ));
    }
    if ignored > 0 {
        s.push_str(&format!(
            "  WARNING: {ignored} change(s) of tables this run does not capture were left out \
             (a captured table renamed on the source)\n"
        ));
    }
    s
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in MB with one decimal, or GB from 10 GB on. MB and GB are powers of 1024, as in the
/// sizes sluice reads (`sluice_core::size::parse_size`): `--memory 64MB` is shown as `64.0 MB`.
pub fn megabytes(b: u64) -> String {
    const MB: f64 = (1u64 << 20) as f64;
    const GB: f64 = (1u64 << 30) as f64;
    if b >= 10 << 30 {
        format!("{:.1} GB", b as f64 / GB)
    } else {
        format!("{:.1} MB", b as f64 / MB)
    }
}

/// A progress bar on a terminal, a log line every 10 s otherwise (and always with JSON logs,
/// whose lines a bar would break).
pub struct Display {
    bar: Option<ProgressBar>,
    started: Mutex<Option<(Instant, Instant)>>,
    parts: Mutex<u64>,
    quiet: bool,
    /// What the harm budget's governor says now (`paused: replica lag 12.3 s > 10 s`, `2/4
    /// workers`), shown in the progress line.
    governed: Mutex<Option<String>>,
}

impl Display {
    /// Choose the form from whether stderr is a terminal; `bar_allowed` false forces log lines.
    pub fn new(quiet: bool, bar_allowed: bool) -> Self {
        let bar = (!quiet && bar_allowed && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} {elapsed_precise} [{bar:28}] {human_pos}/{human_len} rows  {msg}  ETA {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            b
        });
        Display {
            bar,
            started: Mutex::new(None),
            parts: Mutex::new(0),
            quiet,
            governed: Mutex::new(None),
        }
    }
}

impl Progress for Display {
    fn begin(&self, start: &ProgressStart) {
        if let Ok(mut p) = self.parts.lock() {
            *p = start.parts;
        }
        if let Ok(mut s) = self.started.lock() {
            *s = Some((Instant::now(), Instant::now()));
        }
        match &self.bar {
            Some(b) => {
                if start.est_rows > 0 {
                    b.set_length(start.est_rows);
                }
                b.enable_steady_tick(Duration::from_millis(200));
            }
            None if !self.quiet => tracing::info!(
                "reading {} part(s) with {} worker(s), about {} rows",
                start.parts,
                start.workers,
                thousands(start.est_rows)
            ),
            None => {}
        }
    }

    fn tick(&self, t: ProgressTick) {
        let total_parts = self.parts.lock().map(|p| *p).unwrap_or(0);
        let Ok(mut started) = self.started.lock() else {
            return;
        };
        let Some((begin, last)) = started.as_mut() else {
            return;
        };
        let secs = begin.elapsed().as_secs_f64().max(1e-3);
        let mut msg = format!(
            "{:.1} MB/s  {}/{} parts",
            t.bytes as f64 / (1u64 << 20) as f64 / secs,
            t.parts_done,
            total_parts
        );
        if let Some(g) = self.governed.lock().ok().and_then(|g| g.clone()) {
            msg = format!("{msg}  {g}");
        }
        match &self.bar {
            Some(b) => {
                if b.length().is_some_and(|l| t.rows > l) {
                    b.set_length(t.rows);
                }
                b.set_position(t.rows);
                b.set_message(msg);
            }
            None if !self.quiet && last.elapsed() >= Duration::from_secs(10) => {
                *last = Instant::now();
                tracing::info!(
                    "progress: {} rows, {} read, {} rows/s, {msg}",
                    thousands(t.rows),
                    megabytes(t.bytes),
                    thousands((t.rows as f64 / secs) as u64)
                );
            }
            None => {}
        }
    }

    fn end(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }

    fn governed(&self, paused: Option<&str>, active: usize, workers: usize) {
        let now = governed_text(paused, active, workers);
        if let Ok(mut g) = self.governed.lock() {
            *g = now;
        }
    }
}

/// The progress line's word on the harm budget: `paused: replica lag 12.3 s > 10 s`, `2/4
/// workers`, or nothing while every worker may run.
fn governed_text(paused: Option<&str>, active: usize, workers: usize) -> Option<String> {
    match paused {
        Some(why) => Some(format!("paused: {why}")),
        None if active < workers => Some(format!("{active}/{workers} workers")),
        None => None,
    }
}

/// The end-of-run report as a short table.
pub fn report_text(r: &Report) -> String {
    let mut lines = Vec::new();
    let mut row = |k: &str, v: String| lines.push(format!("  {k:<13}{v}"));
    if r.already_complete {
        return format!(
            "sluice: {} already holds a complete export; nothing to do.\n",
            r.destination
        );
    }
    row("source", format!("{} ({})", r.source, r.server_version));
    row(
        "output",
        format!(
            "{} ({}), {} part(s) written{}",
            r.destination,
            r.format,
            r.parts_written,
            if r.parts_skipped > 0 {
                format!(", {} already done", r.parts_skipped)
            } else {
                String::new()
            }
        ),
    );
    row(
        "rows",
        format!(
            "{} in {:.2} s = {} rows/s",
            thousands(r.rows),
            r.wall_seconds,
            thousands(r.rows_per_second as u64)
        ),
    );
    row(
        "bytes",
        format!(
            "{} read = {:.1} MB/s; {} written",
            megabytes(r.bytes_read),
            r.mb_per_second,
            megabytes(r.bytes_written)
        ),
    );
    row(
        "memory",
        format!(
            "peak RSS {}, {} worker(s)",
            megabytes(r.peak_rss_bytes),
            r.workers
        ),
    );
    if let Some(tl) = r.timeline.as_ref().filter(|t| !t.signals.is_empty()) {
        let mut budget = format!(
            "paused {:.1} s, {}–{} worker(s)",
            tl.paused_seconds, tl.min_workers, r.workers
        );
        if let Some(p) = tl.pauses.first() {
            budget.push_str(&format!(" (first pause: {})", p.reason));
        }
        row("harm budget", budget);
    }
    let h = &r.harm;
    match r.consistency.as_str() {
        "snapshot" => row(
            "snapshot",
            format!("held {:.2} s, {}", h.snapshot_held_seconds, r.position),
        ),
        "converged" => row(
            "consistency",
            format!(
                "converged to one point in time (see the note); no snapshot held longer than \
                 {:.2} s",
                h.snapshot_held_seconds
            ),
        ),
        _ => row(
            "consistency",
            format!("per chunk (not one point in time), {}", r.position),
        ),
    }
    if let Some(held) = h.global_lock_seconds {
        row(
            "global lock",
            format!(
                "waited {:.1} ms to be granted, held {:.1} ms",
                h.global_lock_wait_seconds.unwrap_or(0.0) * 1000.0,
                held * 1000.0
            ),
        );
    }
    row(
        "harm",
        format!(
            "xmin horizon held back {} transactions; longest transaction {:.2} s; longest statement {:.2} s; peak {} connection(s)",
            h.peak_xmin_age
                .map(thousands)
                .unwrap_or_else(|| "n/a".into()),
            h.longest_transaction_seconds,
            h.longest_statement_seconds,
            h.peak_connections
        ),
    );
    if h.peak_blocked_sessions > 0 {
        row(
            "blocked",
            format!(
                "up to {} other session(s) waited on this run's locks, the longest {:.2} s",
                h.peak_blocked_sessions, h.longest_blocked_wait_seconds
            ),
        );
    }
    if r.retries > 0 {
        row("retries", r.retries.to_string());
    }
    for c in &r.text_fallback_columns {
        row("as text", c.clone());
    }
    for d in &r.datasets {
        row(
            "dataset",
            format!(
                "{}: {} rows, {} in {} file(s); {}",
                d.name,
                thousands(d.rows),
                megabytes(d.bytes),
                d.parts,
                d.guarantee
            ),
        );
    }
    if !r.phases.is_empty() {
        row("phases", phases_text(&r.phases));
    }
    for n in &r.notes {
        row("note", n.clone());
    }
    format!(
        "sluice export finished (run {})\n{}\n",
        r.run_id,
        lines.join("\n")
    )
}

/// `1 connect 0.05 s, 2 plan 0.31 s, …`; a phase the run stopped in is marked.
pub fn phases_text(phases: &[PhaseRecord]) -> String {
    phases
        .iter()
        .map(|p| {
            format!(
                "{} {} {:.2} s{}",
                p.number,
                p.name,
                p.seconds,
                if p.completed { "" } else { " (stopped)" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `sluice plan` as text.
pub fn plan_text(p: &PlanReport) -> String {
    let mut out = format!(
        "source       {} ({})\nconsistency  {}\nworkers      {} ({})\ncores        ~{:.1} of {} busy ({})\nchunk size   {}\nbatch size   {}\npeak memory  ~{} predicted\nconnections  {}\n",
        p.source,
        p.server_version,
        p.consistency,
        p.workers,
        p.workers_reason,
        p.cores_needed,
        p.cores,
        if p.server_local {
            "client and server on this machine"
        } else {
            "client; the server runs elsewhere"
        },
        megabytes(p.chunk_bytes),
        megabytes(p.batch_bytes as u64),
        megabytes(p.predicted_peak_rss_bytes),
        p.connections
    );
    for n in &p.notes {
        out.push_str(&format!("note         {n}\n"));
    }
    for s in &p.signals {
        out.push_str(&format!("signal       {s}\n"));
    }
    out.push('\n');
    out.push_str(&format!(
        "{:<32} {:>14} {:>11} {:>9}  {:<18} {:>6}\n",
        "dataset", "est. rows", "est. size", "avg row", "strategy", "chunks"
    ));
    for d in &p.datasets {
        out.push_str(&format!(
            "{:<32} {:>14} {:>11} {:>7} B  {:<18} {:>6}\n",
            d.name,
            thousands(d.est_rows),
            megabytes(d.est_bytes),
            d.avg_row_bytes,
            d.strategy,
            d.chunks
        ));
        for c in &d.text_columns {
            out.push_str(&format!("    read as text: {c}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_line_says_why_the_budget_holds_chunks_back() {
        assert_eq!(
            governed_text(Some("replica lag 12.3 s > 10 s"), 2, 4).as_deref(),
            Some("paused: replica lag 12.3 s > 10 s")
        );
        assert_eq!(governed_text(None, 2, 4).as_deref(), Some("2/4 workers"));
        assert_eq!(governed_text(None, 4, 4), None);
    }

    #[test]
    fn numbers() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(megabytes(1_572_864), "1.5 MB");
        assert_eq!(megabytes(64 << 20), "64.0 MB");
        assert_eq!(megabytes(12 << 30), "12.0 GB");
        let phases = [
            PhaseRecord {
                number: 1,
                name: "connect".into(),
                seconds: 0.25,
                completed: true,
            },
            PhaseRecord {
                number: 4,
                name: "read".into(),
                seconds: 2.0,
                completed: false,
            },
        ];
        assert_eq!(
            phases_text(&phases),
            "1 connect 0.25 s, 4 read 2.00 s (stopped)"
        );
    }
}
