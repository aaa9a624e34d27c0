//! What a stream needs from the server before it starts, and what it costs the server while it
//! runs: checks with their fixes, the publication, the slot, and the slot's harm.

use super::conn::{ConnError, ReplConn};
use super::values::Codec;
use crate::catalog::{ServerInfo, load_types};
use crate::error::{Phase, classify};
use crate::sql::{quote_ident, quote_table};
use crate::types::{TypeMap, map_column};
use sluice_core::table::TableRef;
use sluice_core::{ColumnDesc, Dataset, DatasetKind, Error, Result};
use tokio_postgres::Client;

/// The oldest server whose pgoutput sends values in binary form (`binary 'true'`).
pub const MIN_VERSION_NUM: i32 = 140_000;

/// Refuse what cannot stream, each with its fix: an old server, `wal_level` other than
/// `logical`, a user without REPLICATION, a table whose updates and deletes cannot be keyed, a
/// view or query, a column whose type the stream cannot decode.
pub async fn preflight(
    client: &Client,
    server: &ServerInfo,
    datasets: &[Dataset],
    types: &mut TypeMap,
    display: &str,
) -> Result<()> {
    let err = |e| classify(e, Phase::Catalog, display);
    if server.version_num < MIN_VERSION_NUM {
        return Err(Error::source_permanent(format!(
            "{display} runs {}; sluice stream needs PostgreSQL 14 or later, whose logical \
             replication sends values in binary form (the export's decoders read them). Export \
             with sluice export instead, or upgrade the server.",
            server.version
        )));
    }
    let row = client
        .query_one(
            "SELECT current_setting('wal_level'), \
                    (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user)",
            &[],
        )
        .await
        .map_err(err)?;
    let wal_level: String = row.get(0);
    if wal_level != "logical" {
        return Err(Error::source_permanent(format!(
            "{display} has wal_level = {wal_level}, so it writes no logical change records. \
             Set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) \
             and restart the server."
        )));
    }
    if !row.get::<_, Option<bool>>(1).unwrap_or(false) {
        return Err(Error::source_permanent(format!(
            "user {} on {display} lacks the REPLICATION attribute, which a replication slot \
             needs. Grant it (ALTER ROLE {} REPLICATION) or connect as a user that has it.",
            server.user,
            quote_ident(&server.user)
        )));
    }
    for ds in datasets {
        let Some(t) = ds.object.as_ref() else {
            return Err(Error::config(format!(
                "{} is a query; sluice stream captures tables only.",
                ds.name
            )));
        };
        if !matches!(ds.kind, DatasetKind::Table | DatasetKind::Partitioned) {
            return Err(Error::config(format!(
                "{} is a view; sluice stream captures tables only (views have no change log).",
                ds.name
            )));
        }
        // What the server logs for an update or delete is decided per leaf: a partitioned
        // table's partitions each have their own replica identity (ALTER TABLE … REPLICA
        // IDENTITY on the parent does not reach them), and once the table is published, the
        // server refuses updates and deletes on a leaf without one — the application's, not
        // only ours. A plain table is its own only leaf (pg_partition_tree lists nothing for it).
        let leaves = leaves(client, t, display).await?;
        for (name, identity, has_pk) in leaves {
            let keyed = match identity.as_str() {
                "f" | "i" => true,
                "d" => has_pk,
                _ => false,
            };
            if keyed {
                continue;
            }
            let what = if identity == "n" {
                "REPLICA IDENTITY NOTHING"
            } else {
                "no primary key"
            };
            return Err(Error::config(if ds.kind == DatasetKind::Partitioned {
                format!(
                    "partition {name} of {} has {what}, so its updates and deletes cannot be \
                     keyed in change files (and, once published, the server would refuse them). \
                     Add a primary key to {}, or log whole old rows on each such partition: \
                     ALTER TABLE {name} REPLICA IDENTITY FULL.",
                    ds.name,
                    quote_table(t)
                )
            } else {
                format!(
                    "{} has {what}, so its updates and deletes cannot be keyed in change files. \
                     Add a primary key, or log whole old rows: ALTER TABLE {} REPLICA IDENTITY \
                     FULL.",
                    ds.name,
                    quote_table(t)
                )
            }));
        }
        table_columns(client, t, types, server.money_scale, display).await?;
    }
    Ok(())
}

