//! The replication stream's messages, parsed without copying.
//!
//! The CopyBoth stream carries `w` XLogData (a WAL range and one pgoutput message) and `k`
//! primary keepalives. pgoutput protocol version 1 sends only committed transactions, each as
//! Begin, its changes, Commit; a Relation message describes a table before its first change in
//! the session and again after its definition changed. Values in tuples are tagged: `n` NULL,
//! `u` an unchanged TOAST value that was not sent, `t` text, `b` binary (the type's send
//! format, with `binary 'true'`).

/// A parse failure: the stream is not what protocol version 1 sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

type PResult<T> = std::result::Result<T, Malformed>;

/// A cursor over a message.
#[derive(Debug, Clone, Copy)]
pub struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Read `b` from its start.
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b }
    }

    fn take(&mut self, n: usize) -> PResult<&'a [u8]> {
        if self.b.len() < n {
            return Err(Malformed(format!(
                "message truncated: {n} bytes wanted, {} left",
                self.b.len()
            )));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }

    fn u8(&mut self) -> PResult<u8> {
        Ok(self.take(1)?[0])
    }

    fn i16(&mut self) -> PResult<i16> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> PResult<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i32(&mut self) -> PResult<i32> {
        Ok(self.u32()? as i32)
    }

    fn u64(&mut self) -> PResult<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    fn i64(&mut self) -> PResult<i64> {
        Ok(self.u64()? as i64)
    }

    fn cstr(&mut self) -> PResult<&'a str> {
        let end = self
            .b
            .iter()
            .position(|&c| c == 0)
            .ok_or_else(|| Malformed("unterminated string".into()))?;
        let s = std::str::from_utf8(&self.b[..end])
            .map_err(|_| Malformed("a name is not UTF-8".into()))?;
        self.b = &self.b[end + 1..];
        Ok(s)
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.b
    }
}

/// One message of the CopyBoth stream.
#[derive(Debug)]
pub enum Copy<'a> {
    /// XLogData: WAL from `start`; the server has sent WAL up to `end`.
    XLogData {
        /// Start of the WAL this message covers.
        start: u64,
        /// The end of WAL on the server.
        end: u64,
        /// The pgoutput message.
        data: &'a [u8],
    },
    /// Primary keepalive: the server has sent everything up to `end`.
    Keepalive {
        /// The end of WAL sent.
        end: u64,
        /// The server wants a status update now.
        reply: bool,
    },
}

/// Parse a CopyData payload of the replication stream.
pub fn parse_copy(b: &[u8]) -> PResult<Copy<'_>> {
    let mut r = Reader::new(b);
    match r.u8()? {
        b'w' => {
            let start = r.u64()?;
            let end = r.u64()?;
            let _sent_at = r.i64()?;
            Ok(Copy::XLogData {
                start,
                end,
                data: r.rest(),
            })
        }
        b'k' => {
            let end = r.u64()?;
            let _sent_at = r.i64()?;
            let reply = r.u8()? != 0;
            Ok(Copy::Keepalive { end, reply })
        }
        other => Err(Malformed(format!(
            "unknown replication message {:?}",
            other as char
        ))),
    }
}

/// A standby status update (`r`): written, flushed and applied up to `lsn`.
pub fn status_update(lsn: u64, now_micros_since_2000: i64, reply: bool) -> Vec<u8> {
    let mut v = Vec::with_capacity(34);
    v.push(b'r');
    for _ in 0..3 {
        v.extend_from_slice(&lsn.to_be_bytes());
    }
    v.extend_from_slice(&now_micros_since_2000.to_be_bytes());
    v.push(u8::from(reply));
    v
}

/// One column of a Relation message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelColumn {
    /// Part of the replica identity (under REPLICA IDENTITY FULL: every column).
    pub key: bool,
    /// Name.
    pub name: String,
    /// Type OID.
    pub type_oid: u32,
    /// Type modifier.
    pub typmod: i32,
}

