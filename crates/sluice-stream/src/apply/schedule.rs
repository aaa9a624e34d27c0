//! Which unit may run now: writeset dependencies, commits in source order, no head-of-line
//! blocking, and the retry ladder for conflicts the writesets did not predict.
//!
//! Units get increasing ids in source order and commit in that order. Each *row* of a unit
//! depends on the latest earlier unit that wrote one of its keys (`deps`); since commits are
//! in order, "that unit committed" means "every unit it conflicts with committed", so one
//! number per row is the whole dependency (MySQL's writeset `last_committed` has the same
//! shape), and the unit's `wait_for` is the largest. A unit whose rows all depend on committed
//! units is *ready*; a unit with some rows free (their dependency committed) may *start* before
//! it is ready: it applies its free rows first and its *late* rows (see [`late_rows`]) once
//! `wait_for` has committed. Reordering inside a unit is safe because a free row shares no key
//! with an earlier late row of the unit, so they commute; and it runs nothing that an earlier
//! unit can wait on, because a free row shares no key with any unit not yet committed. So the
//! independent part of a unit that holds one hot row runs beside earlier units instead of
//! behind them. Any startable unit may start, however many blocked units come before it —
//! unlike a scheduler that stops at the first blocked transaction.
//!
//! Running ahead needs one rule to stay deadlock-free: a unit that has run waits for its turn
//! to commit while holding its worker, so if every worker held a unit later than the oldest
//! undispatched one (the *head*), the head could never run. A unit other than the head is
//! therefore started only while fewer than `workers - 1` running units are later than the
//! head; by induction every unit earlier than the head commits, the head then gets a worker,
//! and so on.
//!
//! Conflicts (a unique key whose old value the source did not send, a trigger, a gap lock, an
//! existing target foreign key): the first time, the unit is rolled back and waits until every
//! earlier unit has committed; the second time it becomes *exclusive*: later running units are
//! told to roll back, and it runs alone. Barriers (DDL, truncate, tables without a key) are
//! exclusive from the start.

use super::writeset::{KeyMap, KeySet, RowKeys};
use std::collections::BTreeMap;
use std::sync::Arc;

/// How many waiting units a free worker looks at, oldest first: the bound on the work of one
/// dispatch when many units wait behind hot rows.
const LOOKAHEAD: usize = 1024;

/// A unit waiting to run.
#[derive(Debug)]
struct Waiting<W> {
    wait_for: u64,
    /// The earliest unit one of its rows depends on (`u64::MAX` without rows).
    first_dep: u64,
    deps: Arc<[u64]>,
    exclusive: bool,
    attempts: u32,
    work: W,
}

/// A unit running (or rolled back and waiting for its turn to run again).
#[derive(Debug)]
struct Running<W> {
    /// Roll back and wait for this unit to commit before running again.
    abort_for: Option<u64>,
    /// The unit as it waited: what it goes back to when it rolls back.
    unit: Waiting<W>,
}

/// What a worker runs.
#[derive(Debug)]
pub(crate) struct Take<W> {
    /// The unit's id (its commit order).
    pub id: u64,
    /// Earlier failed attempts.
    pub attempts: u32,
    /// The unit.
    pub work: W,
    /// Its late rows run once this unit has committed.
    pub wait_for: u64,
    /// The unit each row depends on (empty for a unit that is ready as a whole).
    pub deps: Arc<[u64]>,
    /// Units committed when it was taken.
    pub committed: u64,
}

/// Which rows of a unit are *late* when `committed` units have committed: a row that depends
/// on a unit not yet committed, or shares a key with an earlier late row of the unit. The
/// others may be applied first (see the module documentation).
pub(crate) fn late_rows(rows: &RowKeys, deps: &[u64], committed: u64) -> Vec<bool> {
    let mut late_keys = KeySet::default();
    (0..rows.len())
        .map(|i| {
            let keys = rows.row(i);
            let late = deps.get(i).is_some_and(|d| *d > committed)
                || keys.iter().any(|k| late_keys.contains(k));
            if late {
                late_keys.extend(keys.iter().copied());
            }
            late
        })
        .collect()
}

