//! What the server must be for a stream, where its binary log is, and what a stream costs it.
//! (PostgreSQL's `slot.rs` holds the same checks; the binary log needs no slot or
//! publication, so there is nothing to create or drop here.)
//!
//! Checks, each refused with the fix: binary logging on, `binlog_format=ROW` (statement-based
//! events carry SQL, not rows), no compressed binary log events (MariaDB `log_bin_compress`;
//! MySQL's `binlog_transaction_compression` is read: `stream.rs`), no partial JSON updates (MySQL
//! `binlog_row_value_options`), no prepared XA transaction pending (`XA RECOVER`), a primary key on every table, the
//! account's right to read the binary log status (REPLICATION CLIENT, MariaDB 10.5+: BINLOG
//! MONITOR) and to read the log itself (REPLICATION SLAVE, proved by a short dump), and column
//! types whose binary log values can be decoded (`values.rs`). `binlog_row_image=MINIMAL` or
//! `NOBLOB` is accepted: columns a row event does not carry are named in `_absent`.
//! Tables in engines without transactions (MyISAM, Aria, MEMORY) are refused unless
//! `--lock-non-transactional`: the initial snapshot does not cover them (they are read as they
//! are, not at the snapshot's binary log position), so the stream could not meet their
//! snapshot exactly; with the flag the export holds them under read locks from the snapshot's
//! moment, which does.

use super::binlog::BinPos;
use super::values::{check_columns, column_facts};
use crate::catalog::{Flavor, ServerInfo, number, text};
use crate::error::{Phase, classify, server_code};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use sluice_core::{Dataset, Error, Result};
use std::collections::HashMap;

/// The server's binary log settings.
pub async fn variables(conn: &mut Conn, target: &str) -> Result<HashMap<String, String>> {
    let rows: Vec<Row> = conn
        .query(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('log_bin', 'binlog_format', \
             'binlog_row_image', 'log_bin_compress', 'binlog_row_value_options', \
             'binlog_expire_logs_seconds', 'expire_logs_days', 'server_id', 'gtid_mode', \
             'binlog_row_metadata', 'log_bin_basename')",
        )
        .await
        .map_err(|e| classify(e, Phase::Catalog, target))?;
    Ok(rows
        .iter()
        .map(|r| (text(r, 0).to_ascii_lowercase(), text(r, 1)))
        .collect())
}

/// The binary log's end now: file, offset and GTID position (MariaDB `gtid_binlog_pos`, MySQL
/// `gtid_executed`). Needs REPLICATION CLIENT (MariaDB 10.5+: BINLOG MONITOR).
pub async fn master_status(
    conn: &mut Conn,
    server: &ServerInfo,
    target: &str,
) -> Result<(String, u64)> {
    let sql = if server.flavor == Flavor::Mysql && server.at_least((8, 2, 0)) {
        "SHOW BINARY LOG STATUS"
    } else {
        "SHOW MASTER STATUS"
    };
    let row: Option<Row> = conn.query_first(sql).await.map_err(|e| {
        if matches!(server_code(&e), Some(1227) | Some(1044) | Some(1045)) {
            Error::source_permanent(format!(
                "the account in the URL may not read the binary log position of {target} \
                 ({e}). Grant it: GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO … \
                 (MariaDB 10.5 and later: REPLICATION SLAVE, BINLOG MONITOR)."
            ))
        } else {
            classify(e, Phase::Catalog, target)
        }
    })?;
    let row = row.ok_or_else(|| not_logging(target))?;
    let file = text(&row, 0);
    if file.is_empty() {
        return Err(not_logging(target));
    }
    Ok((file, number(&row, 1)))
}

fn not_logging(target: &str) -> Error {
    Error::source_permanent(format!(
        "{target} does not write a binary log, so there are no changes to stream. Start the \
         server with log_bin (and binlog_format=ROW, server_id set)."
    ))
}