/// The leaves of `t` whose replica identity decides what the log carries for an update or a
/// delete — its partitions, or itself when it is a plain table (`pg_partition_tree` lists
/// nothing for one) — with each one's `relreplident` (`d`, `f`, `i`, `n`) and whether it has a
/// primary key.
pub(super) async fn leaves(
    client: &Client,
    t: &TableRef,
    display: &str,
) -> Result<Vec<(String, String, bool)>> {
    let rows = client
        .query(
            "SELECT c.oid::regclass::text, c.relreplident::text, \
                    EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) \
             FROM pg_class c \
             WHERE (c.oid = $1::text::regclass AND c.relkind = 'r') \
                OR c.oid IN (SELECT relid FROM pg_partition_tree($1::text::regclass) \
                             WHERE isleaf) \
             ORDER BY 1",
            &[&quote_table(t)],
        )
        .await
        .map_err(|e| classify(e, Phase::Catalog, display))?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// The columns of `t` as the export describes them, with how each replicated value is
/// decoded: the columns logical replication sends, so no generated column (pgoutput leaves
/// them out of Relation messages and tuples). None when the table no longer exists (dropped
/// after the stream's position). Fails naming a column whose type the stream cannot decode.
pub async fn table_columns(
    client: &Client,
    t: &TableRef,
    types: &mut TypeMap,
    money_scale: i8,
    display: &str,
) -> Result<Vec<(ColumnDesc, u32, Codec)>> {
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid, a.atttypmod, a.attndims::int4, \
                    format_type(a.atttypid, a.atttypmod) \
             FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 \
               AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
            &[&quote_table(t)],
        )
        .await
        .map_err(|e| classify(e, Phase::Catalog, display))?;
    let oids: Vec<u32> = rows.iter().map(|r| r.get(1)).collect();
    load_types(client, &oids, types, display).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let name: String = r.get(0);
        let type_oid: u32 = r.get(1);
        let m = map_column(types, type_oid, r.get(2), r.get(3), money_scale);
        let codec = Codec::for_column(types, type_oid, &m);
        let source_type: String = r.get(4);
        if let Some(ty) = codec.unsupported() {
            return Err(Error::config(format!(
                "{t}.{name} is of type {ty} ({source_type}), whose replicated binary form sluice \
                 stream cannot decode (the export reads it as text through a cast, which a \
                 replication stream cannot apply). Leave the table out of the stream, or change \
                 the column's type."
            )));
        }
        out.push((
            ColumnDesc {
                field: m.field(&name, true),
                name,
                source_type,
                cast: m.cast.clone(),
                as_text_fallback: m.fallback,
            },
            type_oid,
            codec,
        ));
    }
    Ok(out)
}

/// One column described from a Relation message alone (when the catalog has moved on).
pub fn describe(
    types: &TypeMap,
    t: &TableRef,
    c: &super::pgoutput::RelColumn,
    money_scale: i8,
) -> Result<(ColumnDesc, u32, Codec)> {
    let m = map_column(types, c.type_oid, c.typmod, 0, money_scale);
    let codec = Codec::for_column(types, c.type_oid, &m);
    let ty = types
        .get(&c.type_oid)
        .map(|t| t.name.clone())
        .unwrap_or_else(|| format!("type {}", c.type_oid));
    if codec.unsupported().is_some() {
        return Err(Error::config(format!(
            "{t}.{} is of type {ty}, whose replicated binary form sluice stream cannot decode. \
             Leave the table out of the stream, or change the column's type.",
            c.name
        )));
    }
    Ok((
        ColumnDesc {
            field: m.field(&c.name, true),
            name: c.name.clone(),
            source_type: ty,
            cast: m.cast.clone(),
            as_text_fallback: m.fallback,
        },
        c.type_oid,
        codec,
    ))
}

