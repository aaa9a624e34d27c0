//! XA transactions in the binary log: their changes land when they commit, never when they are
//! only prepared.
//!
//! MySQL and MariaDB write an XA transaction when it is *prepared*: a group of its table maps
//! and row events (MariaDB flags its GTID event `FL_PREPARED_XA`; MySQL writes `XA START`
//! first), then `XA END`, then an XA_PREPARE event. `XA COMMIT 'id'` or `XA ROLLBACK 'id'`
//! follows later, as a group of its own (`XA COMMIT … ONE PHASE` is logged as an ordinary
//! transaction). Written at the prepare, a transaction rolled back later would leave its rows
//! in the change files and on a replication target. So the stream keeps a prepared group's
//! events as they came, undecoded, and decodes them at its `XA COMMIT`, into that group (its
//! position, its time); a rollback drops them.
//!
//! Across a restart: every restart position after a prepared transaction whose end has not
//! come names it (its id and where its group starts, [`Pending`]); a stream opened there reads
//! from the oldest such group, takes those groups again and passes over every other event
//! until it reaches the position it was opened at ([`Xa::recovering`]).
//!
//! A transaction prepared before the stream began (before its initial snapshot) is in neither:
//! a consistent snapshot does not see it and its group is before the stream's start. The first
//! start refuses while one is pending (`XA RECOVER`, `server.rs`), and a commit of one the
//! stream never saw prepared stops it, naming it.

use super::binlog::BinPos;
use mysql_async::binlog::events::Event;
use sluice_core::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};

/// A prepared transaction's group kept for its commit, at most this many bytes: a larger one
/// stops the stream with the fix (its events are held in memory until the commit).
const MAX_PREPARED_BYTES: usize = 64 << 20;

/// A prepared transaction named in a restart position: where its group starts, and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The first event of its prepare group.
    pub at: BinPos,
    /// The id as the log writes it (`X'…',X'…',1`).
    pub id: String,
}

impl Pending {
    /// `POS:HEX` of the id's bytes (no separator of the position text can appear in it).
    pub fn text(&self) -> String {
        let hex: String = self.id.bytes().map(|b| format!("{b:02x}")).collect();
        format!("{}:{hex}", self.at.text())
    }

    /// [`Pending::text`] read back.
    pub fn parse(s: &str) -> Result<Pending> {
        let bad = || Error::internal(format!("{s:?} is not a pending XA transaction"));
        let (pos, hex) = s.rsplit_once(':').ok_or_else(bad)?;
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("x"), 16))
            .collect::<std::result::Result<Vec<u8>, _>>()
            .map_err(|_| bad())?;
        Ok(Pending {
            at: BinPos::parse(pos)?,
            id: String::from_utf8(bytes).map_err(|_| bad())?,
        })
    }
}

/// The id an XA statement names: its text after the keywords (`XA END X'61',X'',1`).
pub fn id_of(sql: &str) -> Option<(String, String)> {
    let words: Vec<&str> = sql.trim().splitn(3, char::is_whitespace).collect();
    if words.len() < 3 || !words[0].eq_ignore_ascii_case("XA") {
        return None;
    }
    let verb = words[1].to_ascii_uppercase();
    let id = words[2]
        .trim()
        .trim_end_matches(';')
        .trim_end_matches("ONE PHASE")
        .trim_end_matches("one phase")
        .trim()
        .to_string();
    Some((verb, id))
}

/// A prepare group being read.
struct Capture {
    at: BinPos,
    id: Option<String>,
    events: Vec<Event>,
    bytes: usize,
}

/// The stream's XA bookkeeping (see the module documentation).
#[derive(Default)]
pub struct Xa {
    capturing: Option<Capture>,
    prepared: BTreeMap<String, (BinPos, Vec<Event>)>,
    /// Restarting: events before this position are passed over, but the groups of the ids in
    /// `wanted` are taken again.
    recover_until: Option<BinPos>,
    wanted: BTreeSet<String>,
}

impl Xa {
    /// A stream opened at `from`, whose restart position names `pending`.
    pub fn resuming(from: BinPos, pending: &[Pending]) -> Xa {
        Xa {
            recover_until: (!pending.is_empty()).then_some(from),
            wanted: pending.iter().map(|p| p.id.clone()).collect(),
            ..Xa::default()
        }
    }

