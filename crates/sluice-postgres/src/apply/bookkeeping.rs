//! sluice's bookkeeping on a PostgreSQL target, in schema `sluice`: `applied` (one row per
//! replication and worker: the last unit that worker committed, written in the same
//! transaction as the unit's rows), `state` (one row per replication: the runner's JSON),
//! `columns` (one row per replication and target table: the source columns the table
//! follows, written with each column barrier), and the advisory lock a run holds on its
//! replication.

use super::failed;
use async_trait::async_trait;
use sluice_core::apply::{AppliedPosition, ReplicationLock, SourceColumn};
use sluice_core::table::TableRef;
use sluice_core::{Error, Result, Retry, StreamPos};
use tokio_postgres::Client;

/// The bookkeeping tables.
const BOOKKEEPING: &str = "CREATE TABLE IF NOT EXISTS sluice.applied (
        name text NOT NULL, worker integer NOT NULL, unit bigint NOT NULL,
        restart text NOT NULL, pos text NOT NULL, commit_ts bigint,
        updated_at timestamptz NOT NULL DEFAULT now(), skip bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (name, worker));
     CREATE TABLE IF NOT EXISTS sluice.state (
        name text PRIMARY KEY, state bytea NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now());
     CREATE TABLE IF NOT EXISTS sluice.columns (
        name text NOT NULL, table_schema text NOT NULL, table_name text NOT NULL,
        columns text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (name, table_schema, table_name))";

/// Bookkeeping created by earlier releases gains what later ones record.
const BOOKKEEPING_UPGRADE: &str =
    "ALTER TABLE sluice.applied ADD COLUMN IF NOT EXISTS skip bigint NOT NULL DEFAULT 0;
     CREATE TABLE IF NOT EXISTS sluice.columns (
        name text NOT NULL, table_schema text NOT NULL, table_name text NOT NULL,
        columns text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (name, table_schema, table_name))";

/// The first key of the advisory lock a replication run holds on the target (the second is
/// the hash of the replication's name), so sluice's locks do not meet an application's
/// one-key locks.
const LOCK_CLASS: i32 = 0x736c_7563; // "sluc"

/// Records the source columns a target table follows (`$1` replication, `$2`/`$3` table,
/// `$4` the columns as JSON).
const COLUMNS_UPSERT: &str = "INSERT INTO sluice.columns (name, table_schema, table_name, \
     columns) VALUES ($1, $2, $3, $4) ON CONFLICT (name, table_schema, table_name) DO UPDATE \
     SET columns = excluded.columns, updated_at = now()";

/// The session holding a replication's advisory lock; closing it releases the lock.
struct Locked(Client, i32);

#[async_trait]
impl ReplicationLock for Locked {
    async fn release(self: Box<Self>) -> Result<()> {
        // Unlocked by the session's end; an explicit unlock first, so a pooled connection
        // (pgbouncer in session mode) does not keep it.
        let _ = self
            .0
            .query_one("SELECT pg_advisory_unlock($1, $2)", &[&LOCK_CLASS, &self.1])
            .await;
        Ok(())
    }
}

/// The second key of a replication's advisory lock: its name hashed (xxh3, fixed by its
/// specification, so every sluice release computes the same key).
fn lock_key(name: &str) -> i32 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes()) as i32
}

/// Bring bookkeeping tables created by an earlier release up to date.
/// Only what is missing is created, so a role that may write the bookkeeping but not change
/// it (an administrator set it up) runs as long as it is current; when it is not, the message
/// says what the administrator has to run.
async fn upgrade(client: &Client, display: &str) -> Result<()> {
    let current: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'sluice.applied'::regclass \
               AND attname = 'skip' AND NOT attisdropped) \
             AND to_regclass('sluice.columns') IS NOT NULL",
            &[],
        )
        .await
        .map_err(|e| failed(e, display, "reading sluice's bookkeeping"))?
        .get(0);
    if current {
        return Ok(());
    }
    client
        .batch_execute(BOOKKEEPING_UPGRADE)
        .await
        .map_err(|e| {
            let e = failed(e, display, "updating sluice's bookkeeping (schema sluice)");
            Error::destination(
                Retry::Permanent,
                format!(
                    "{} sluice's bookkeeping on this target was created by an earlier release: \
                 have its owner run sluice replicate once, or run as its owner: \
                 {BOOKKEEPING_UPGRADE}; and grant the replication's user SELECT, INSERT, \
                 UPDATE, DELETE on sluice.columns.",
                    e.message()
                ),
            )
        })
}

