//! Creating a logical slot, saying what it waits for.
//!
//! A logical slot becomes consistent only once every transaction that held a transaction id
//! when its creation began has ended (prepared ones included): `CREATE_REPLICATION_SLOT` waits
//! for them, silently, however long they run — a session left idle in transaction holds up a
//! stream's first start, or a converged export's start and end point, for hours. The wait
//! harms nothing on the server (the creating session holds no lock others need), so by default
//! it is not cut short; but after [`FIRST_WORD`] and then every [`AGAIN`] the transactions it
//! waits for are named, with what would end the wait. With a limit (`--slot-wait`) the creation
//! is given up past it: the creating session's wait is cancelled, which makes the server drop
//! the slot it had begun (a slot is kept only once consistent), and the error names the
//! blockers.

use super::conn::ReplConn;
use super::slot::{self, CreatedSlot};
use crate::error::{Phase, classify};
use sluice_core::{Error, Result};
use std::time::Duration;
use tokio_postgres::Client;

/// How long a creation waits before its blockers are named.
const FIRST_WORD: Duration = Duration::from_secs(5);
/// How often they are named again while it still waits.
const AGAIN: Duration = Duration::from_secs(30);

/// [`slot::create_slot`], naming on `client` (another session) the transactions it waits for.
pub(super) async fn create_slot(
    conn: &mut ReplConn,
    client: &Client,
    name: &str,
    temporary: bool,
    export: bool,
    limit: Option<Duration>,
) -> Result<CreatedSlot> {
    let server = conn.display().to_string();
    let creating = slot::create_slot(conn, name, temporary, export);
    tokio::pin!(creating);
    let mut waited = Duration::ZERO;
    loop {
        // The next word is due after FIRST_WORD, then every AGAIN; the limit ends it sooner.
        let word = if waited.is_zero() { FIRST_WORD } else { AGAIN };
        let wait = match limit {
            Some(l) => word.min(l.saturating_sub(waited)),
            None => word,
        };
        tokio::select! {
            created = &mut creating => return created,
            () = tokio::time::sleep(wait) => {
                waited += wait;
                // Bounded, so a slow catalog query does not hide the slot's creation.
                let named = tokio::time::timeout(Duration::from_secs(5), blockers(client, &server));
                let list = match named.await {
                    Ok(Ok(list)) if !list.is_empty() => list.join("; "),
                    Ok(Ok(_)) => "none this role can see (pg_read_all_stats shows other users' \
                                  sessions)"
                        .to_string(),
                    Ok(Err(e)) => format!("they could not be listed: {e}"),
                    Err(_) => "they could not be listed in time".to_string(),
                };
                if limit.is_some_and(|l| waited >= l) {
                    // Cancel the creating session's wait: the server drops a slot not yet
                    // consistent. (Closing the connection alone would not stop the wait, and the
                    // slot would be made once the transactions end, with nobody to read it.)
                    let _ = client
                        .execute(
                            "SELECT pg_cancel_backend(active_pid) FROM pg_replication_slots \
                             WHERE slot_name = $1 AND active_pid IS NOT NULL",
                            &[&name],
                        )
                        .await;
                    if let Ok(Ok(created)) =
                        tokio::time::timeout(Duration::from_secs(10), &mut creating).await
                    {
                        // The wait ended just as it was given up.
                        return Ok(created);
                    }
                    return Err(Error::source_transient(format!(
                        "creating replication slot {name} on {server} waited {} s (--slot-wait) \
                         for transactions that were running when it began, and was given up; \
                         no slot is left. A logical slot starts only once they end: {list}. \
                         Commit or roll them back, or end their sessions \
                         (pg_terminate_backend), then run again — or raise --slot-wait.",
                        waited.as_secs()
                    )));
                }
                tracing::warn!(
                    "creating replication slot {name} on {server} has waited {} s for \
                     transactions that were running when it began (a logical slot starts only \
                     once they end): {list}. It goes on when they end: commit or roll them \
                     back, or end their sessions (pg_terminate_backend).",
                    waited.as_secs()
                );
            }
        }
    }
}

/// The oldest transactions holding a transaction id, and prepared transactions, in words.
async fn blockers(client: &Client, display: &str) -> Result<Vec<String>> {
    let rows = client
        .query(
            "SELECT pid::text, coalesce(usename, ''), coalesce(application_name, ''), \
                    coalesce(state, '?'), \
                    coalesce(extract(epoch FROM now() - xact_start)::bigint, -1), \
                    left(regexp_replace(coalesce(query, ''), '\\s+', ' ', 'g'), 80) \
               FROM pg_stat_activity \
              WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() \
                AND backend_type IS DISTINCT FROM 'walsender' \
              ORDER BY xact_start NULLS LAST LIMIT 5",
            &[],
        )
        .await
        .map_err(|e| classify(e, Phase::Catalog, display))?;
    let mut out: Vec<String> = rows
        .iter()
        .map(|r| {
            let app: String = r.get(2);
            format!(
                "pid {} ({}{}, {} for {} s: {})",
                r.get::<_, String>(0),
                r.get::<_, String>(1),
                if app.is_empty() {
                    String::new()
                } else {
                    format!(", application {app:?}")
                },
                r.get::<_, String>(3),
                r.get::<_, i64>(4),
                r.get::<_, String>(5)
            )
        })
        .collect();
    let prepared = client
        .query(
            "SELECT gid, coalesce(extract(epoch FROM now() - prepared)::bigint, -1) \
               FROM pg_prepared_xacts ORDER BY prepared LIMIT 5",
            &[],
        )
        .await
        .map_err(|e| classify(e, Phase::Catalog, display))?;
    out.extend(prepared.iter().map(|r| {
        format!(
            "prepared transaction {:?} (prepared {} s ago; COMMIT PREPARED or ROLLBACK PREPARED \
             ends it)",
            r.get::<_, String>(0),
            r.get::<_, i64>(1)
        )
    }));
    Ok(out)
}