/// Refuse a server or tables that cannot stream, with the fix.
pub async fn preflight(
    conn: &mut Conn,
    server: &ServerInfo,
    datasets: &[Dataset],
    lock_non_transactional: bool,
    target: &str,
) -> Result<HashMap<String, String>> {
    let vars = variables(conn, target).await?;
    let get = |k: &str| {
        vars.get(k)
            .map(|s| s.to_ascii_uppercase())
            .unwrap_or_default()
    };
    if get("log_bin") != "ON" {
        return Err(not_logging(target));
    }
    let format = get("binlog_format");
    if format != "ROW" {
        return Err(Error::source_permanent(format!(
            "{target} logs changes with binlog_format={format}: statement-based events carry SQL \
             text, not the changed rows, so they cannot be captured. Set binlog_format=ROW \
             (SET GLOBAL binlog_format='ROW' and in the server's configuration; sessions \
             started before keep their format until they reconnect)."
        )));
    }
    if get("log_bin_compress") == "ON" {
        return Err(Error::source_permanent(format!(
            "{target} compresses its binary log (log_bin_compress=ON), whose events sluice \
             stream does not read. Set log_bin_compress=OFF."
        )));
    }
    if get("binlog_row_value_options").contains("PARTIAL_JSON") {
        return Err(Error::source_permanent(format!(
            "{target} logs JSON updates as diffs (binlog_row_value_options=PARTIAL_JSON), which \
             do not carry the new value. Set binlog_row_value_options=''."
        )));
    }
    if get("binlog_row_metadata") != "FULL" {
        tracing::warn!(
            "{target} logs binlog_row_metadata={}: its table maps do not say how a table's values \
             were stored, so a change of a column's type between a stop and a restart of the \
             stream (enum members reordered, signed to unsigned, another character set) cannot \
             be seen and older events would be read with today's definition. Set \
             binlog_row_metadata=FULL (MySQL 8.0.1+, MariaDB 10.5+).",
            get("binlog_row_metadata")
        );
    }
    let image = get("binlog_row_image");
    if image == "MINIMAL" || image == "NOBLOB" {
        tracing::warn!(
            "{target} logs binlog_row_image={image}: updates and deletes carry only some \
             columns; the others are named in _absent (they kept their value), never written \
             as NULL. An update of a primary key is written as a delete and an insert that \
             carry only the key and the changed columns: a replay cannot rebuild such a row, \
             and sluice replicate refuses this setting. Set binlog_row_image=FULL where keys \
             change."
        );
    }
    // A prepared XA transaction is seen by no consistent snapshot and is in the binary log
    // before the stream's start: committed later, its changes would be in neither.
    let prepared: Vec<Row> = match conn.query("XA RECOVER").await {
        Ok(rows) => rows,
        Err(e) => {
            // MySQL 8 asks for XA_RECOVER_ADMIN.
            tracing::warn!(
                "prepared XA transactions on {target} cannot be listed ({e}): one prepared \
                 before the stream starts and committed after would be missed. Grant \
                 XA_RECOVER_ADMIN to check."
            );
            Vec::new()
        }
    };
    if !prepared.is_empty() {
        let ids: Vec<String> = prepared.iter().map(|r| text(r, 3)).collect();
        return Err(Error::source_permanent(format!(
            "{target} has prepared XA transactions that are not committed or rolled back yet \
             ({}): the initial snapshot does not see them and their changes are in the binary \
             log before the stream's start, so if committed later they would be in neither. \
             Commit or roll them back (XA COMMIT / XA ROLLBACK), then start the stream.",
            ids.join(", ")
        )));
    }
    for d in datasets {
        let Some(t) = &d.object else {
            return Err(Error::config(format!(
                "{} is a query; sluice stream captures tables (--table, --tables, --schema).",
                d.name
            )));
        };
        if d.primary_key.is_empty() {
            return Err(Error::config(format!(
                "{t} has no primary key, so its updates and deletes cannot be keyed in change \
                 files. Add a primary key, or leave the table out of the stream."
            )));
        }
        check_columns(t, &d.columns)?;
        column_facts(conn, t, target).await?;
        if !lock_non_transactional
            && let Some(engine) = engine_without_transactions(conn, t, target).await?
        {
            return Err(Error::config(format!(
                "{t} is a {engine} table, an engine without transactions: the initial snapshot \
                 does not cover it (it is read as it is while writes go on, not at the \
                 snapshot's binary log position), so its snapshot and its changes would not \
                 meet exactly. Pass --lock-non-transactional (the export then holds it under a \
                 read lock from the snapshot's moment until the snapshot is written; writes to \
                 it wait meanwhile), convert it (ALTER TABLE … ENGINE=InnoDB), or leave it out \
                 of the stream."
            )));
        }
    }
    master_status(conn, server, target).await?;
    Ok(vars)
}