/// A slot as `pg_replication_slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotInfo {
    /// Backend pid of the session streaming from it, if one is.
    pub active_pid: Option<i32>,
    /// The output plugin.
    pub plugin: Option<String>,
    /// The database it decodes.
    pub database: Option<String>,
    /// `wal_status` (`reserved`, `extended`, `unreserved`, `lost`).
    pub wal_status: Option<String>,
    /// How far a reader confirmed having handled the changes: the server never sends a
    /// transaction that commits before it again.
    pub confirmed_flush: Option<u64>,
}

/// The slot named `name`, if it exists.
pub async fn slot_info(client: &Client, name: &str, display: &str) -> Result<Option<SlotInfo>> {
    let row = client
        .query_opt(
            "SELECT active_pid, plugin::text, database::text, wal_status, \
             confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await
        .map_err(|e| classify(e, Phase::Catalog, display))?;
    Ok(row.map(|r| SlotInfo {
        active_pid: r.get(0),
        plugin: r.get(1),
        database: r.get(2),
        wal_status: r.get(3),
        confirmed_flush: r.get::<_, Option<String>>(4).as_deref().and_then(parse_lsn),
    }))
}

/// A slot created with an exported snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedSlot {
    /// Where the slot became consistent: the snapshot sees exactly the transactions whose
    /// commit record starts before it, and the stream sends those that start at or after it.
    pub consistent_point: u64,
    /// The exported snapshot's name (valid while the creating session stays idle).
    pub snapshot: Option<String>,
}

/// Create a logical pgoutput slot on `conn`, exporting its snapshot when `export`.
/// `temporary` slots vanish with the session.
pub async fn create_slot(
    conn: &mut ReplConn,
    name: &str,
    temporary: bool,
    export: bool,
) -> Result<CreatedSlot> {
    // The pre-15 syntax, which every supported server accepts.
    let sql = format!(
        "CREATE_REPLICATION_SLOT {}{} LOGICAL pgoutput {}",
        quote_ident(name),
        if temporary { " TEMPORARY" } else { "" },
        if export {
            "EXPORT_SNAPSHOT"
        } else {
            "NOEXPORT_SNAPSHOT"
        }
    );
    let display = conn.display().to_string();
    let rows = conn.query(&sql).await.map_err(|e| match e {
        ConnError::Server(s) if s.code == "42710" => Error::config(format!(
            "replication slot {name} already exists on {display} but this output has no stream \
             state for it. Pass another --slot, or drop the old slot (sluice stream --drop with \
             the arguments that created it, or SELECT pg_drop_replication_slot('{name}')) — \
             a slot nobody reads keeps WAL on the server."
        )),
        ConnError::Server(s) if s.code == "53400" => Error::source_permanent(format!(
            "{display} has no free replication slot ({s}). Raise max_replication_slots or drop \
             an unused slot (SELECT slot_name, active FROM pg_replication_slots)."
        )),
        other => other.into_error("creating replication slot", &display),
    })?;
    let row = rows
        .first()
        .ok_or_else(|| Error::internal("CREATE_REPLICATION_SLOT returned no row"))?;
    let point = row
        .get(1)
        .and_then(|p| p.as_deref())
        .and_then(parse_lsn)
        .ok_or_else(|| Error::internal("CREATE_REPLICATION_SLOT returned no consistent point"))?;
    Ok(CreatedSlot {
        consistent_point: point,
        snapshot: row.get(2).cloned().flatten(),
    })
}

