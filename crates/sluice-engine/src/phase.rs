//! Where a run's time went: a timer the engine advances from phase to phase, which logs each
//! phase with its number and duration and hands the list to the report.
//!
//! Phases are contiguous: entering one ends the previous, so their durations add up to the
//! run's wall time (less the few microseconds spent building the report). Numbers are fixed by
//! the list the timer was made with, as pgcopydb numbers its steps, so "phase 5" means the same
//! thing in every log even when a phase is skipped (an export without `--merge` has no phase
//! 5). The timer knows no particular job: an export uses [`EXPORT_PHASES`]; other runs (change
//! capture, the Python package) pass their own list.
//!
//! Log lines (target `sluice_engine::phase`): the start of a phase at debug level, its end at
//! info level with the duration, and a phase that a failure or interruption cut short at info
//! level as well, so a log shows where a failed run stopped and how long that took.

use serde::{Deserialize, Serialize};
use std::time::Instant;

/// The phases of an export, in the order they run.
///
/// - `connect`: check that the output is writable, look for an earlier run there, open the
///   coordinator's session (PostgreSQL exports its snapshot here);
/// - `plan`: read the catalog, size the datasets, split them into chunks;
/// - `snapshot`: open the workers' sessions and pin the snapshot (MySQL/MariaDB's brief global
///   lock, PostgreSQL's ACCESS SHARE locks), write the run plan;
/// - `read`: the workers read every chunk into committed parts;
/// - `merge`: `--merge` joins each dataset's parts into one file;
/// - `commit`: a table format's commit of each dataset's parts (`--format delta`);
/// - `manifest`: `manifest.json` is written (last).
pub const EXPORT_PHASES: &[&str] = &[
    "connect", "plan", "snapshot", "read", "converge", "merge", "commit", "manifest",
];

/// One finished phase, as the report lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseRecord {
    /// Its number in the run's list of phases, from 1.
    pub number: usize,
    /// Its name (e.g. `read`).
    pub name: String,
    /// Wall-clock seconds it took.
    pub seconds: f64,
    /// False when a failure or an interruption ended it.
    pub completed: bool,
}

/// Times the phases of one run; see the module documentation.
#[derive(Debug)]
pub struct PhaseTimer {
    names: &'static [&'static str],
    current: Option<(usize, Instant)>,
    done: Vec<PhaseRecord>,
}

impl PhaseTimer {
    /// A timer for a run whose phases are `names`, in order; no phase is running yet.
    pub fn new(names: &'static [&'static str]) -> Self {
        PhaseTimer {
            names,
            current: None,
            done: Vec::new(),
        }
    }

    /// End the running phase (if any) and start `name`. A name not in the list is numbered 0
    /// (a programming error, visible in the log rather than a panic).
    pub fn enter(&mut self, name: &'static str) {
        self.close(true);
        let index = self.names.iter().position(|n| *n == name);
        let number = index.map_or(0, |i| i + 1);
        tracing::debug!("phase {number}/{} {name}: started", self.names.len());
        self.current = Some((index.unwrap_or(usize::MAX), Instant::now()));
    }

    /// End the running phase as completed and return every phase timed so far.
    pub fn finish(&mut self) -> Vec<PhaseRecord> {
        self.close(true);
        self.done.clone()
    }

    /// End the running phase as cut short (the run failed or was interrupted there) and return
    /// every phase timed so far.
    pub fn abandon(&mut self) -> Vec<PhaseRecord> {
        self.close(false);
        self.done.clone()
    }

    /// The phases finished so far.
    pub fn records(&self) -> &[PhaseRecord] {
        &self.done
    }

    fn close(&mut self, completed: bool) {
        let Some((index, since)) = self.current.take() else {
            return;
        };
        let name = self.names.get(index).copied().unwrap_or("unknown");
        let record = PhaseRecord {
            number: if index == usize::MAX { 0 } else { index + 1 },
            name: name.to_string(),
            seconds: since.elapsed().as_secs_f64(),
            completed,
        };
        let (number, total, secs) = (record.number, self.names.len(), record.seconds);
        // The message says it all; as fields, the same facts would be printed twice on a text
        // line. Machines read the phases from the report (`--report-json`).
        if completed {
            tracing::info!("phase {number}/{total} {name}: {secs:.2} s");
        } else {
            tracing::info!("phase {number}/{total} {name}: stopped after {secs:.2} s");
        }
        self.done.push(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_numbered_by_the_list_and_contiguous() {
        let mut t = PhaseTimer::new(EXPORT_PHASES);
        t.enter("connect");
        t.enter("plan");
        t.enter("read");
        t.enter("manifest");
        let r = t.finish();
        let seen: Vec<(usize, &str, bool)> = r
            .iter()
            .map(|p| (p.number, p.name.as_str(), p.completed))
            .collect();
        assert_eq!(
            seen,
            [
                (1, "connect", true),
                (2, "plan", true),
                (4, "read", true),
                (8, "manifest", true)
            ]
        );
        assert!(r.iter().all(|p| p.seconds >= 0.0));
        // Finishing again adds nothing: no phase is running.
        assert_eq!(t.finish().len(), 4);
    }

    #[test]
    fn an_abandoned_phase_is_marked_incomplete() {
        let mut t = PhaseTimer::new(EXPORT_PHASES);
        t.enter("connect");
        t.enter("snapshot");
        let r = t.abandon();
        assert_eq!(r.len(), 2);
        assert!(r[0].completed);
        assert_eq!((r[1].number, r[1].completed), (3, false));
    }
}
