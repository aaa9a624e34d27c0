//! The one work queue: every chunk of every dataset, largest first.
//!
//! A worker takes the next chunk when it finishes one, so one huge table and many small ones
//! keep every worker busy until the end, and the largest units start first so the last one to
//! finish is small.

use sluice_core::Chunk;
use std::collections::VecDeque;
use std::sync::Mutex;

/// A queue of chunks handed out one at a time.
#[derive(Debug, Default)]
pub struct WorkQueue {
    chunks: Mutex<VecDeque<Chunk>>,
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
        }
    }

    /// The next chunk, or `None` when all were handed out.
    pub fn next(&self) -> Option<Chunk> {
        self.chunks.lock().ok().and_then(|mut q| q.pop_front())
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
        let order: Vec<_> = std::iter::from_fn(|| q.next())
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
