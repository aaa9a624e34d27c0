//! The stream state in Redis
//! (`--state redis://[user:password@]host:port[/db][?key=NAME][&claim_ttl=SECONDS]`), for
//! deployments that keep state apart from data.
//!
//! A small RESP client over one TCP connection (reconnected when it breaks): the state is one
//! string key (default `sluice:stream:<output>`), written with `SET`, and a second key
//! `<key>:lock` holds the running stream's identity with a TTL (`claim_ttl`, 60 s by default)
//! refreshed while it runs (`claim.rs`), so a second streamer on the same state is refused, and
//! a stream that died frees the state once the TTL has passed. The state is as durable as the server's
//! persistence: run Redis with `appendonly yes` (and `appendfsync always` for the same crash
//! guarantee as a file). `rediss://` (TLS) is not supported.

use crate::state::{StateStore, StreamState, parse};
use percent_encoding::percent_decode_str;
use sluice_core::redact::redact_url;
use sluice_core::{Error, Result, Retry};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::Duration;

/// How long a stream's lock lives without a refresh, unless the URL says (`claim_ttl`).
const LOCK_TTL_MS: u64 = 60_000;
/// The shortest `claim_ttl`: refreshes must be able to keep up.
const MIN_TTL_MS: u64 = 3_000;

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Ok(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

/// The state in a Redis server.
pub struct RedisState {
    host: String,
    port: u16,
    user: Option<String>,
    password: Option<String>,
    db: u32,
    key: String,
    display: String,
    ttl_ms: u64,
    conn: Mutex<Option<BufReader<TcpStream>>>,
    holder: Mutex<Option<String>>,
}

fn err(display: &str, what: impl std::fmt::Display) -> Error {
    Error::destination(
        Retry::Transient,
        format!("the stream state in {display} (Redis): {what}"),
    )
}

impl RedisState {
    /// Parse `url`; `default_key` names the state when the URL has no `?key=`.
    pub fn new(url: &str, default_key: &str) -> Result<Self> {
        let display = redact_url(url);
        let bad = |why: &str| {
            Error::config(format!(
                "--state {display}: {why}. Use redis://[user:password@]host:port[/db][?key=NAME]."
            ))
        };
        let u = url::Url::parse(url).map_err(|_| bad("not a URL"))?;
        if u.scheme() != "redis" {
            return Err(bad("only redis:// is supported (no TLS)"));
        }
        let host = u.host_str().ok_or_else(|| bad("no host"))?.to_string();
        let port = u.port().unwrap_or(6379);
        let db = match u.path().trim_start_matches('/') {
            "" => 0,
            d => d
                .parse()
                .map_err(|_| bad("the path must be a database number"))?,
        };
        let dec = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
        let user = (!u.username().is_empty()).then(|| dec(u.username()));
        let password = u.password().map(dec);
        let key = u
            .query_pairs()
            .find(|(k, _)| k == "key")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_else(|| default_key.to_string());
        let ttl_ms = match u.query_pairs().find(|(k, _)| k == "claim_ttl") {
            None => LOCK_TTL_MS,
            Some((_, v)) => v
                .parse::<f64>()
                .ok()
                .map(|s| (s * 1000.0) as u64)
                .filter(|ms| *ms >= MIN_TTL_MS)
                .ok_or_else(|| bad("claim_ttl must be a number of seconds, at least 3"))?,
        };
        Ok(RedisState {
            host,
            port,
            user,
            password,
            db,
            display: format!("{display} key {key}"),
            key,
            ttl_ms,
            conn: Mutex::new(None),
            holder: Mutex::new(None),
        })
    }

    fn connect(&self) -> Result<BufReader<TcpStream>> {
        let s = TcpStream::connect((self.host.as_str(), self.port))
            .map_err(|e| err(&self.display, format!("cannot connect: {e}")))?;
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(30)));
        let mut c = BufReader::new(s);
        if let Some(pw) = &self.password {
            let mut args = vec!["AUTH".as_bytes()];
            if let Some(u) = &self.user {
                args.push(u.as_bytes());
            }
            args.push(pw.as_bytes());
            self.call_on(&mut c, &args)?;
        }
        if self.db != 0 {
            self.call_on(&mut c, &[b"SELECT", self.db.to_string().as_bytes()])?;
        }
        Ok(c)
    }

    fn call_on(&self, c: &mut BufReader<TcpStream>, args: &[&[u8]]) -> Result<Reply> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        c.get_mut()
            .write_all(&out)
            .map_err(|e| err(&self.display, e))?;
        read_reply(c).map_err(|e| match e {
            ReadError::Server(m) => Error::destination(
                Retry::Permanent,
                format!("the stream state in {}: Redis answered {m}", self.display),
            ),
            ReadError::Io(m) => err(&self.display, m),
        })
    }

    /// One command, reconnecting once if the connection broke.
    fn call(&self, args: &[&[u8]]) -> Result<Reply> {
        let mut g = self
            .conn
            .lock()
            .map_err(|_| Error::internal("the Redis connection lock is poisoned"))?;
        for attempt in 0..2 {
            if g.is_none() {
                *g = Some(self.connect()?);
            }
            let Some(c) = g.as_mut() else { continue };
            match self.call_on(c, args) {
                Err(e) if e.is_transient() && attempt == 0 => *g = None,
                r => return r,
            }
        }
        Err(err(&self.display, "no connection"))
    }

    fn lock_key(&self) -> String {
        format!("{}:lock", self.key)
    }
}