/// A value of a tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// NULL.
    Null,
    /// An unchanged TOAST value the server did not send.
    Unchanged,
    /// The value in text form.
    Text(&'a [u8]),
    /// The value in the type's binary send format.
    Binary(&'a [u8]),
}

/// A tuple: its values, read one by one.
#[derive(Debug, Clone, Copy)]
pub struct Tuple<'a> {
    /// Number of values.
    pub len: usize,
    r: Reader<'a>,
}

impl<'a> Tuple<'a> {
    fn read(r: &mut Reader<'a>) -> PResult<Tuple<'a>> {
        let len = r.i16()?.max(0) as usize;
        let start = *r;
        // Walk past the values so the caller's reader continues after the tuple.
        for _ in 0..len {
            match r.u8()? {
                b'n' | b'u' => {}
                b't' | b'b' => {
                    let n = r.i32()?.max(0) as usize;
                    r.take(n)?;
                }
                k => {
                    return Err(Malformed(format!(
                        "unknown tuple value kind {:?}",
                        k as char
                    )));
                }
            }
        }
        Ok(Tuple { len, r: start })
    }

    /// The values in column order.
    pub fn values(&self) -> impl Iterator<Item = PResult<Value<'a>>> {
        let mut r = self.r;
        (0..self.len).map(move |_| {
            Ok(match r.u8()? {
                b'n' => Value::Null,
                b'u' => Value::Unchanged,
                k => {
                    let n = r.i32()?.max(0) as usize;
                    let v = r.take(n)?;
                    if k == b't' {
                        Value::Text(v)
                    } else {
                        Value::Binary(v)
                    }
                }
            })
        })
    }
}

/// Which old row an update or delete carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Old {
    /// The replica identity's columns only (the others are NULL and not sent).
    Key,
    /// The whole old row (REPLICA IDENTITY FULL).
    Full,
}

