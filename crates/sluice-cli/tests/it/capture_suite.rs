//! The change-capture suite (`sluice_testkit::capture::suite`), one row per scenario and
//! engine: every change source passes the same bodies, each ending with the change files
//! replayed over the snapshot and compared with the source table.

use crate::common::harness;
use sluice_testkit::capture::{Engine, suite};

/// One `#[tokio::test]` per engine for each scenario: `capture_suite::<scenario>::<engine>`.
macro_rules! rows {
    ($($scenario:ident),* $(,)?) => {
        $(
            mod $scenario {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn pg() {
                    suite::$scenario(&harness(), Engine::Postgres).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn mariadb() {
                    suite::$scenario(&harness(), Engine::Mariadb).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn mysql9() {
                    suite::$scenario(&harness(), Engine::Mysql9).await
                }
            }
        )*
    };
}

rows!(
    handoff,
    killed_at_every_point,
    schema_change,
    truncate,
    initial_none,
    changes_while_stopped,
    before_images,
    columns,
    new_table,
    dropped_table,
    delta_table,
);