impl StateStore for RedisState {
    fn describe(&self) -> String {
        self.display.clone()
    }

    fn load(&self) -> Result<Option<StreamState>> {
        match self.call(&[b"GET", self.key.as_bytes()])? {
            Reply::Bulk(Some(b)) => parse(&b, &self.display).map(Some),
            _ => Ok(None),
        }
    }

    fn save(&self, state: &StreamState) -> Result<()> {
        let bytes = serde_json::to_vec(state)
            .map_err(|e| Error::internal(format!("cannot encode the stream state: {e}")))?;
        let Some(holder) = self.holder.lock().ok().and_then(|h| h.clone()) else {
            self.call(&[b"SET", self.key.as_bytes(), &bytes])?;
            return Ok(());
        };
        // Fenced: written only while the lock still names this run, in one step on the
        // server, so a run that was paused past its claim's life (and replaced by a standby)
        // cannot overwrite the new holder's state when it wakes.
        let script = b"if redis.call('get', KEYS[1]) == ARGV[1] then \
            redis.call('set', KEYS[2], ARGV[2]) return 1 else return 0 end";
        let lock = self.lock_key();
        match self.call(&[
            b"EVAL",
            script,
            b"2",
            lock.as_bytes(),
            self.key.as_bytes(),
            holder.as_bytes(),
            &bytes,
        ])? {
            Reply::Int(1) => Ok(()),
            _ => Err(Error::config(format!(
                "the stream's claim on {} was lost (another stream holds it now, or it \
                 expired while this one was paused): stopping without writing its state",
                self.display
            ))),
        }
    }

    fn fenced(&self) -> bool {
        true
    }

