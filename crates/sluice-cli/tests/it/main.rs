//! The integration tests of sluice, as one test binary: every module is a topic, run against
//! the real `sluice` binary and the throwaway servers of `sluice-testkit run` (PostgreSQL,
//! MariaDB, Firebird, object-storage emulators). One binary links the whole tree once instead
//! of once per topic. Pick a topic with a filter: `cargo test --workspace --test it resume::`.
#![allow(clippy::unwrap_used)]

mod common;
mod objstore_common;

mod apply_mysql;
mod apply_pg;
mod apply_suite;
mod before_images;
mod capture_edges;
mod capture_suite;
mod chunking;
mod cli;
mod columns;
mod consistency;
mod converged;
mod converged_mariadb;
mod converged_mariadb_schema;
mod converged_spill;
mod delta;
mod demo;
mod errors;
mod faults;
mod firebird_consistency;
mod firebird_errors;
mod firebird_parallel;
mod firebird_types;
mod harm_budget;
mod harm_budget_mysql;
mod iceberg;
mod interrupt;
mod locks;
mod mysql9;
mod mysql_cascades;
mod mysql_chunking;
mod mysql_consistency;
mod mysql_faults;
mod mysql_harm;
mod mysql_positions;
mod mysql_schema_drift;
mod mysql_stream;
mod mysql_tls;
mod mysql_types;
mod objstore_azure;
mod objstore_gcs;
mod objstore_s3;
mod parquet_encodings;
mod quoting;
mod relkinds;
mod replicate;
mod replicate_faults;
mod replicate_schemas;
mod replicate_target_lag;
mod resume;
mod scenarios;
mod security;
mod stream;
mod stream_claims;
mod stream_converged;
mod stream_delta;
mod stream_formats;
mod stream_layouts;
mod stream_metrics;
mod stream_standby;
mod stream_tables;
mod tls;
mod types;
