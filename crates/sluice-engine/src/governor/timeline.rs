//! The run's timeline: one point per second of reading (rows and bytes per second, workers
//! allowed, each signal's value) and every pause with its reason, for `--report-json` and the
//! HTML report. A long run keeps one point a second (an hour is 3,600 small points).

use serde::{Deserialize, Serialize};

/// A signal the run was governed by.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignalInfo {
    /// `replica lag (127.0.0.1:5433)`, `canary latency p95`.
    pub name: String,
    /// Its unit (`s`, `sessions`, `xids`).
    pub unit: String,
    /// The budget's limit, in that unit.
    pub limit: f64,
}

/// One second of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Seconds since reading began.
    pub t: f64,
    /// Rows read in that second.
    pub rows_per_second: f64,
    /// Source bytes read in that second.
    pub bytes_per_second: f64,
    /// Workers allowed to start a chunk.
    pub workers: usize,
    /// Each signal's value (in [`Timeline::signals`]' order); `None` where it could not be read.
    pub signals: Vec<Option<f64>>,
    /// Why new chunks waited, if they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
}

/// A span during which new chunks waited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pause {
    /// Seconds since reading began.
    pub from: f64,
    /// When it ended (the end of reading, if it had not).
    pub to: f64,
    /// Why (the first reason given).
    pub reason: String,
}

/// The timeline of a run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Timeline {
    /// The signals governed by, in the order of each point's `signals`.
    pub signals: Vec<SignalInfo>,
    /// One point a second.
    pub points: Vec<Point>,
    /// Every pause.
    pub pauses: Vec<Pause>,
    /// The fewest workers allowed at any time.
    pub min_workers: usize,
    /// Seconds during which new chunks waited.
    pub paused_seconds: f64,
}