    fn try_acquire(&self, holder: &str) -> Result<Option<String>> {
        let ttl = self.ttl_ms.to_string();
        let lock = self.lock_key();
        let r = self.call(&[
            b"SET",
            lock.as_bytes(),
            holder.as_bytes(),
            b"NX",
            b"PX",
            ttl.as_bytes(),
        ])?;
        if r == Reply::Bulk(None) {
            return Ok(Some(match self.call(&[b"GET", lock.as_bytes()])? {
                Reply::Bulk(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
                _ => "another stream".into(),
            }));
        }
        if let Ok(mut h) = self.holder.lock() {
            *h = Some(holder.to_string());
        }
        Ok(None)
    }

    fn clear(&self) -> Result<()> {
        self.call(&[b"DEL", self.key.as_bytes()])?;
        Ok(())
    }

    fn claim_ttl(&self) -> Option<Duration> {
        Some(Duration::from_millis(self.ttl_ms))
    }

    fn acquire(&self, holder: &str) -> Result<()> {
        match self.try_acquire(holder)? {
            None => Ok(()),
            Some(by) => Err(Error::config(format!(
                "the stream state {} is held by {by}: another stream is running on it. Stop it \
                 first (its lock expires {} s after it stops refreshing it), or run this one \
                 with --standby to take over when it ends.",
                self.display,
                self.ttl_ms / 1000
            ))),
        }
    }

    fn refresh(&self) -> Result<()> {
        let Some(holder) = self.holder.lock().ok().and_then(|h| h.clone()) else {
            return Ok(());
        };
        let script = b"if redis.call('get', KEYS[1]) == ARGV[1] then \
            return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
        let lock = self.lock_key();
        let ttl = self.ttl_ms.to_string();
        match self.call(&[
            b"EVAL",
            script,
            b"1",
            lock.as_bytes(),
            holder.as_bytes(),
            ttl.as_bytes(),
        ])? {
            Reply::Int(1) => Ok(()),
            _ => Err(Error::config(format!(
                "the stream's lock on {} expired and may be held by another stream: stopping",
                self.display
            ))),
        }
    }

    fn release(&self) {
        let Some(holder) = self.holder.lock().ok().and_then(|mut h| h.take()) else {
            return;
        };
        let script = b"if redis.call('get', KEYS[1]) == ARGV[1] then \
            return redis.call('del', KEYS[1]) else return 0 end";
        let lock = self.lock_key();
        let _ = self.call(&[b"EVAL", script, b"1", lock.as_bytes(), holder.as_bytes()]);
    }
}

enum ReadError {
    Server(String),
    Io(String),
}

fn read_reply(c: &mut impl BufRead) -> std::result::Result<Reply, ReadError> {
    let mut line = String::new();
    c.read_line(&mut line)
        .map_err(|e| ReadError::Io(e.to_string()))?;
    if line.is_empty() {
        return Err(ReadError::Io("the server closed the connection".into()));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(1);
    let num = || {
        rest.parse::<i64>()
            .map_err(|_| ReadError::Io(format!("unreadable reply {line:?}")))
    };
    Ok(match kind {
        "+" => Reply::Ok(rest.to_string()),
        "-" => return Err(ReadError::Server(rest.to_string())),
        ":" => Reply::Int(num()?),
        "$" => {
            let n = num()?;
            if n < 0 {
                Reply::Bulk(None)
            } else {
                let mut buf = vec![0u8; n as usize + 2];
                c.read_exact(&mut buf)
                    .map_err(|e| ReadError::Io(e.to_string()))?;
                buf.truncate(n as usize);
                Reply::Bulk(Some(buf))
            }
        }
        "*" => {
            let n = num()?;
            let mut v = Vec::new();
            for _ in 0..n.max(0) {
                v.push(read_reply(c)?);
            }
            Reply::Array(v)
        }
        _ => return Err(ReadError::Io(format!("unreadable reply {line:?}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_and_urls() {
        let mut r = std::io::Cursor::new(b"$3\r\nabc\r\n:5\r\n$-1\r\n*2\r\n+OK\r\n:1\r\n".to_vec());
        assert_eq!(
            read_reply(&mut r).ok(),
            Some(Reply::Bulk(Some(b"abc".to_vec())))
        );
        assert_eq!(read_reply(&mut r).ok(), Some(Reply::Int(5)));
        assert_eq!(read_reply(&mut r).ok(), Some(Reply::Bulk(None)));
        assert_eq!(
            read_reply(&mut r).ok(),
            Some(Reply::Array(vec![Reply::Ok("OK".into()), Reply::Int(1)]))
        );
        let s = RedisState::new("redis://u:p%40ss@127.0.0.1:7000/2?key=k1", "d").unwrap();
        assert_eq!((s.port, s.db, s.key.as_str()), (7000, 2, "k1"));
        assert_eq!(s.password.as_deref(), Some("p@ss"));
        assert!(!s.describe().contains("p@ss"));
        assert!(RedisState::new("rediss://h/0", "d").is_err());
        assert!(RedisState::new("redis://h/x", "d").is_err());
    }
}
