//! The control law, after the tools that learned it the hard way (gh-ost, Spirit, the Vitess
//! throttler): the worst signal's share of its limit puts the run in a zone, and the number of
//! workers allowed to start a chunk moves one at a time.
//!
//! | share of the limit | action                                                           |
//! |--------------------|------------------------------------------------------------------|
//! | under 40 %         | add a worker (up to the run's workers), once per cooldown         |
//! | 40–70 %            | hold                                                              |
//! | 70–100 %           | drop a worker (down to one), once per cooldown                    |
//! | over 100 %         | pause new chunks at once; halve the workers, once per cooldown    |
//!
//! A pause ends only once the signal is back under [`RESUME_BELOW`] of its limit
//! (hysteresis), so a signal hovering at its limit does not flap. A signal that cannot be read
//! pauses too (fail closed). The cooldown lets one step be observed before the next: the
//! canary's percentile covers about as long.

use std::time::{Duration, Instant};

/// The time between two changes of the worker count.
pub const COOLDOWN: Duration = Duration::from_secs(3);

/// A pause ends once every signal is under this share of its limit.
pub const RESUME_BELOW: f64 = 0.7;

/// Under this share a worker is added.
const ADD_BELOW: f64 = 0.4;

/// The worst signal now: its share of its limit and what to say about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Worst {
    /// Value ÷ limit.
    pub share: f64,
    /// `replica lag 12.3 s > 10 s`.
    pub says: String,
}

/// The law's state: workers allowed and the pause.
#[derive(Debug, Clone)]
pub struct Law {
    /// The run's workers: the most that may be allowed.
    max: usize,
    /// Workers allowed to start a chunk now.
    active: usize,
    /// Why new chunks wait, if they do.
    paused: Option<String>,
    /// The last change of `active`.
    changed: Option<Instant>,
}

impl Law {
    /// A law over `max` workers, all allowed.
    pub fn new(max: usize) -> Law {
        Law {
            max: max.max(1),
            active: max.max(1),
            paused: None,
            changed: None,
        }
    }

    /// Workers allowed to start a chunk.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Why new chunks wait, if they do.
    pub fn paused(&self) -> Option<&str> {
        self.paused.as_deref()
    }

    fn may_change(&self, now: Instant) -> bool {
        self.changed
            .is_none_or(|t| now.saturating_duration_since(t) >= COOLDOWN)
    }

    fn set(&mut self, active: usize, now: Instant) {
        if active != self.active {
            self.active = active;
            self.changed = Some(now);
        }
    }

    /// One step at `now`: `blind` says which signal cannot be read (fail closed), `worst` is
    /// the worst readable signal (`None` when none is governed).
    pub fn step(&mut self, now: Instant, worst: Option<&Worst>, blind: Option<String>) {
        if let Some(why) = blind {
            self.paused = Some(why);
            return;
        }
        let Some(w) = worst else {
            self.paused = None;
            return;
        };
        if w.share > 1.0 {
            self.paused = Some(w.says.clone());
            if self.may_change(now) {
                self.set((self.active / 2).max(1), now);
            }
            return;
        }
        if self.paused.is_some() {
            if w.share >= RESUME_BELOW {
                return;
            }
            self.paused = None;
        }
        if w.share >= RESUME_BELOW {
            if self.may_change(now) {
                self.set(self.active.saturating_sub(1).max(1), now);
            }
        } else if w.share < ADD_BELOW && self.active < self.max && self.may_change(now) {
            self.set(self.active + 1, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(share: f64) -> Worst {
        Worst {
            share,
            says: format!("x {share}"),
        }
    }

    #[test]
    fn zones_cooldown_and_hysteresis() {
        let t0 = Instant::now();
        let later = |n: u32| t0 + COOLDOWN * n;
        let mut law = Law::new(4);
        // Over the limit: pause and halve at once.
        law.step(t0, Some(&w(1.5)), None);
        assert_eq!((law.active(), law.paused()), (2, Some("x 1.5")));
        // Still over within the cooldown: no second halving.
        law.step(t0 + Duration::from_millis(250), Some(&w(1.2)), None);
        assert_eq!(law.active(), 2);
        // 80 %: still paused (hysteresis), no change.
        law.step(later(1), Some(&w(0.8)), None);
        assert_eq!((law.active(), law.paused().is_some()), (2, true));
        // 50 %: resume, hold.
        law.step(later(2), Some(&w(0.5)), None);
        assert_eq!((law.active(), law.paused()), (2, None));
        // 10 %: one more per cooldown, up to the run's workers.
        law.step(later(3), Some(&w(0.1)), None);
        law.step(later(3), Some(&w(0.1)), None);
        assert_eq!(law.active(), 3);
        law.step(later(4), Some(&w(0.1)), None);
        law.step(later(5), Some(&w(0.1)), None);
        assert_eq!(law.active(), 4);
        // 90 %: drop one.
        law.step(later(6), Some(&w(0.9)), None);
        assert_eq!(law.active(), 3);
        // Unreadable: paused, workers kept.
        law.step(later(7), Some(&w(0.1)), Some("lag unreadable".into()));
        assert_eq!((law.active(), law.paused()), (3, Some("lag unreadable")));
        law.step(later(8), None, None);
        assert_eq!(law.paused(), None);
    }
}
