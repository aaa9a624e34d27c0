//! Connecting: URL parsing, credentials from the environment, session settings.
//!
//! Every session sluice opens runs the same output-affecting settings (UTC time zone, utf8mb4,
//! generous network write timeouts so a slow writer never makes the server drop a streaming
//! session), so values and key bounds read in one session mean the same in every other.
//! MySQL has no `application_name`; sessions are recognised by their connection ids, which the
//! [`Sessions`] registry shared by the coordinator, the readers and the harm probe keeps.

use crate::error::{Phase, classify};
use mysql_async::{Conn, OptsBuilder};
use sluice_core::redact::{redact_url, scrub};
use sluice_core::{Error, Result};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Settings every session runs right after connecting.
const SESSION_INIT: &[&str] = &["SET time_zone = '+00:00', NAMES utf8mb4, \
     SESSION net_write_timeout = 3600, SESSION net_read_timeout = 3600"];

/// What to do with zero and partial-zero dates (`0000-00-00`, `2024-00-15`), which no date type
/// outside MySQL can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZeroDates {
    /// Export as NULL and count them in the report (default).
    #[default]
    Null,
    /// Fail the export naming the column (`?zero_dates=error`, strict mode).
    Error,
}

/// Which client/server protocol reads rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// Prepared statements: numbers and dates arrive binary, floats exact (default; faster).
    #[default]
    Binary,
    /// Plain queries: every value arrives as text (`?protocol=text`, for comparison).
    Text,
}

/// A parsed MySQL/MariaDB connection target.
#[derive(Clone)]
pub struct MyTarget {
    host: String,
    port: u16,
    user: String,
    password: Option<String>,
    database: String,
    socket: Option<String>,
    display: String,
    /// Zero-date policy (`?zero_dates=null|error`).
    pub zero_dates: ZeroDates,
    /// Row protocol (`?protocol=binary|text`).
    pub protocol: Protocol,
}

impl std::fmt::Debug for MyTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password.
        f.debug_struct("MyTarget")
            .field("url", &self.display)
            .finish()
    }
}

fn bad_url(display: &str, why: &str) -> Error {
    Error::config(format!(
        "source URL {display} {why}. Use mysql://user[:password]@host[:port]/database (or \
         mariadb://…), percent-encoding special characters in the password; options: \
         ?zero_dates=null|error, ?protocol=binary|text, ?socket=/path/to/mysqld.sock."
    ))
}

impl MyTarget {
    /// Parse `mysql://user[:password]@host[:port]/database[?options]` (or `mariadb://`).
    ///
    /// A password missing from the URL is taken from `MYSQL_PWD`; a missing user from `USER`.
    /// A missing port means 3306. Options: `zero_dates=null|error` (strict mode fails on zero
    /// dates), `protocol=binary|text`, `socket=PATH` (connect through a Unix socket).
    pub fn parse(url: &str) -> Result<Self> {
        let display = redact_url(url);
        if !(url.starts_with("mysql://") || url.starts_with("mariadb://")) {
            return Err(bad_url(&display, "is not a MySQL/MariaDB URL"));
        }
        let parsed = url::Url::parse(url).map_err(|e| {
            let pw = url::Url::parse(url)
                .ok()
                .and_then(|u| u.password().map(str::to_string));
            bad_url(
                &display,
                &format!(
                    "cannot be parsed ({})",
                    scrub(&e.to_string(), pw.as_deref())
                ),
            )
        })?;
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let host = match parsed.host_str() {
            Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']').to_string(),
            _ => return Err(bad_url(&display, "names no host")),
        };
        let database = decode(parsed.path().trim_start_matches('/'));
        if database.is_empty() || database.contains('/') {
            return Err(bad_url(
                &display,
                "names no database (add it after the host, e.g. mysql://user@host:3306/DATABASE)",
            ));
        }
        let user = if parsed.username().is_empty() {
            std::env::var("USER")
                .map_err(|_| bad_url(&display, "names no user and USER is not set"))?
        } else {
            decode(parsed.username())
        };
        let password = parsed
            .password()
            .map(decode)
            .or_else(|| std::env::var("MYSQL_PWD").ok());
        let mut t = MyTarget {
            host,
            port: parsed.port().unwrap_or(3306),
            user,
            password,
            database,
            socket: None,
            display: display.clone(),
            zero_dates: ZeroDates::Null,
            protocol: Protocol::Binary,
        };
        for (k, v) in parsed.query_pairs() {
            match (k.as_ref(), v.as_ref()) {
                ("zero_dates", "null") => t.zero_dates = ZeroDates::Null,
                ("zero_dates", "error") => t.zero_dates = ZeroDates::Error,
                ("protocol", "binary") => t.protocol = Protocol::Binary,
                ("protocol", "text") => t.protocol = Protocol::Text,
                ("socket", path) if !path.is_empty() => t.socket = Some(path.to_string()),
                (k, v) => {
                    return Err(bad_url(&display, &format!("has an unknown option {k}={v}")));
                }
            }
        }
        Ok(t)
    }

    /// The URL with the password redacted.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// The database named in the URL: where unqualified table names are looked up.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// Open a session with sluice's settings and register it in `sessions`.
    pub async fn connect(&self, sessions: &Sessions) -> Result<Conn> {
        let opts = OptsBuilder::default()
            .ip_or_hostname(self.host.clone())
            .tcp_port(self.port)
            .user(Some(self.user.clone()))
            .pass(self.password.clone())
            .db_name(Some(self.database.clone()))
            .prefer_socket(false)
            .socket(self.socket.clone())
            .tcp_nodelay(true)
            .stmt_cache_size(16)
            .init(SESSION_INIT.to_vec());
        let conn = tokio::time::timeout(Duration::from_secs(10), Conn::new(opts))
            .await
            .map_err(|_| {
                Error::source_transient(format!(
                    "could not connect to MySQL/MariaDB at {} within 10 s. Check that the server \
                     is running and that host and port in the URL are right.",
                    self.display
                ))
            })?
            .map_err(|e| classify(e, Phase::Connect, &self.display))
            .map_err(|e| {
                // Driver messages never hold the password, but be certain.
                let msg = scrub(e.message(), self.password.as_deref());
                Error::new(e.kind(), e.retry(), msg)
            })?;
        sessions.add(conn.id());
        Ok(conn)
    }
}

