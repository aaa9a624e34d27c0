//! GTID state: which transactions a stream position has passed, in the server's own terms, so
//! that a stream can resume where its saved binary log file is gone or means something else
//! (the file was purged; a replica was promoted, whose files have other names and offsets).
//!
//! - MariaDB: a GTID position, the last `domain-server-sequence` of each replication domain
//!   (`0-1-100,1-2-7`, the form of `gtid_slave_pos` and `@slave_connect_state`).
//! - MySQL: a GTID set, the intervals of each source uuid (`3e11fa47-…:1-5:7,…`, the form of
//!   `gtid_executed`; `COM_BINLOG_DUMP_GTID` takes it).
//!
//! The state is kept as detail of a restart position (`binlog.rs`), after the order part that
//! the runner compares, and is updated at every committed transaction whose GTID event the
//! stream read.

use sluice_core::{Error, Result};
use std::collections::BTreeMap;

/// The GTID state at a position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GtidState {
    /// MariaDB: domain → (server id, sequence number) of its last transaction.
    Mariadb(BTreeMap<u32, (u32, u64)>),
    /// MySQL: source uuid (lower-case, hyphenated) → inclusive intervals, sorted, disjoint.
    Mysql(BTreeMap<String, Vec<(u64, u64)>>),
}

/// One transaction's GTID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gtid {
    /// MariaDB `domain-server-sequence`.
    Mariadb {
        /// Replication domain.
        domain: u32,
        /// Originating server.
        server: u32,
        /// Sequence number.
        seq: u64,
    },
    /// MySQL `uuid:number`.
    Mysql {
        /// Source uuid (lower-case, hyphenated).
        uuid: String,
        /// Transaction number.
        gno: u64,
    },
}

fn bad(s: &str, what: &str) -> Error {
    Error::config(format!(
        "{s:?} is not a {what} (the stream state was edited or comes from another version); \
         move the state away to start over"
    ))
}

impl GtidState {
    /// Parse a MariaDB GTID position (`0-1-100,1-2-7`; empty: no transaction yet).
    pub fn parse_mariadb(s: &str) -> Result<GtidState> {
        let mut m = BTreeMap::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut it = part.split('-');
            let (Some(d), Some(sv), Some(q), None) = (it.next(), it.next(), it.next(), it.next())
            else {
                return Err(bad(s, "MariaDB GTID position"));
            };
            let num = |x: &str| {
                x.parse::<u64>()
                    .map_err(|_| bad(s, "MariaDB GTID position"))
            };
            let (d, sv, q) = (num(d)?, num(sv)?, num(q)?);
            m.insert(d as u32, (sv as u32, q));
        }
        Ok(GtidState::Mariadb(m))
    }

    /// Parse a MySQL GTID set (`uuid:1-5:7,uuid2:1-3`; empty: no transaction yet).
    pub fn parse_mysql(s: &str) -> Result<GtidState> {
        let mut m: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut it = part.split(':');
            let uuid = it
                .next()
                .filter(|u| u.len() == 36)
                .ok_or_else(|| bad(s, "MySQL GTID set"))?
                .to_ascii_lowercase();
            let list = m.entry(uuid).or_default();
            for iv in it {
                let (a, b) = iv.split_once('-').unwrap_or((iv, iv));
                let a = a.parse::<u64>().map_err(|_| bad(s, "MySQL GTID set"))?;
                let b = b.parse::<u64>().map_err(|_| bad(s, "MySQL GTID set"))?;
                if a == 0 || b < a {
                    return Err(bad(s, "MySQL GTID set"));
                }
                add_interval(list, a, b);
            }
        }
        Ok(GtidState::Mysql(m))
    }

    /// Record a committed transaction.
    pub fn add(&mut self, g: &Gtid) {
        match (self, g) {
            (
                GtidState::Mariadb(m),
                Gtid::Mariadb {
                    domain,
                    server,
                    seq,
                },
            ) => {
                m.insert(*domain, (*server, *seq));
            }
            (GtidState::Mysql(m), Gtid::Mysql { uuid, gno }) => {
                add_interval(m.entry(uuid.clone()).or_default(), *gno, *gno);
            }
            _ => {}
        }
    }

    /// The state's text (the server's own notation).
    pub fn text(&self) -> String {
        match self {
            GtidState::Mariadb(m) => m
                .iter()
                .map(|(d, (s, q))| format!("{d}-{s}-{q}"))
                .collect::<Vec<_>>()
                .join(","),
            GtidState::Mysql(m) => m
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(u, v)| {
                    let ivs: Vec<String> = v
                        .iter()
                        .map(|(a, b)| match a == b {
                            true => a.to_string(),
                            false => format!("{a}-{b}"),
                        })
                        .collect();
                    format!("{u}:{}", ivs.join(":"))
                })
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// MySQL: the set as `COM_BINLOG_DUMP_GTID` blocks (intervals end-exclusive there).
    pub fn mysql_sids(&self) -> Result<Vec<mysql_async::Sid<'static>>> {
        let GtidState::Mysql(m) = self else {
            return Err(Error::internal(
                "a MariaDB GTID position is not a MySQL set",
            ));
        };
        let mut out = Vec::new();
        for (uuid, v) in m {
            let text = format!("{uuid}:1");
            let sid: mysql_async::Sid<'static> =
                text.parse().map_err(|_| bad(uuid, "MySQL server uuid"))?;
            let ivs = v
                .iter()
                .map(|(a, b)| mysql_async::GnoInterval::new(*a, b + 1))
                .collect();
            out.push(sid.with_intervals(ivs));
        }
        Ok(out)
    }
}

/// Add `[a, b]` to sorted disjoint inclusive intervals, merging neighbours.
fn add_interval(list: &mut Vec<(u64, u64)>, a: u64, b: u64) {
    list.push((a, b));
    list.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(list.len());
    for (x, y) in list.drain(..) {
        match out.last_mut() {
            Some(last) if x <= last.1.saturating_add(1) => last.1 = last.1.max(y),
            _ => out.push((x, y)),
        }
    }
    *list = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mariadb_positions_keep_the_last_gtid_of_each_domain() {
        let mut s = GtidState::parse_mariadb("0-1-100, 2-5-7").unwrap();
        s.add(&Gtid::Mariadb {
            domain: 0,
            server: 3,
            seq: 101,
        });
        s.add(&Gtid::Mariadb {
            domain: 1,
            server: 1,
            seq: 1,
        });
        assert_eq!(s.text(), "0-3-101,1-1-1,2-5-7");
        assert_eq!(GtidState::parse_mariadb(&s.text()).unwrap(), s);
        assert_eq!(GtidState::parse_mariadb("").unwrap().text(), "");
        assert!(GtidState::parse_mariadb("0-1").is_err());
    }

    #[test]
    fn mysql_sets_merge_intervals() {
        let u = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let mut s = GtidState::parse_mysql(&format!("{}:1-3:7", u.to_uppercase())).unwrap();
        for gno in [4, 6, 9] {
            s.add(&Gtid::Mysql {
                uuid: u.into(),
                gno,
            });
        }
        assert_eq!(s.text(), format!("{u}:1-4:6-7:9"));
        s.add(&Gtid::Mysql {
            uuid: u.into(),
            gno: 5,
        });
        assert_eq!(s.text(), format!("{u}:1-7:9"));
        let sids = s.mysql_sids().unwrap();
        assert_eq!(sids[0].intervals()[0].end(), 8, "end-exclusive on the wire");
        assert!(GtidState::parse_mysql("nope:1").is_err());
    }
}
