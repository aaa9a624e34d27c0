//! Binary log positions and the events `mysql_common` does not parse (MariaDB's).
//!
//! **Positions.** A stream position is a binary log coordinate: the file's sequence number
//! (the `000042` of `mariadb-bin.000042`) and the byte offset in it, written
//! `SSSSSSSSSS_OOOOOOOOOOOOOO` (10 and 14 zero-padded decimal digits), so that text order is
//! log order within one server's binary log. In change files `_pos` is the offset of the
//! transaction's first event (its GTID event, or `BEGIN` without GTIDs); a transaction's events
//! are written to the binary log together at commit, so the order of first events is commit
//! order, and the snapshot's position (the end of the last transaction it sees) separates the
//! transactions it holds (`_pos` below it) from the ones it does not (at or above it). The
//! restart position saved in the state is the offset just after a transaction's last event.
//! The file name is the server's binary log base name plus the sequence number (at least six
//! digits), read from the server when the stream opens.
//!
//! **Epochs.** A stream that had to resume by GTID (its saved file was purged, or the server
//! is another one, such as a promoted replica whose files have other names and offsets) reads
//! positions of a different log from then on. They are written `gEEEEEE_SSSSSSSSSS_OOOOOOOOOOOOOO`
//! with the resume count `E` (6 digits): `g` sorts after every digit, so positions keep
//! increasing in text order across the switch. Epoch 0 has no prefix (the form above).
//!
//! **Restart positions** (the state's, never `_pos`) may carry the GTID state there as detail
//! after `~` (`gtid.rs`): `…_OOOOOOOOOOOOOO~0-1-100,1-2-7` (MariaDB) or `…~<gtid set>@<server
//! uuid>` (MySQL; the uuid tells whether the server is still the one the offsets belong to).
//! The detail only follows an order part that is the same for the same point in the log, so
//! text comparisons of positions are decided by the order part.
//!
//! **GTIDs** go into `_xid`: MariaDB `domain-server-sequence` (event 162, parsed here: it is not
//! in `mysql_common`), MySQL `uuid:number`.

use super::xa::Pending;
use sluice_core::{Error, Result};

/// MariaDB `ANNOTATE_ROWS_EVENT`.
pub const MARIADB_ANNOTATE_ROWS: u8 = 160;
/// MariaDB `GTID_EVENT`.
pub const MARIADB_GTID: u8 = 162;
/// First and last of MariaDB's compressed event types (`log_bin_compress=ON`).
pub const MARIADB_COMPRESSED: std::ops::RangeInclusive<u8> = 166..=171;

/// A binary log coordinate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct BinPos {
    /// How many times the stream resumed by GTID on a log whose offsets are not comparable.
    pub epoch: u32,
    /// The file's sequence number.
    pub seq: u64,
    /// Byte offset in the file.
    pub offset: u64,
}

impl BinPos {
    /// The position's text (see the module documentation).
    pub fn text(self) -> String {
        match self.epoch {
            0 => format!("{:010}_{:014}", self.seq, self.offset),
            e => format!("g{e:06}_{:010}_{:014}", self.seq, self.offset),
        }
    }

    /// Parse a position's text (a restart position's detail is ignored: [`Restart::parse`]).
    pub fn parse(s: &str) -> Result<BinPos> {
        let bad = || Error::internal(format!("{s:?} is not a binary log stream position"));
        let order = s.split_once('~').map_or(s, |(o, _)| o);
        let (epoch, rest) = match order.strip_prefix('g') {
            Some(r) => {
                let (e, rest) = r.split_once('_').ok_or_else(bad)?;
                (e.parse().map_err(|_| bad())?, rest)
            }
            None => (0, order),
        };
        let (a, b) = rest.split_once('_').ok_or_else(bad)?;
        Ok(BinPos {
            epoch,
            seq: a.parse().map_err(|_| bad())?,
            offset: b.parse().map_err(|_| bad())?,
        })
    }

    /// The position of `file:offset` (`mariadb-bin.000042`, 1234), epoch 0.
    pub fn of_file(file: &str, offset: u64) -> Result<BinPos> {
        let (_, seq) = split_file(file)?;
        Ok(BinPos {
            epoch: 0,
            seq,
            offset,
        })
    }
}

/// A restart position: the coordinate and, where GTIDs are on, the GTID state there; and the
/// XA transactions prepared before it whose end has not come (`xa.rs`), after `!`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    /// The coordinate.
    pub pos: BinPos,
    /// The GTID state's text (MariaDB position or MySQL set).
    pub gtid: Option<String>,
    /// MySQL: the `server_uuid` of the server whose log the coordinate is in.
    pub server: Option<String>,
    /// Prepared XA transactions whose groups a restart reads again.
    pub xa: Vec<Pending>,
}

