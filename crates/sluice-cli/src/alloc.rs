//! Allocator settings for the `sluice` process.
//!
//! Why: glibc's malloc raises its mmap threshold dynamically (up to 32 MB) after the first large
//! buffer is freed, so later multi-megabyte batch and page buffers come from the heap, and the
//! heap keeps freed memory instead of returning it. In the benchmark lab (docs/benchmarks.md,
//! 10 M-row narrow table, 2 workers, 64 MB budget) peak RSS was 102 MB before these settings
//! and 66 MB after; the engine recycles its big buffers rather than allocating them per batch,
//! so mmap-backed buffers cost little.
//!
//! It also registers glibc's `malloc_trim` as [`sluice_core::memory::release`], which the
//! Parquet writer calls after each row group it frees (see that module for why and the
//! figures).
//!
//! Limits: only glibc targets are tuned (musl and others keep their defaults); a library must
//! not change the process allocator, so this lives in the binary, and the environment
//! (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`) still wins when set.

/// Fix glibc's mmap and trim thresholds unless the user set them in the environment.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn tune() {
    const MMAP_THRESHOLD: libc::c_int = 256 << 10;
    const TRIM_THRESHOLD: libc::c_int = 128 << 10;
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // SAFETY: mallopt only changes allocator parameters; it is called once at start-up,
        // before any other thread exists.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
    }
    if std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_none() {
        // SAFETY: as above.
        unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) };
    }
    sluice_core::memory::set_release(trim);
}

/// Return free memory of every arena to the system, including free pages between chunks in
/// use (which the trim threshold alone never returns).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim() {
    // SAFETY: malloc_trim only releases memory the allocator holds free; it is thread-safe.
    unsafe { libc::malloc_trim(0) };
}

/// Other targets keep their allocator's defaults.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() {}