/// The dependency and ordering state of one apply run (see the module documentation).
#[derive(Debug)]
pub(crate) struct Schedule<W> {
    workers: usize,
    committed: u64,
    next_id: u64,
    floor: u64,
    last_writer: KeyMap<u64>,
    pending: BTreeMap<u64, Waiting<W>>,
    running: BTreeMap<u64, Running<W>>,
}

impl<W: Clone> Schedule<W> {
    /// A schedule for `workers` sessions whose units continue after unit `committed`.
    pub fn new(workers: usize, committed: u64) -> Self {
        Schedule {
            workers: workers.max(1),
            committed,
            next_id: committed + 1,
            floor: committed,
            last_writer: KeyMap::default(),
            pending: BTreeMap::new(),
            running: BTreeMap::new(),
        }
    }

    /// Units added and not yet committed.
    pub fn unfinished(&self) -> usize {
        self.pending.len() + self.running.len()
    }

    /// Add the next unit in source order, whose rows touch `rows` (hashes of table keys);
    /// exclusive units run alone. Returns its id.
    pub fn add(&mut self, work: W, rows: &RowKeys, exclusive: bool) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let mut deps: Vec<u64> = (0..rows.len())
            .map(|i| {
                rows.row(i)
                    .iter()
                    .filter_map(|k| self.last_writer.get(k))
                    .fold(self.floor, |a, w| a.max(*w))
            })
            .collect();
        for k in &rows.keys {
            self.last_writer.insert(*k, id);
        }
        let mut wait_for = deps.iter().copied().fold(self.floor, u64::max);
        let mut first_dep = deps.iter().copied().min().unwrap_or(u64::MAX);
        if exclusive {
            wait_for = id - 1;
            first_dep = wait_for;
            deps.clear();
            self.floor = id;
        }
        self.pending.insert(
            id,
            Waiting {
                wait_for,
                first_dep,
                deps: deps.into(),
                exclusive,
                attempts: 0,
                work,
            },
        );
        if self.last_writer.len() > 65_536 {
            let c = self.committed;
            self.last_writer.retain(|_, w| *w > c);
        }
        id
    }

    /// The earliest unit that may start now, if any (see the module documentation).
    pub fn take(&mut self) -> Option<Take<W>> {
        if self.running.len() >= self.workers {
            return None;
        }
        let head = *self.pending.keys().next()?;
        let alone = self.running.values().any(|r| r.unit.exclusive);
        let ahead = self.running.range(head..).count();
        let (committed, idle) = (self.committed, self.running.is_empty());
        let id = self
            .pending
            .iter()
            .take(LOOKAHEAD)
            .find(|(id, w)| {
                let id = **id;
                if w.exclusive {
                    return w.wait_for <= committed && committed == id - 1 && idle;
                }
                if w.wait_for > committed && w.first_dep > committed {
                    return false;
                }
                !alone && (id == head || ahead + 1 < self.workers)
            })
            .map(|(id, _)| *id)?;
        let w = self.pending.remove(&id)?;
        let take = Take {
            id,
            attempts: w.attempts,
            work: w.work.clone(),
            wait_for: w.wait_for,
            deps: w.deps.clone(),
            committed,
        };
        self.running.insert(
            id,
            Running {
                abort_for: None,
                unit: w,
            },
        );
        Some(take)
    }

    /// True when running unit `id` may apply its late rows (everything it depends on committed).
    pub fn unblocked(&self, wait_for: u64) -> bool {
        self.committed >= wait_for
    }

    /// True when unit `id` may commit now (every earlier unit committed).
    pub fn turn(&self, id: u64) -> bool {
        self.committed + 1 == id
    }

    /// True when running unit `id` must roll back (an earlier unit needs to run alone).
    pub fn must_abort(&self, id: u64) -> bool {
        self.running.get(&id).is_some_and(|r| r.abort_for.is_some())
    }

    /// Unit `id` committed (it was its turn).
    pub fn done(&mut self, id: u64) {
        self.running.remove(&id);
        self.committed = self.committed.max(id);
    }

    /// Unit `id` failed with a conflict and was rolled back (see the module documentation).
    pub fn conflict(&mut self, id: u64) {
        let Some(r) = self.running.remove(&id) else {
            return;
        };
        let attempts = r.unit.attempts + 1;
        let exclusive = r.unit.exclusive || attempts >= 2;
        if exclusive {
            self.floor = self.floor.max(id);
            for (_, later) in self.running.range_mut(id + 1..) {
                later.abort_for = Some(id);
            }
            for (_, later) in self.pending.range_mut(id + 1..) {
                later.wait_for = later.wait_for.max(id);
                later.first_dep = later.first_dep.max(id);
            }
        }
        self.pending.insert(
            id,
            Waiting {
                wait_for: id - 1,
                first_dep: id - 1,
                deps: Vec::new().into(),
                exclusive,
                attempts,
                work: r.unit.work,
            },
        );
    }

    /// Running unit `id` rolled back because an earlier one must run alone.
    pub fn aborted(&mut self, id: u64) {
        let Some(r) = self.running.remove(&id) else {
            return;
        };
        let after = r.abort_for.unwrap_or(id - 1);
        let mut w = r.unit;
        w.wait_for = w.wait_for.max(after);
        w.first_dep = w.first_dep.max(after);
        self.pending.insert(id, w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows with these keys each.
    fn rows(keys: &[&[u64]]) -> RowKeys {
        let mut r = RowKeys::default();
        for k in keys {
            r.keys.extend_from_slice(k);
            r.ends.push(r.keys.len() as u32);
        }
        r
    }

    /// One row with these keys.
    fn one(keys: &[u64]) -> RowKeys {
        rows(&[keys])
    }

    fn ids(s: &mut Schedule<u32>) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(t) = s.take() {
            out.push(t.id);
        }
        out
    }

    #[test]
    fn a_ready_unit_behind_a_blocked_one_runs() {
        let mut s = Schedule::new(4, 0);
        s.add(0, &one(&[1]), false); // 1
        s.add(0, &one(&[1]), false); // 2 waits for 1
        s.add(0, &one(&[2]), false); // 3 independent
        assert_eq!(ids(&mut s), vec![1, 3]);
        assert!(!s.turn(3));
        s.done(1);
        assert_eq!(ids(&mut s), vec![2]);
        assert!(s.turn(2));
    }

    #[test]
    fn one_worker_stays_free_for_the_head() {
        let mut s = Schedule::new(3, 0);
        s.add(0, &one(&[1]), false); // 1
        s.add(0, &one(&[1]), false); // 2 waits for 1
        for k in 10..20 {
            s.add(0, &one(&[k]), false); // 3.. independent
        }
        // 1, then units past the head (2) while fewer than two run past it: 3 and 4. The
        // worker holding 1 frees when it commits, and the head takes it.
        assert_eq!(ids(&mut s), vec![1, 3, 4]);
        s.done(1);
        assert_eq!(ids(&mut s), vec![2]);
        // Three run now, none of them the head's: nothing more until one commits.
        assert!(ids(&mut s).is_empty());
    }

    #[test]
    fn commits_waits_for_the_latest_writer_only() {
        let mut s = Schedule::new(8, 10);
        assert_eq!(s.add(0, &one(&[1, 2]), false), 11);
        s.add(0, &one(&[3]), false); // 12
        s.add(0, &one(&[2, 3]), false); // 13 waits for 12 (which waits behind 11 to commit)
        assert_eq!(ids(&mut s), vec![11, 12]);
        s.done(11);
        assert!(ids(&mut s).is_empty());
        s.done(12);
        assert_eq!(ids(&mut s), vec![13]);
    }

    #[test]
    fn exclusive_units_run_alone_and_hold_back_later_ones() {
        let mut s = Schedule::new(4, 0);
        s.add(0, &one(&[1]), false); // 1
        s.add(0, &RowKeys::default(), true); // 2 barrier
        s.add(0, &one(&[3]), false); // 3
        assert_eq!(ids(&mut s), vec![1]);
        s.done(1);
        assert_eq!(ids(&mut s), vec![2]);
        s.done(2);
        assert_eq!(ids(&mut s), vec![3]);
    }

    #[test]
    fn a_second_conflict_runs_alone_after_later_units_roll_back() {
        let mut s = Schedule::new(4, 0);
        s.add(0, &one(&[1]), false); // 1
        s.add(0, &one(&[2]), false); // 2
        s.add(0, &one(&[3]), false); // 3
        assert_eq!(ids(&mut s), vec![1, 2, 3]);
        s.conflict(2); // first: waits for 1, may run beside 3
        assert!(ids(&mut s).is_empty());
        s.done(1);
        assert_eq!(ids(&mut s), vec![2]);
        s.conflict(2); // second: alone; 3 must roll back
        assert!(s.must_abort(3));
        assert!(ids(&mut s).is_empty());
        s.aborted(3);
        assert_eq!(ids(&mut s), vec![2]);
        assert!(ids(&mut s).is_empty());
        s.done(2);
        assert_eq!(ids(&mut s), vec![3]);
        assert!(s.turn(3));
    }

    #[test]
    fn a_single_worker_applies_in_source_order() {
        let mut s = Schedule::new(1, 0);
        for k in 0..5 {
            s.add(0, &one(&[k]), false);
        }
        let mut order = Vec::new();
        while let Some(t) = s.take() {
            order.push(t.id);
            assert_eq!(s.take().map(|t| t.id), None);
            s.done(t.id);
        }
        assert_eq!(order, vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_unit_with_free_rows_starts_and_holds_back_only_its_late_ones() {
        let mut s = Schedule::new(4, 0);
        s.add(0, &one(&[1]), false); // 1 writes the hot key
        // 2: a row on the hot key, a row on its own key, a row sharing a key with the late
        // one, and a row sharing nothing.
        s.add(0, &rows(&[&[1, 10], &[20], &[10, 30], &[40]]), false);
        let taken: Vec<_> = std::iter::from_fn(|| s.take()).collect();
        assert_eq!(taken.iter().map(|t| t.id).collect::<Vec<_>>(), vec![1, 2]);
        let two = &taken[1];
        assert_eq!(two.wait_for, 1);
        let r = rows(&[&[1, 10], &[20], &[10, 30], &[40]]);
        assert_eq!(
            late_rows(&r, &two.deps, two.committed),
            vec![true, false, true, false],
            "the hot row is late, and so is the row sharing key 10 with it"
        );
        assert!(!s.unblocked(two.wait_for));
        s.done(1);
        assert!(s.unblocked(two.wait_for));
        assert_eq!(late_rows(&r, &two.deps, s.committed), vec![false; 4]);
    }

    #[test]
    fn a_unit_whose_rows_all_wait_does_not_start() {
        let mut s = Schedule::new(4, 0);
        s.add(0, &one(&[1]), false); // 1
        s.add(0, &rows(&[&[1], &[1, 2]]), false); // 2: every row on key 1
        s.add(0, &one(&[3]), false); // 3
        assert_eq!(ids(&mut s), vec![1, 3]);
        s.done(1);
        assert_eq!(ids(&mut s), vec![2]);
    }

    #[test]
    fn rows_after_an_exclusive_unit_wait_for_it() {
        let mut s = Schedule::new(4, 0);
        s.add(0, &one(&[1]), false); // 1
        s.add(0, &RowKeys::default(), true); // 2 barrier
        s.add(0, &rows(&[&[5], &[6]]), false); // 3: keys of its own, still after 2
        assert_eq!(ids(&mut s), vec![1]);
        s.done(1);
        assert_eq!(ids(&mut s), vec![2]);
        s.done(2);
        let t = s.take().map(|t| (t.id, t.wait_for));
        assert_eq!(t, Some((3, 2)));
    }
}
