//! Progress callbacks. The engine counts; the CLI decides how to show it (a bar on a terminal,
//! log lines otherwise).

/// Totals known before reading.
#[derive(Debug, Clone, Default)]
pub struct ProgressStart {
    /// Estimated rows to read in this run (0 when unknown).
    pub est_rows: u64,
    /// Parts to write in this run.
    pub parts: u64,
    /// Workers.
    pub workers: usize,
}

/// A point-in-time reading of the run.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProgressTick {
    /// Rows read so far.
    pub rows: u64,
    /// Source bytes read so far.
    pub bytes: u64,
    /// Parts committed so far.
    pub parts_done: u64,
}

/// Receives progress; called from the engine's ticker a few times a second.
pub trait Progress: Send + Sync {
    /// The run is about to read.
    fn begin(&self, start: &ProgressStart);
    /// Current counters.
    fn tick(&self, tick: ProgressTick);
    /// Reading ended (successfully or not).
    fn end(&self);
    /// The harm budget's governor, a few times a second while it governs: why new chunks wait
    /// (`replica lag 12.3 s > 10 s`), if they do, and how many of the run's workers may start
    /// one. The default shows nothing.
    fn governed(&self, paused: Option<&str>, active: usize, workers: usize) {
        let _ = (paused, active, workers);
    }
}

/// Progress that shows nothing.
#[derive(Debug, Default)]
pub struct Silent;

impl Progress for Silent {
    fn begin(&self, _: &ProgressStart) {}
    fn tick(&self, _: ProgressTick) {}
    fn end(&self) {}
}
