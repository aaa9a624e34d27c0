//! The one work queue: every chunk of every dataset, largest first.
//!
//! A worker takes the next chunk when it finishes one, so one huge table and many small ones
//! keep every worker busy until the end, and the largest units start first so the last one to
//! finish is small.

use sluice_core::{Chunk, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Completes a chunk as a worker takes it (a converged run's delta chunks get their key lists
/// then, read from a file, rather than all at once).
pub type Fill = Arc<dyn Fn(&mut Chunk) -> Result<()> + Send + Sync>;

/// A queue of chunks handed out one at a time.
#[derive(Default)]
pub struct WorkQueue {
    chunks: Mutex<VecDeque<Chunk>>,
    fill: Option<Fill>,
}

impl WorkQueue {
    /// A queue of `chunks`, ordered largest first (ties in dataset and part order).
    pub fn new(mut chunks: Vec<Chunk>) -> Self {
        chunks.sort_by(|a, b| {
            b.est_bytes
                .cmp(&a.est_bytes)
                .then_with(|| a.dataset.cmp(&b.dataset))
                .then(a.ordinal.cmp(&b.ordinal))
        });
        WorkQueue {
            chunks: Mutex::new(chunks.into()),
            fill: None,
        }
    }

    /// The same queue, each chunk completed by `fill` as it is taken.
    pub fn with_fill(mut self, fill: Fill) -> Self {
        self.fill = Some(fill);
        self
    }

    /// The next chunk, or `None` when all were handed out.
    pub fn next(&self) -> Result<Option<Chunk>> {
        let Some(mut chunk) = self.chunks.lock().ok().and_then(|mut q| q.pop_front()) else {
            return Ok(None);
        };
        if let Some(fill) = &self.fill {
            fill(&mut chunk)?;
        }
        Ok(Some(chunk))
    }

    /// Chunks not yet handed out.
    pub fn remaining(&self) -> usize {
        self.chunks.lock().map(|q| q.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::ChunkBounds;

    fn c(ds: &str, ordinal: u32, bytes: u64) -> Chunk {
        Chunk {
            dataset: ds.into(),
            ordinal,
            relation: None,
            bounds: ChunkBounds::Whole,
            est_bytes: bytes,
            est_rows: 0,
        }
    }

    #[test]
    fn largest_first() {
        let q = WorkQueue::new(vec![
            c("a", 0, 10),
            c("b", 0, 500),
            c("a", 1, 10),
            c("c", 0, 50),
        ]);
        let order: Vec<_> = std::iter::from_fn(|| q.next().unwrap())
            .map(|c| (c.dataset, c.ordinal))
            .collect();
        assert_eq!(
            order,
            [
                ("b".into(), 0),
                ("c".into(), 0),
                ("a".into(), 0),
                ("a".into(), 1)
            ]
        );
        assert_eq!(q.remaining(), 0);
    }
}
