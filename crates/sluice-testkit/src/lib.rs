//! Test harness of sluice: real servers on loopback, never mocks.
//!
//! - [`server`] starts throwaway database servers in temporary directories on free loopback
//!   ports (PostgreSQL; MariaDB in [`mariadb`]; MySQL 9 in [`mysql9`]), used by
//!   `sluice-testkit run`, which the test, demo and bench scripts call to wrap a command with
//!   servers around it.
//! - [`pg`] is what tests use: the server URL from the environment (a test that needs a server
//!   and finds none fails loudly, never skips), a fresh database per test, and helpers.
//! - [`mysql`] is the same for MariaDB (`SLUICE_TEST_MYSQL_URL`) and, through [`mysql9`]'s
//!   [`mysql9::test_db`], for MySQL 9 (`SLUICE_TEST_MYSQL9_URL`).
//! - [`files`] reads exported Parquet and CSV back for comparison; [`formats`] reads JSON Lines
//!   and Avro back with independent readers; [`changes`] replays change files (Parquet or JSON
//!   Lines, in any layout) over a snapshot (change-capture tests).
//! - [`firebird`] prepares an embedded Firebird runtime (no server) and test databases;
//!   [`firebird_writer`] is the concurrent writer process of Firebird consistency tests.
//! - [`objstore`] starts object-storage emulators (S3, GCS, Azure Blob) the same way.
//! - [`redis`] starts a throwaway Redis (`--redis`) for the stream's external state.
//! - [`tls`] generates the certificates of the TLS servers (`--pg-tls`, `--mariadb-tls`).
//! - [`process`] runs the `sluice` binary under test (output, time limit, failpoints);
//!   [`scenario`] holds the suites every source must pass, written once and run over
//!   PostgreSQL, MariaDB and Firebird, over the [`source`] database each engine offers;
//!   [`capture`] holds the suites every change source must pass (PostgreSQL, MariaDB, MySQL
//!   9), with the commit-counting [`writer`] they run during the stream; [`apply`] those every
//!   apply target passes (PostgreSQL, MariaDB, MySQL 9).

pub mod apply;
pub mod capture;
pub mod changes;
pub mod files;
pub mod firebird;
pub mod firebird_writer;
pub mod formats;
pub mod lake;
pub mod mariadb;
pub mod mysql;
pub mod mysql9;
pub mod objstore;
pub mod pg;
pub mod process;
pub mod redis;
pub mod scenario;
pub mod server;
pub mod source;
pub mod tls;
pub mod writer;
