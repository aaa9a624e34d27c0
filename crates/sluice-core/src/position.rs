//! Where in the source's history a snapshot sits.
//!
//! A position is what lets change data capture start exactly where a snapshot ends, and what a
//! manifest records so a reader knows "as of when" the data is.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A point in a source's change history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "engine", rename_all = "snake_case")]
pub enum Position {
    /// The engine gave no position (e.g. chunk consistency, or no privilege to read it).
    Unknown,
    /// A PostgreSQL WAL location.
    Postgres {
        /// The LSN as PostgreSQL prints it (`0/16B3748`).
        lsn: String,
        /// True when the LSN is exactly the snapshot's (taken from a replication slot); false
        /// when it is the WAL insert position read next to the snapshot, which may be slightly
        /// later than the snapshot point.
        exact: bool,
    },
    /// A MySQL/MariaDB binary log position.
    Mysql {
        /// Binary log file name.
        file: String,
        /// Offset within the file.
        pos: u64,
        /// GTID set (MySQL) or GTID position (MariaDB), if GTIDs are on.
        gtid: Option<String>,
    },
    /// A Firebird snapshot number.
    Firebird {
        /// `RDB$GET_CONTEXT('SYSTEM', 'SNAPSHOT_NUMBER')` of the shared snapshot.
        snapshot_number: u64,
    },
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Unknown => f.write_str("unknown"),
            Position::Postgres { lsn, exact: true } => write!(f, "LSN {lsn}"),
            Position::Postgres { lsn, exact: false } => write!(f, "LSN {lsn} (insert position)"),
            Position::Mysql {
                file,
                pos,
                gtid: Some(g),
            } => write!(f, "{file}:{pos} gtid {g}"),
            Position::Mysql {
                file,
                pos,
                gtid: None,
            } => write!(f, "{file}:{pos}"),
            Position::Firebird { snapshot_number } => write!(f, "snapshot #{snapshot_number}"),
        }
    }
}

/// The shared snapshot a run reads under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// Engine-specific snapshot identifier (PostgreSQL `pg_export_snapshot()` name), if any.
    pub id: Option<String>,
    /// The source position the snapshot corresponds to.
    pub position: Position,
    /// When the snapshot was taken (RFC 3339, UTC).
    pub taken_at: String,
}