/// A pgoutput message (protocol version 1).
#[derive(Debug)]
pub enum Message<'a> {
    /// A transaction starts.
    Begin {
        /// LSN of the commit record.
        final_lsn: u64,
        /// Commit time, µs since 2000-01-01.
        commit_ts: i64,
        /// Transaction id.
        xid: u32,
    },
    /// The transaction committed.
    Commit {
        /// LSN of the commit record.
        commit_lsn: u64,
        /// End of the commit record: where a restarted stream resumes after it.
        end_lsn: u64,
    },
    /// A table's definition.
    Relation {
        /// `pg_class.oid`.
        oid: u32,
        /// Schema.
        schema: &'a str,
        /// Name.
        name: &'a str,
        /// `relreplident`: d default, n nothing, f full, i index.
        identity: u8,
        /// Columns.
        columns: Vec<RelColumn>,
    },
    /// A row inserted.
    Insert {
        /// Table.
        oid: u32,
        /// The new row.
        new: Tuple<'a>,
    },
    /// A row updated.
    Update {
        /// Table.
        oid: u32,
        /// The old row or key, when sent (key changed, or REPLICA IDENTITY FULL).
        old: Option<(Old, Tuple<'a>)>,
        /// The new row.
        new: Tuple<'a>,
    },
    /// A row deleted.
    Delete {
        /// Table.
        oid: u32,
        /// The old key or row.
        old: (Old, Tuple<'a>),
    },
    /// Tables truncated.
    Truncate {
        /// The tables.
        oids: Vec<u32>,
    },
    /// Anything else (origin, type, logical message): nothing to write.
    Other,
}

fn old_kind(k: u8) -> PResult<Old> {
    match k {
        b'K' => Ok(Old::Key),
        b'O' => Ok(Old::Full),
        k => Err(Malformed(format!("unknown old-tuple kind {:?}", k as char))),
    }
}

/// Parse one pgoutput message.
pub fn parse_message(b: &[u8]) -> PResult<Message<'_>> {
    let mut r = Reader::new(b);
    Ok(match r.u8()? {
        b'B' => Message::Begin {
            final_lsn: r.u64()?,
            commit_ts: r.i64()?,
            xid: r.u32()?,
        },
        b'C' => {
            let _flags = r.u8()?;
            Message::Commit {
                commit_lsn: r.u64()?,
                end_lsn: r.u64()?,
            }
        }
        b'R' => {
            let oid = r.u32()?;
            let schema = r.cstr()?;
            let name = r.cstr()?;
            let identity = r.u8()?;
            let n = r.i16()?.max(0) as usize;
            let mut columns = Vec::with_capacity(n);
            for _ in 0..n {
                let flags = r.u8()?;
                columns.push(RelColumn {
                    key: flags & 1 != 0,
                    name: r.cstr()?.to_string(),
                    type_oid: r.u32()?,
                    typmod: r.i32()?,
                });
            }
            Message::Relation {
                oid,
                schema,
                name,
                identity,
                columns,
            }
        }
        b'I' => {
            let oid = r.u32()?;
            let _n = r.u8()?;
            Message::Insert {
                oid,
                new: Tuple::read(&mut r)?,
            }
        }
        b'U' => {
            let oid = r.u32()?;
            let mut kind = r.u8()?;
            let mut old = None;
            if kind == b'K' || kind == b'O' {
                old = Some((old_kind(kind)?, Tuple::read(&mut r)?));
                kind = r.u8()?;
            }
            if kind != b'N' {
                return Err(Malformed("update without a new tuple".into()));
            }
            Message::Update {
                oid,
                old,
                new: Tuple::read(&mut r)?,
            }
        }
        b'D' => {
            let oid = r.u32()?;
            let kind = old_kind(r.u8()?)?;
            Message::Delete {
                oid,
                old: (kind, Tuple::read(&mut r)?),
            }
        }
        b'T' => {
            let n = r.u32()? as usize;
            let _options = r.u8()?;
            let mut oids = Vec::with_capacity(n);
            for _ in 0..n {
                oids.push(r.u32()?);
            }
            Message::Truncate { oids }
        }
        _ => Message::Other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(values: &[Option<&[u8]>]) -> Vec<u8> {
        let mut v = (values.len() as i16).to_be_bytes().to_vec();
        for x in values {
            match x {
                None => v.push(b'n'),
                Some(b"~") => v.push(b'u'),
                Some(x) => {
                    v.push(b'b');
                    v.extend_from_slice(&(x.len() as i32).to_be_bytes());
                    v.extend_from_slice(x);
                }
            }
        }
        v
    }

    #[test]
    fn update_with_old_key_and_toast() {
        let mut m = vec![b'U'];
        m.extend_from_slice(&16384u32.to_be_bytes());
        m.push(b'K');
        m.extend(tuple(&[Some(&1i32.to_be_bytes()), None]));
        m.push(b'N');
        m.extend(tuple(&[Some(&2i32.to_be_bytes()), Some(b"~")]));
        let Message::Update { oid, old, new } = parse_message(&m).unwrap() else {
            panic!("not an update");
        };
        assert_eq!(oid, 16384);
        let (kind, old) = old.unwrap();
        assert_eq!(kind, Old::Key);
        let old: Vec<_> = old.values().map(Result::unwrap).collect();
        assert_eq!(old[1], Value::Null);
        let new: Vec<_> = new.values().map(Result::unwrap).collect();
        assert_eq!(new[0], Value::Binary(&2i32.to_be_bytes()));
        assert_eq!(new[1], Value::Unchanged);
    }

    #[test]
    fn truncated_messages_are_errors() {
        assert!(parse_message(b"B\0\0").is_err());
        assert!(parse_copy(b"x").is_err());
        let s = status_update(0x10, 5, true);
        assert_eq!(s.len(), 34);
        assert_eq!(s[33], 1);
    }
}