    /// True while events before the opening position are read again for prepared groups only.
    pub fn recovering(&mut self, at: BinPos) -> bool {
        match self.recover_until {
            Some(until) if at < until => true,
            Some(_) => {
                self.recover_until = None;
                if let Some(id) = self.wanted.iter().find(|w| !self.prepared.contains_key(*w)) {
                    tracing::warn!(
                        "the prepared XA transaction {id} named in the restart position was \
                         not found again before it"
                    );
                }
                false
            }
            None => false,
        }
    }

    /// A prepare group starts at `at` (MariaDB: a GTID event flagged `FL_PREPARED_XA`; MySQL:
    /// an `XA START` statement).
    pub fn start(&mut self, at: BinPos) {
        self.capturing = Some(Capture {
            at,
            id: None,
            events: Vec::new(),
            bytes: 0,
        });
    }

    /// True while a prepare group is being read: its events go to [`Xa::keep`], not to the
    /// change sink.
    pub fn capturing(&self) -> bool {
        self.capturing.is_some()
    }

    /// Keep an event of the prepare group being read.
    pub fn keep(&mut self, e: &Event, display: &str) -> Result<()> {
        if let Some(c) = self.capturing.as_mut() {
            c.bytes += e.data().len();
            if c.bytes > MAX_PREPARED_BYTES {
                return Err(Error::source_permanent(format!(
                    "a prepared XA transaction in the binary log of {display} at {} holds more \
                     than {} MB of row events, more than sluice keeps in memory until its XA \
                     COMMIT. Stream the tables again from a new snapshot after it is committed \
                     or rolled back.",
                    c.at.text(),
                    MAX_PREPARED_BYTES >> 20
                )));
            }
            c.events.push(e.clone());
        }
        Ok(())
    }

    /// `XA END 'id'`: the group being read is that transaction's.
    pub fn named(&mut self, id: &str) {
        if let Some(c) = self.capturing.as_mut() {
            c.id = Some(id.to_string());
        }
    }

    /// The XA_PREPARE event: the group is prepared; its events wait for the commit. While
    /// recovering, only the groups a restart position named are kept.
    pub fn prepared(&mut self) {
        if let Some(c) = self.capturing.take()
            && let Some(id) = c.id
            && (self.recover_until.is_none() || self.wanted.contains(&id))
        {
            self.prepared.insert(id, (c.at, c.events));
        }
    }

    /// `XA COMMIT 'id'`: the events to decode into the commit's group. An id never seen
    /// prepared fails, naming it.
    pub fn commit(&mut self, id: &str, at: BinPos, display: &str) -> Result<Vec<Event>> {
        self.wanted.remove(id);
        match self.prepared.remove(id) {
            Some((_, events)) => Ok(events),
            None => Err(Error::source_permanent(format!(
                "the binary log of {display} commits XA transaction {id} at {}, which was \
                 prepared before this stream began (before its initial snapshot, which does not \
                 see a prepared transaction): its changes are in neither the snapshot nor the \
                 change files. Stream the tables again from a new snapshot (sluice stream \
                 --drop, then a new output); commit or roll back prepared XA transactions \
                 before a stream starts (XA RECOVER lists them).",
                at.text()
            ))),
        }
    }

    /// `XA ROLLBACK 'id'`: its changes never happened.
    pub fn rollback(&mut self, id: &str) {
        self.wanted.remove(id);
        self.prepared.remove(id);
    }

    /// The prepared transactions a restart position must name.
    pub fn pending(&self) -> Vec<Pending> {
        self.prepared
            .iter()
            .map(|(id, (at, _))| Pending {
                at: *at,
                id: id.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_round_trips_through_a_restart_position() {
        let p = Pending {
            at: BinPos {
                epoch: 0,
                seq: 3,
                offset: 1234,
            },
            id: "X'61',X'',1".into(),
        };
        assert_eq!(Pending::parse(&p.text()).unwrap(), p);
        assert!(!p.text().contains(['~', '@', '!', ',']));
    }

    #[test]
    fn xa_statements_name_their_id() {
        assert_eq!(
            id_of("XA END X'61',X'',1"),
            Some(("END".into(), "X'61',X'',1".into()))
        );
        assert_eq!(
            id_of("XA COMMIT X'62',X'',1 ONE PHASE"),
            Some(("COMMIT".into(), "X'62',X'',1".into()))
        );
        assert_eq!(id_of("COMMIT"), None);
    }
}