/// Create what is missing of the bookkeeping (schema `sluice`, its tables, what later
/// releases added) and check that the session may write it; a missing privilege fails with
/// the `GRANT`. `user` and `db`: who the session is, for the messages.
pub(super) async fn prepare(client: &Client, d: &str, user: &str, db: &str) -> Result<()> {
    let r = client
        .query_one(
            "SELECT has_database_privilege(current_database(), 'CREATE'), \
               n.oid IS NOT NULL, \
               n.oid IS NOT NULL AND has_schema_privilege(n.oid, 'USAGE') \
                 AND has_schema_privilege(n.oid, 'CREATE'), \
               n.oid IS NOT NULL AND has_schema_privilege(n.oid, 'USAGE'), \
               coalesce(b.n = 3, false), \
               coalesce(b.n = 3 AND b.writable, false) \
             FROM (SELECT 1) AS one \
             LEFT JOIN pg_namespace n ON n.nspname = 'sluice' \
             LEFT JOIN LATERAL (SELECT count(*) AS n, bool_and( \
                 has_table_privilege(c.oid, 'SELECT') AND has_table_privilege(c.oid, 'INSERT') \
                 AND has_table_privilege(c.oid, 'UPDATE') \
                 AND has_table_privilege(c.oid, 'DELETE')) AS writable \
               FROM pg_class c WHERE c.relnamespace = n.oid \
                 AND c.relname IN ('applied', 'state', 'columns')) AS b ON true",
            &[],
        )
        .await
        .map_err(|e| failed(e, d, "checking privileges"))?;
    let (db_create, schema, schema_create, tables): (bool, bool, bool, bool) =
        (r.get(0), r.get(1), r.get(2), r.get(4));
    let user_q = crate::sql::quote_ident(user);
    let missing = |grant: String, why: &str| {
        Error::destination(
            Retry::Permanent,
            format!(
                "user {user} cannot {why} on the target {d}: run {grant} (as the database \
                 owner or a superuser), or connect as a user that can"
            ),
        )
    };
    if !schema && !db_create {
        return Err(missing(
            format!(
                "GRANT CREATE ON DATABASE {} TO {user_q};",
                crate::sql::quote_ident(db)
            ),
            "create schema sluice (where replication keeps its applied position)",
        ));
    }
    if schema && !tables && !schema_create {
        return Err(missing(
            format!("GRANT USAGE, CREATE ON SCHEMA sluice TO {user_q};"),
            "create sluice's bookkeeping tables in schema sluice",
        ));
    }
    if tables {
        if !r.get::<_, bool>(5) || !r.get::<_, bool>(3) {
            return Err(missing(
                format!(
                    "GRANT USAGE ON SCHEMA sluice TO {user_q}; GRANT SELECT, INSERT, \
                     UPDATE, DELETE ON sluice.applied, sluice.state, sluice.columns TO \
                     {user_q};"
                ),
                "write sluice's bookkeeping tables",
            ));
        }
        return upgrade(client, d).await;
    }
    let sql = if schema {
        BOOKKEEPING.to_string()
    } else {
        format!("CREATE SCHEMA IF NOT EXISTS sluice; {BOOKKEEPING}")
    };
    client
        .batch_execute(&sql)
        .await
        .map_err(|e| failed(e, d, "creating schema sluice and its tables"))?;
    // Tables an earlier release created are kept by `IF NOT EXISTS`: bring them up to date.
    upgrade(client, d).await
}

/// The replication's saved state.
pub(super) async fn load_state(client: &Client, d: &str, name: &str) -> Result<Option<Vec<u8>>> {
    let row = client
        .query_opt("SELECT state FROM sluice.state WHERE name = $1", &[&name])
        .await
        .map_err(|e| failed(e, d, "reading sluice.state"))?;
    Ok(row.map(|r| r.get(0)))
}

/// Save the replication's state.
pub(super) async fn save_state(client: &Client, d: &str, name: &str, state: &[u8]) -> Result<()> {
    client
        .execute(
            "INSERT INTO sluice.state (name, state) VALUES ($1, $2) ON CONFLICT (name) \
             DO UPDATE SET state = excluded.state, updated_at = now()",
            &[&name, &state],
        )
        .await
        .map_err(|e| failed(e, d, "writing sluice.state"))?;
    Ok(())
}