impl Restart {
    /// Parse a restart position's text.
    pub fn parse(s: &str) -> Result<Restart> {
        let (s, xa) = match s.split_once('!') {
            None => (s, Vec::new()),
            Some((main, list)) => (
                main,
                list.split(',')
                    .filter(|p| !p.is_empty())
                    .map(Pending::parse)
                    .collect::<Result<Vec<_>>>()?,
            ),
        };
        let pos = BinPos::parse(s)?;
        let (gtid, server) = match s.split_once('~') {
            None => (None, None),
            Some((_, d)) => match d.rsplit_once('@') {
                Some((g, u)) => (Some(g.to_string()), Some(u.to_string())),
                None => (Some(d.to_string()), None),
            },
        };
        Ok(Restart {
            pos,
            gtid,
            server,
            xa,
        })
    }

    /// The text (see the module documentation).
    pub fn text(&self) -> String {
        let mut t = self.pos.text();
        if let Some(g) = &self.gtid {
            t.push('~');
            t.push_str(g);
            if let Some(u) = &self.server {
                t.push('@');
                t.push_str(u);
            }
        }
        if !self.xa.is_empty() {
            t.push('!');
            let list: Vec<String> = self.xa.iter().map(Pending::text).collect();
            t.push_str(&list.join(","));
        }
        t
    }
}

/// Split `base.000042` into its base name and sequence number.
pub fn split_file(file: &str) -> Result<(&str, u64)> {
    let (base, seq) = file.rsplit_once('.').ok_or_else(|| {
        Error::internal(format!(
            "binary log file name {file:?} has no .NNNNNN sequence number"
        ))
    })?;
    let n = seq.parse::<u64>().map_err(|_| {
        Error::internal(format!(
            "binary log file name {file:?} has no .NNNNNN sequence number"
        ))
    })?;
    Ok((base, n))
}

/// The file name of sequence number `seq` under base name `base` (`base.000042`).
pub fn file_name(base: &str, seq: u64) -> String {
    format!("{base}.{seq:06}")
}

/// A MariaDB GTID event's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MariaGtid {
    /// Sequence number.
    pub seq_no: u64,
    /// Replication domain.
    pub domain: u32,
    /// Flags (`FL_STANDALONE` = 1: the group is one statement without COMMIT/XID).
    pub flags: u8,
}

impl MariaGtid {
    /// Parse the event body: `seq_no u64 LE, domain_id u32 LE, flags u8, …`.
    pub fn parse(data: &[u8]) -> Result<MariaGtid> {
        if data.len() < 13 {
            return Err(Error::source_permanent(format!(
                "a MariaDB GTID event of {} bytes is too short to read",
                data.len()
            )));
        }
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&data[0..8]);
        let mut dom = [0u8; 4];
        dom.copy_from_slice(&data[8..12]);
        Ok(MariaGtid {
            seq_no: u64::from_le_bytes(seq),
            domain: u32::from_le_bytes(dom),
            flags: data[12],
        })
    }

    /// True when the group has no COMMIT/XID (a DDL statement, or a non-transactional one).
    pub fn standalone(&self) -> bool {
        self.flags & 1 != 0
    }

    /// True when the group is an XA transaction being prepared (`FL_PREPARED_XA`).
    pub fn prepared_xa(&self) -> bool {
        self.flags & 0x40 != 0
    }

    /// `domain-server-sequence`.
    pub fn text(&self, server_id: u32) -> String {
        format!("{}-{}-{}", self.domain, server_id, self.seq_no)
    }
}

/// A MySQL GTID `uuid:number` from a GTID event's source id and number.
pub fn mysql_gtid(sid: [u8; 16], gno: u64) -> String {
    let h: String = sid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}:{gno}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// What a QUERY event's statement is, for the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Statement {
    /// `BEGIN` (a transaction without a GTID event, or MySQL's after its GTID event).
    Begin,
    /// `COMMIT` (a non-transactional engine's group end).
    Commit,
    /// `ROLLBACK` (a group with non-transactional changes that was rolled back).
    Rollback,
    /// Data changed by a statement (statement-based logging).
    Dml,
    /// `TRUNCATE`.
    Truncate,
    /// An XA statement (`XA START`, `XA END`, `XA COMMIT`, `XA ROLLBACK`; see `xa.rs`).
    Xa,
    /// Anything else: DDL, `SAVEPOINT`, grants.
    Other,
}

/// Classify a statement by its first keyword (comments skipped).
pub fn classify(sql: &str) -> Statement {
    match crate::sql::first_keyword(sql).as_str() {
        "BEGIN" => Statement::Begin,
        "COMMIT" => Statement::Commit,
        "ROLLBACK" => Statement::Rollback,
        "INSERT" | "UPDATE" | "DELETE" | "REPLACE" | "LOAD" => Statement::Dml,
        "TRUNCATE" => Statement::Truncate,
        "XA" => Statement::Xa,
        _ => Statement::Other,
    }
}

