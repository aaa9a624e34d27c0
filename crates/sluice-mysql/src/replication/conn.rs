//! The replica session: a connection registered as a replica and turned into a binary log
//! dump from a file and offset.
//!
//! - The session is an ordinary sluice session (URL, TLS, credentials) that then registers with
//!   `--server-id` and asks for the binary log (`COM_BINLOG_DUMP`); `mysql_async` asks for event
//!   checksums, so the server's CRC32 is verified.
//! - MariaDB: `@mariadb_slave_capability=4` makes the server send its own events (GTID, GTID
//!   list, annotate) instead of rewriting them as MySQL 5.1 ones, so each transaction's GTID is
//!   known.
//! - `@master_heartbeat_period`: with nothing to send for that long the server sends a
//!   heartbeat, which keeps an idle session alive through firewalls and idle timeouts. Its
//!   position is not used: the stream knows it has read everything (`--until-current` on an idle
//!   server) from the end of the last event it handled, which reaches the server's end of log.
//!
//! - Positioning: by file and offset (`COM_BINLOG_DUMP`), or by GTID state where the saved file
//!   cannot be used (MariaDB `@slave_connect_state` with an empty file name; MySQL
//!   `COM_BINLOG_DUMP_GTID` with the set): the server then starts after the last transaction the
//!   state holds, in whichever of its files that is.
//!
//! Errors of the dump are the server's replica errors: a purged file (1236) says the saved
//! position is gone and how to start over; a missing privilege (1227) names it.

use super::binlog::{BinPos, file_name};
use super::gtid::GtidState;
use crate::connect::{MyTarget, Sessions};
use crate::error::{Phase, classify, server_code};
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest};
use sluice_core::{Error, ErrorKind, Result, Retry};
use std::time::Duration;

/// How often an idle server sends a heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// Turn an error of the replica session into one that says what to do.
pub fn dump_error(e: mysql_async::Error, server_id: u32, from: &str, target: &str) -> Error {
    let text = e.to_string();
    match server_code(&e) {
        Some(1236)
            if text.contains("purged")
                || text.contains("find first log file")
                || text.contains("not find") =>
        {
            Error::new(
                ErrorKind::Source,
                Retry::Permanent,
                format!(
                    "the binary log at the stream's saved position ({from}) is no longer on \
                     {target}: it was purged (binlog_expire_logs_seconds / expire_logs_days, or \
                     PURGE BINARY LOGS), so the changes since then are lost ({text}). Start over: \
                     sluice stream --drop with the same arguments, then stream into a new output \
                     (with --initial snapshot); keep the binary log longer than a stream may be \
                     stopped."
                ),
            )
        }
        Some(1236) => Error::new(
            ErrorKind::Source,
            Retry::Permanent,
            format!("{target} refused to send its binary log from {from}: {text}"),
        ),
        Some(1227) | Some(1045) | Some(1044) => Error::source_permanent(format!(
            "the account in the URL may not read the binary log of {target} ({text}). Grant it: \
             GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO … (MariaDB 10.5 and later: \
             REPLICATION SLAVE, BINLOG MONITOR)."
        )),
        Some(1593) => Error::config(format!(
            "{target} refused replica server id {server_id} ({text}): pass another --server-id \
             (it must differ from the server's own and from every replica's)."
        )),
        _ => classify(e, Phase::Read, target),
    }
}

/// Where a dump starts.
#[derive(Debug, Clone)]
pub enum Start {
    /// At `base.<seq>` and the offset.
    File {
        /// The binary log's base file name.
        base: String,
        /// The coordinate.
        at: BinPos,
    },
    /// After the last transaction of a GTID state.
    Gtid(GtidState),
}

/// Open a binary log dump at `start`.
pub async fn open_dump(
    target: &MyTarget,
    sessions: &Sessions,
    mariadb: bool,
    server_id: u32,
    start: &Start,
    non_blocking: bool,
) -> Result<BinlogStream> {
    let display = target.display().to_string();
    let mut conn = target.connect(sessions).await?;
    let mut setup = vec![format!(
        "SET @master_heartbeat_period = {}",
        HEARTBEAT.as_nanos()
    )];
    if mariadb {
        setup.push("SET @mariadb_slave_capability = 4".into());
        setup.push("SET @slave_gtid_strict_mode = 0".into());
    }
    for sql in setup {
        conn.query_drop(sql)
            .await
            .map_err(|e| classify(e, Phase::Connect, &display))?;
    }
    let (file, at, sids) = match start {
        Start::File { base, at } => (file_name(base, at.seq), at.offset, Vec::new()),
        Start::Gtid(state) => {
            if mariadb {
                conn.exec_drop("SET @slave_connect_state = ?", (state.text(),))
                    .await
                    .map_err(|e| classify(e, Phase::Connect, &display))?;
                (String::new(), 4, Vec::new())
            } else {
                (String::new(), 4, state.mysql_sids()?)
            }
        }
    };
    let from = match start {
        Start::File { .. } => format!("{file}:{at}"),
        Start::Gtid(state) => format!("GTID {}", state.text()),
    };
    let mut req = BinlogStreamRequest::new(server_id)
        .with_filename(file.as_bytes())
        .with_pos(at);
    if !mariadb && matches!(start, Start::Gtid(_)) {
        req = req.with_gtid().with_gtid_set(sids);
    }
    if non_blocking {
        req = req.with_non_blocking();
    }
    conn.get_binlog_stream(req)
        .await
        .map_err(|e| dump_error(e, server_id, &from, &display))
}