/// Forget the replication: state, positions, followed columns.
pub(super) async fn clear_state(mut client: Client, d: &str, name: &str) -> Result<()> {
    let tx = client
        .transaction()
        .await
        .map_err(|e| failed(e, d, "clearing the replication's state"))?;
    for sql in [
        "DELETE FROM sluice.applied WHERE name = $1",
        "DELETE FROM sluice.state WHERE name = $1",
        "DELETE FROM sluice.columns WHERE name = $1",
    ] {
        tx.execute(sql, &[&name])
            .await
            .map_err(|e| failed(e, d, "clearing the replication's state"))?;
    }
    tx.commit()
        .await
        .map_err(|e| failed(e, d, "clearing the replication's state"))
}

/// The applied position: the highest unit any worker recorded.
pub(super) async fn applied(
    client: &Client,
    d: &str,
    name: &str,
) -> Result<Option<AppliedPosition>> {
    let row = client
        .query_opt(
            "SELECT unit, restart, pos, commit_ts, skip FROM sluice.applied \
             WHERE name = $1 ORDER BY unit DESC LIMIT 1",
            &[&name],
        )
        .await
        .map_err(|e| failed(e, d, "reading sluice.applied"))?;
    Ok(row.map(|r| AppliedPosition {
        unit: r.get::<_, i64>(0) as u64,
        restart: StreamPos::from_adapter(r.get::<_, String>(1)),
        pos: StreamPos::from_adapter(r.get::<_, String>(2)),
        commit_ts: r.get(3),
        skip: r.get::<_, i64>(4) as u64,
    }))
}

/// The source columns each target table follows.
pub(super) async fn followed_columns(
    client: &Client,
    d: &str,
    name: &str,
) -> Result<Vec<(TableRef, Vec<SourceColumn>)>> {
    let rows = client
        .query(
            "SELECT table_schema, table_name, columns FROM sluice.columns WHERE name = $1",
            &[&name],
        )
        .await
        .map_err(|e| failed(e, d, "reading sluice.columns"))?;
    rows.iter()
        .map(|r| {
            let columns = serde_json::from_str(r.get::<_, &str>(2)).map_err(|e| {
                Error::destination(
                    Retry::Permanent,
                    format!("sluice.columns on {} cannot be read: {e}", d),
                )
            })?;
            Ok((
                TableRef::new(r.get::<_, String>(0), r.get::<_, String>(1)),
                columns,
            ))
        })
        .collect()
}

/// Record the source columns target tables follow.
pub(super) async fn save_columns(
    client: &Client,
    d: &str,
    name: &str,
    tables: &[(TableRef, Vec<SourceColumn>)],
) -> Result<()> {
    for (t, columns) in tables {
        client
            .execute(
                COLUMNS_UPSERT,
                &[&name, &t.schema, &t.name, &SourceColumn::list_json(columns)],
            )
            .await
            .map_err(|e| failed(e, d, "writing sluice.columns"))?;
    }
    Ok(())
}

/// Hold replication `name` on this session (an advisory lock) for the run; refused, naming
/// the holder, when another session holds it.
pub(super) async fn lock(client: Client, d: &str, name: &str) -> Result<Box<dyn ReplicationLock>> {
    let key = lock_key(name);
    let held: bool = client
        .query_one("SELECT pg_try_advisory_lock($1, $2)", &[&LOCK_CLASS, &key])
        .await
        .map_err(|e| failed(e, d, "locking the replication"))?
        .get(0);
    if held {
        return Ok(Box::new(Locked(client, key)));
    }
    let holder = client
        .query_opt(
            "SELECT a.pid::text, coalesce(host(a.client_addr), 'local'), \
               coalesce(a.application_name, ''), a.backend_start::text \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.database = \
               (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND l.classid = $1::int::oid AND l.objid = $2::int::oid AND l.objsubid = 2",
            &[&LOCK_CLASS, &key],
        )
        .await
        .map_err(|e| failed(e, d, "looking up who runs the replication"))?
        .map(|r| {
            format!(
                " (session pid {} from {}, application {:?}, connected since {})",
                r.get::<_, String>(0),
                r.get::<_, String>(1),
                r.get::<_, String>(2),
                r.get::<_, String>(3)
            )
        })
        .unwrap_or_default();
    Err(Error::config(format!(
        "replication {name} is already running against {d}{holder}: one run applies a \
         replication at a time. Wait for that run to end (or stop it); to run a separate \
         replication, pass another --slot."
    )))
}