/// The partition or tablespace maintenance of an `ALTER TABLE` that moves rows with no row
/// events in the binary log (`TRUNCATE`, `DROP`, `EXCHANGE`, `IMPORT` of a partition, `IMPORT
/// TABLESPACE`), as the statement names it; `None` for every other statement.
pub(crate) fn unlogged_rows(sql: &str) -> Option<String> {
    if crate::sql::first_keyword(sql) != "ALTER" {
        return None;
    }
    let words: Vec<String> = sql
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_uppercase)
        .collect();
    words.windows(2).find_map(|w| {
        let verb = matches!(w[0].as_str(), "TRUNCATE" | "DROP" | "EXCHANGE" | "IMPORT");
        let what = matches!(w[1].as_str(), "PARTITION" | "TABLESPACE");
        (verb && what && !(w[0] == "DROP" && w[1] == "TABLESPACE"))
            .then(|| format!("{} {}", w[0], w[1]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_sort_as_text_in_log_order() {
        let a = BinPos::of_file("mariadb-bin.000009", 123_456).unwrap();
        let b = BinPos::of_file("mariadb-bin.000010", 4).unwrap();
        let c = BinPos::of_file("mariadb-bin.1000000", 4).unwrap();
        assert!(a.text() < b.text() && b.text() < c.text());
        assert_eq!(BinPos::parse(&a.text()).unwrap(), a);
        assert!(
            !a.text().contains(['-', '.']),
            "file names split on - and ."
        );
        assert_eq!(file_name("mariadb-bin", 10), "mariadb-bin.000010");
        assert_eq!(file_name("b", 1_000_000), "b.1000000");
        let d = BinPos {
            epoch: 1,
            seq: 3,
            offset: 4,
        };
        assert!(
            c.text() < d.text(),
            "a resumed epoch sorts after the ones before"
        );
        assert_eq!(BinPos::parse(&d.text()).unwrap(), d);
        assert!(!d.text().contains(['-', '.']));
    }

    #[test]
    fn restart_positions_carry_gtid_detail_that_order_ignores() {
        let p = BinPos::of_file("mariadb-bin.000009", 1234).unwrap();
        let r = Restart {
            pos: p,
            gtid: Some("0-1-100,1-2-7".into()),
            server: None,
            xa: Vec::new(),
        };
        assert_eq!(Restart::parse(&r.text()).unwrap(), r);
        assert_eq!(BinPos::parse(&r.text()).unwrap(), p);
        assert!(r.text() > p.text() && r.text() < BinPos { offset: 1235, ..p }.text());
        let m = Restart {
            pos: p,
            gtid: Some("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5".into()),
            server: Some("4e11fa47-71ca-11e1-9e33-c80aa9429562".into()),
            xa: vec![Pending {
                at: BinPos { offset: 900, ..p },
                id: "X'61',X'',1".into(),
            }],
        };
        assert_eq!(Restart::parse(&m.text()).unwrap(), m);
        assert!(m.text() > p.text() && m.text() < BinPos { offset: 1235, ..p }.text());
        let plain = Restart::parse(&p.text()).unwrap();
        assert_eq!((plain.gtid, plain.server), (None, None));
    }

    #[test]
    fn mariadb_gtid_events() {
        let mut d = 7u64.to_le_bytes().to_vec();
        d.extend(2u32.to_le_bytes());
        d.push(1);
        let g = MariaGtid::parse(&d).unwrap();
        assert_eq!(g.text(5), "2-5-7");
        assert!(g.standalone());
        assert!(MariaGtid::parse(&d[..5]).is_err());
    }

    #[test]
    fn statements() {
        assert_eq!(classify("BEGIN"), Statement::Begin);
        assert_eq!(classify("/* x */ commit"), Statement::Commit);
        assert_eq!(classify("insert into t values (1)"), Statement::Dml);
        assert_eq!(classify("TRUNCATE TABLE t"), Statement::Truncate);
        assert_eq!(classify("ALTER TABLE t ADD c int"), Statement::Other);
        assert_eq!(
            unlogged_rows("alter table t truncate partition p0, p1").as_deref(),
            Some("TRUNCATE PARTITION")
        );
        assert_eq!(
            unlogged_rows("ALTER TABLE t EXCHANGE PARTITION p0 WITH TABLE u").as_deref(),
            Some("EXCHANGE PARTITION")
        );
        assert_eq!(
            unlogged_rows("ALTER TABLE t ADD PARTITION (PARTITION p9 VALUES LESS THAN (9))"),
            None
        );
        assert_eq!(unlogged_rows("ALTER TABLE t REMOVE PARTITIONING"), None);
        assert_eq!(
            mysql_gtid([0x3e; 16], 5),
            "3e3e3e3e-3e3e-3e3e-3e3e-3e3e3e3e3e3e:5"
        );
    }
}