/// The engine of `t` when the server says it has no transactions.
async fn engine_without_transactions(
    conn: &mut Conn,
    t: &sluice_core::table::TableRef,
    target: &str,
) -> Result<Option<String>> {
    let row: Option<Row> = conn
        .exec_first(
            "SELECT t.ENGINE, e.TRANSACTIONS FROM information_schema.TABLES t \
             LEFT JOIN information_schema.ENGINES e ON e.ENGINE = t.ENGINE \
             WHERE t.TABLE_SCHEMA = ? AND t.TABLE_NAME = ?",
            (t.schema.clone(), t.name.clone()),
        )
        .await
        .map_err(|e| classify(e, Phase::Catalog, target))?;
    Ok(row
        .filter(|r| text(r, 1).eq_ignore_ascii_case("NO"))
        .map(|r| text(&r, 0)))
}

/// MariaDB: the GTID position at `file:offset` of this server's binary log
/// (`BINLOG_GTID_POS`), `None` where the server cannot say (no such file, or not an event
/// boundary).
pub async fn gtid_at(
    conn: &mut Conn,
    file: &str,
    offset: u64,
    target: &str,
) -> Result<Option<String>> {
    let v: Option<Option<String>> = conn
        .exec_first("SELECT BINLOG_GTID_POS(?, ?)", (file, offset))
        .await
        .map_err(|e| classify(e, Phase::Catalog, target))?;
    Ok(v.flatten())
}

/// MySQL: `server_uuid`, and `gtid_executed` where `gtid_mode` is ON.
pub async fn mysql_gtids(conn: &mut Conn, target: &str) -> Result<(String, Option<String>)> {
    let row: Option<(Option<String>, Option<String>, Option<String>)> = conn
        .query_first("SELECT @@GLOBAL.server_uuid, @@GLOBAL.gtid_mode, @@GLOBAL.gtid_executed")
        .await
        .map_err(|e| classify(e, Phase::Catalog, target))?;
    let (uuid, mode, executed) = row.unwrap_or_default();
    let on = mode.is_some_and(|m| m.eq_ignore_ascii_case("ON"));
    Ok((
        uuid.unwrap_or_default(),
        on.then(|| executed.unwrap_or_default().replace(['\n', ' '], "")),
    ))
}

/// The binary log files now: name and size.
pub async fn binary_logs(conn: &mut Conn, target: &str) -> Result<Vec<(String, u64)>> {
    let rows: Vec<Row> = conn
        .query("SHOW BINARY LOGS")
        .await
        .map_err(|e| classify(e, Phase::Catalog, target))?;
    Ok(rows.iter().map(|r| (text(r, 0), number(r, 1))).collect())
}

/// Bytes of binary log the server must keep for a stream at `at` (every file from its file
/// on), and bytes between `at` and the end of the log.
pub fn retained(files: &[(String, u64)], at: BinPos) -> (u64, u64) {
    let mut retained = 0;
    let mut lag = 0;
    for (name, size) in files {
        let Ok(p) = BinPos::of_file(name, 0) else {
            continue;
        };
        if p.seq > at.seq {
            retained += size;
            lag += size;
        } else if p.seq == at.seq {
            retained += size;
            lag += size.saturating_sub(at.offset);
        }
    }
    (retained, lag)
}

/// Log how long the server keeps its binary log: a stream stopped for longer loses its place.
pub fn log_retention(vars: &HashMap<String, String>, target: &str) {
    let secs = vars
        .get("binlog_expire_logs_seconds")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .or_else(|| {
            vars.get("expire_logs_days")
                .and_then(|s| s.parse::<f64>().ok())
                .filter(|d| *d > 0.0)
                .map(|d| (d * 86_400.0) as u64)
        });
    match secs {
        Some(s) => tracing::info!(
            "{target} purges binary log files after {:.1} h (binlog_expire_logs_seconds / \
             expire_logs_days): a stream stopped for longer loses its position",
            s as f64 / 3600.0
        ),
        None => tracing::info!(
            "{target} does not purge binary log files by age: a stopped stream's position stays \
             readable, and the files stay on disk until purged"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retained_counts_from_the_streams_file() {
        let files = vec![
            ("b.000001".to_string(), 100),
            ("b.000002".to_string(), 200),
            ("b.000003".to_string(), 50),
        ];
        let at = BinPos {
            epoch: 0,
            seq: 2,
            offset: 150,
        };
        assert_eq!(retained(&files, at), (250, 100));
    }
}