/// The connection ids of one run's sessions, and when its shared snapshot began; shared by the
/// coordinator, its readers and the harm probe (MySQL has no session tag to search for).
#[derive(Debug, Default)]
pub struct SessionState {
    /// Connection ids opened by the run (closed ones are simply no longer found).
    pub ids: BTreeSet<u32>,
    /// When the shared snapshot's transactions started, while they are open.
    pub snapshot_since: Option<Instant>,
    /// Tables whose metadata locks the run's sessions hold, and sessions seen waiting on them.
    pub locks: crate::harm::LockBook,
}

/// Shared handle on [`SessionState`].
#[derive(Debug, Clone, Default)]
pub struct Sessions(Arc<Mutex<SessionState>>);

impl Sessions {
    /// Record a new session.
    pub fn add(&self, id: u32) {
        if let Ok(mut s) = self.0.lock() {
            s.ids.insert(id);
        }
    }

    /// The ids recorded so far.
    pub fn ids(&self) -> Vec<u32> {
        self.0
            .lock()
            .map(|s| s.ids.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Mark the shared snapshot as started now (`Some`) or ended (`None`).
    pub fn set_snapshot(&self, since: Option<Instant>) {
        if let Ok(mut s) = self.0.lock() {
            s.snapshot_since = since;
        }
    }

    /// Read or update the lock book (see [`crate::harm::LockBook`]).
    pub fn locks<R>(&self, f: impl FnOnce(&mut crate::harm::LockBook) -> R) -> Option<R> {
        self.0.lock().ok().map(|mut s| f(&mut s.locks))
    }

    /// How long the shared snapshot has been open, if it is.
    pub fn snapshot_age(&self) -> Option<Duration> {
        self.0
            .lock()
            .ok()
            .and_then(|s| s.snapshot_since.map(|t| t.elapsed()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_hides_the_password() {
        let t =
            MyTarget::parse("mysql://app:s%40cret@db.example:3307/shop?zero_dates=error").unwrap();
        assert_eq!(t.port, 3307);
        assert_eq!(t.password.as_deref(), Some("s@cret"));
        assert_eq!(t.database(), "shop");
        assert_eq!(t.zero_dates, ZeroDates::Error);
        assert!(!format!("{t:?}").contains("cret"));
        assert!(!t.display().contains("cret"));
        let m = MyTarget::parse("mariadb://app@localhost/shop").unwrap();
        assert_eq!(m.port, 3306);
    }

    #[test]
    fn rejects_bad_urls_without_leaking() {
        for bad in [
            "postgres://u:topsecret@h/db",
            "mysql://u:topsecret@h:3306",
            "mysql://u:topsecret@h/db?nope=1",
            "mysql://u:topsecret@h:notaport/db",
        ] {
            let e = MyTarget::parse(bad).unwrap_err();
            assert_eq!(e.kind(), sluice_core::ErrorKind::Config, "{bad}");
            assert!(!e.to_string().contains("topsecret"), "{e}");
        }
    }
}
