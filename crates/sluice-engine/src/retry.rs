//! Bounded retries with exponential backoff and full jitter.
//!
//! Only errors classified transient by their adapter are retried, and never beyond both a
//! number of attempts and a total time — a source that keeps failing fails the run with its
//! last error rather than retrying forever.

use std::time::{Duration, Instant};

/// How retries are bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per chunk, the first included.
    pub max_attempts: u32,
    /// Give up once this much time has passed since the first failure of a chunk.
    pub max_elapsed: Duration,
    /// Backoff before the second attempt; doubles each time.
    pub base_delay: Duration,
    /// Largest backoff.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            max_elapsed: Duration::from_secs(300),
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(20),
        }
    }
}

impl RetryPolicy {
    /// Whether attempt number `attempt` (1-based, the one that just failed) may be followed by
    /// another, given when the first failure happened.
    pub fn allows(&self, attempt: u32, first_failure: Instant) -> bool {
        attempt < self.max_attempts && first_failure.elapsed() < self.max_elapsed
    }

    /// The delay before the next attempt after `attempt` failures: uniformly random in
    /// `[0, min(max_delay, base × 2^(attempt−1))]` (full jitter, so workers that failed
    /// together do not retry together).
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let cap = exp.min(self.max_delay);
        cap.mul_f64(rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_in_attempts_and_delay() {
        let p = RetryPolicy::default();
        let now = Instant::now();
        assert!(p.allows(1, now));
        assert!(!p.allows(5, now));
        for a in 1..40 {
            assert!(p.delay(a) <= p.max_delay);
        }
        let expired = RetryPolicy {
            max_elapsed: Duration::ZERO,
            ..p
        };
        assert!(!expired.allows(1, now));
    }
}
