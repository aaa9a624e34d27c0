//! The apply suite (`sluice_testkit::apply::suite`), one row per scenario and target: every
//! apply target passes the same bodies, each checked by reading the target back with SQL.

use sluice_testkit::apply::{Engine, suite};

/// One `#[tokio::test]` per target for each scenario: `apply_suite::<scenario>::<engine>`.
macro_rules! rows {
    ($($scenario:ident),* $(,)?) => {
        $(
            mod $scenario {
                use super::*;

                #[tokio::test]
                async fn pg() {
                    suite::$scenario(Engine::Postgres).await
                }

                #[tokio::test]
                async fn mariadb() {
                    suite::$scenario(Engine::Mariadb).await
                }

                #[tokio::test]
                async fn mysql9() {
                    suite::$scenario(Engine::Mysql9).await
                }
            }
        )*
    };
}

rows!(
    units_apply_in_order,
    past_the_send_buffer,
    conflicts,
    barriers_applied_twice,
    earlier_bookkeeping,
);
