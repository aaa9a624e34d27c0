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

/// A point in a source's change stream, as its adapter encodes it: the restart position a
/// stream resumes from, the commit position a change carries (`_pos`), the end of log
/// `--until-current` waits for.
///
/// The text has an *order part* and an optional *detail*: everything before the first `~` or
/// `!` orders positions of one stream byte by byte in log order (PostgreSQL: the LSN as 16 hex
/// digits; MySQL/MariaDB: the binary log file's sequence number and offset, zero-padded, after
/// an epoch prefix once a stream resumed by GTID on another log); what follows is the adapter's
/// detail for resuming (the GTID state, pending XA transactions) and does not order. Only an
/// adapter builds one from its engine's value ([`StreamPos::from_adapter`]); the runner
/// compares, saves and hands positions back without reading them. Saved as its text, so the
/// state files of earlier releases read back unchanged.
///
/// Ordering compares the order part, then the whole text (so `Ord` agrees with `Eq`); two
/// positions of different streams (different sources) do not compare meaningfully.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StreamPos(String);

impl StreamPos {
    /// A position in the adapter's encoding (see the type's documentation). For adapters, and
    /// for positions read back from a saved state.
    pub fn from_adapter(text: impl Into<String>) -> Self {
        StreamPos(text.into())
    }

    /// The whole text, detail included: what the adapter reads back.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part that orders positions (before the first `~` or `!`).
    pub fn order(&self) -> &str {
        self.0.split(['~', '!']).next().unwrap_or_default()
    }

    /// True for the empty position (none yet).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Ord for StreamPos {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.order()
            .cmp(other.order())
            .then_with(|| self.0.cmp(&other.0))
    }
}

impl PartialOrd for StreamPos {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for StreamPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod stream_pos_tests {
    use super::StreamPos;

    #[test]
    fn order_ignores_the_detail_and_agrees_with_equality() {
        let p = |s: &str| StreamPos::from_adapter(s);
        assert!(p("0000000001_00000000000100~0-1-5") < p("0000000001_00000000000200"));
        assert!(p("0000000002_00000000000001") > p("0000000001_99999999999999!x"));
        // GTID-epoch positions sort after every plain one.
        assert!(p("g000001_0000000001_00000000000001") > p("0000000009_00000000000001"));
        let (a, b) = (p("00000000016B3748~a"), p("00000000016B3748~b"));
        assert_ne!(a, b);
        assert_ne!(a.cmp(&b), std::cmp::Ordering::Equal);
        assert_eq!(a.order(), b.order());
        assert_eq!(p("00000000016B3748").order(), "00000000016B3748");
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"00000000016B3748~a\"");
    }
}
