//! Handing freed memory back to the system where a run frees a lot at once.
//!
//! Why: a Parquet writer frees its whole row group — megabytes of page buffers small enough to
//! be carved from the allocator's heap — at every flush, and glibc keeps such memory resident
//! in the freeing thread's arena, in holes between buffers still in use, so peak RSS grew by a
//! few megabytes per worker over the budget the planner predicted. Releasing at each flush
//! (glibc's `malloc_trim`) held the 10 M-row narrow export at 2 workers to 66–70 MiB instead of
//! 69–79 MiB (docs/perf/benchmarks.md), with no measurable CPU cost: the row group's pages are
//! faulted in again once per row group, not per page.
//!
//! Limits: which allocator the process uses, and whether releasing means anything for it, is
//! the binary's choice, not a library's. So libraries only call [`release`] at their big frees,
//! and the binary registers what it means with [`set_release`]; without a registration
//! [`release`] does nothing (library users and tests keep their allocator untouched).

use std::sync::OnceLock;

static RELEASE: OnceLock<fn()> = OnceLock::new();

/// Register the process's way of handing freed memory back to the system (called once, by the
/// binary, at start-up; later calls are ignored).
pub fn set_release(f: fn()) {
    let _ = RELEASE.set(f);
}

/// Hand freed memory back to the system, if the binary said how; a library calls this right
/// after freeing a large amount (a Parquet row group). Cost: what the registered function
/// costs (glibc's trim walks each arena's free chunks), so call it per megabytes freed, not per
/// value.
pub fn release() {
    if let Some(f) = RELEASE.get() {
        f();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static CALLS: AtomicUsize = AtomicUsize::new(0);

    fn count() {
        CALLS.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn release_calls_what_the_binary_registered_and_only_that() {
        release();
        assert_eq!(CALLS.load(Ordering::Relaxed), 0, "nothing registered yet");
        set_release(count);
        set_release(|| panic!("a second registration is ignored"));
        release();
        release();
        assert_eq!(CALLS.load(Ordering::Relaxed), 2);
    }
}