/// How long [`settle`] waits for committed transactions to become visible.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Wait until every transaction committed before a slot was created is visible to new
/// snapshots. A commit is written to the log before it becomes visible (with synchronous
/// replication, until a standby confirms it): one written before the slot's consistent point
/// is not in its stream, and a snapshot taken before it is visible misses it — a converged
/// export's chunk would then lose it for good. Such a transaction is in a new snapshot's
/// in-progress list while its status already says committed; this waits for those.
pub async fn settle(client: &Client, display: &str) -> Result<()> {
    let limbo = async || -> Result<Vec<i64>> {
        let rows = client
            .query(
                "SELECT x FROM txid_snapshot_xip(txid_current_snapshot()) x \
                 WHERE txid_status(x) = 'committed'",
                &[],
            )
            .await
            .map_err(|e| classify(e, Phase::Catalog, display))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    };
    let first = limbo().await?;
    if first.is_empty() {
        return Ok(());
    }
    let since = std::time::Instant::now();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let still: Vec<i64> = limbo()
            .await?
            .into_iter()
            .filter(|x| first.contains(x))
            .collect();
        if still.is_empty() {
            return Ok(());
        }
        if since.elapsed() > SETTLE_WAIT {
            let ids: Vec<String> = still.iter().map(i64::to_string).collect();
            return Err(Error::source_transient(format!(
                "transactions {} on {display} are committed but still not visible after {} s \
                 (waiting for a synchronous standby?): a snapshot taken now would miss them. \
                 Run again once the standby confirms them.",
                ids.join(", "),
                SETTLE_WAIT.as_secs()
            )));
        }
    }
}

/// The backend still streaming from slot `name` after a short wait, or `None`: a stream that
/// just ended (this process's, or another's that stopped a moment ago) may hold its slot until
/// its server process has exited, which takes milliseconds, not seconds.
pub async fn streaming_pid(client: &Client, name: &str, display: &str) -> Result<Option<i32>> {
    let since = std::time::Instant::now();
    loop {
        let pid = slot_info(client, name, display)
            .await?
            .and_then(|i| i.active_pid);
        if pid.is_none() || since.elapsed() > std::time::Duration::from_secs(5) {
            return Ok(pid);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Drop slot `name` if it exists (refused by the server while a session streams from it).
pub async fn drop_slot(client: &Client, name: &str, display: &str) -> Result<bool> {
    let dropped = client
        .query(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
             WHERE slot_name = $1",
            &[&name],
        )
        .await
        .map_err(|e| {
            classify(e, Phase::Catalog, display).context(format!("dropping slot {name}"))
        })?;
    Ok(!dropped.is_empty())
}

/// What the slot costs the server now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotHarm {
    /// WAL the slot keeps on the server: bytes from its restart point to the current WAL end.
    pub retained_bytes: u64,
    /// Bytes from the slot's confirmed position to the current WAL end.
    pub lag_bytes: u64,
    /// The current WAL end.
    pub wal_end: u64,
}

/// Sample slot `name`'s harm.
pub async fn slot_harm(client: &Client, name: &str, display: &str) -> Result<Option<SlotHarm>> {
    let row = client
        .query_opt(
            "SELECT pg_current_wal_lsn()::text, restart_lsn::text, confirmed_flush_lsn::text \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await
        .map_err(|e| classify(e, Phase::Catalog, display))?;
    Ok(row.map(|r| {
        let lsn = |i: usize| r.get::<_, Option<String>>(i).as_deref().and_then(parse_lsn);
        let end = lsn(0).unwrap_or(0);
        SlotHarm {
            retained_bytes: end.saturating_sub(lsn(1).unwrap_or(end)),
            lag_bytes: end.saturating_sub(lsn(2).unwrap_or(end)),
            wal_end: end,
        }
    }))
}

/// Parse an LSN as PostgreSQL prints it (`16/B374D848`).
pub fn parse_lsn(s: &str) -> Option<u64> {
    let (hi, lo) = s.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

/// An LSN as PostgreSQL prints it.
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn_round_trip() {
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(format_lsn(0x16_B374_D848), "16/B374D848");
        assert_eq!(parse_lsn("nonsense"), None);
    }
}
