//! Test harness of sluice: real servers on loopback, never mocks.
//!
//! - [`server`] starts throwaway database servers in temporary directories on free loopback
//!   ports (PostgreSQL today), used by `sluice-testkit run`, which the test, demo and bench
//!   scripts call to wrap a command with servers around it.
//! - [`pg`] is what tests use: the server URL from the environment (a test that needs a server
//!   and finds none fails loudly, never skips), a fresh database per test, and helpers.
//! - [`files`] reads exported Parquet and CSV back for comparison.
//! - [`objstore`] starts object-storage emulators (S3, GCS, Azure Blob) the same way.

pub mod files;
pub mod objstore;
pub mod pg;
pub mod server;
