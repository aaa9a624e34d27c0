//! A replication-protocol session: what tokio-postgres cannot open.
//!
//! tokio-postgres 0.7 has no CopyBoth, so the walsender session is spoken here, on
//! postgres-protocol's message encoders and SCRAM: a startup packet with
//! `replication=database`, authentication (trust, cleartext, MD5, SCRAM-SHA-256), the simple
//! query protocol for replication commands (`CREATE_REPLICATION_SLOT`, `IDENTIFY_SYSTEM`), and
//! `START_REPLICATION`'s CopyBoth stream (`w` XLogData and `k` keepalives in, `r` standby status
//! updates out).
//!
//! It connects with the same parameters as every other session of the target ([`PgTarget`]:
//! host list, `.pgpass`, `sslmode` and its libpq fallbacks, the one rustls configuration), so a
//! URL that exports also streams, and `channel_binding` is honoured as libpq does: over TLS,
//! SCRAM-SHA-256-PLUS binds the session to the server's certificate (`tls-server-end-point`),
//! and with `require` any authentication without that binding is refused before a password is
//! sent. Limit: GSSAPI/SSPI authentication is refused.
//!
//! About 600 lines: connecting (TLS negotiation, authentication with channel binding) and the
//! two protocols spoken on the session belong together, and split they would share private
//! state.

use crate::connect::{HostSpec, PgHost, PgTarget, SslMode, server_end_point};
use bytes::{Buf, BytesMut};
use futures_util::FutureExt;
use postgres_protocol::authentication::sasl::{self, ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend;
use sluice_core::{Error, ErrorKind, Result, Retry};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_postgres::config::ChannelBinding as BindingMode;

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// An error the server sent (`ErrorResponse`), with its SQLSTATE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    /// SQLSTATE.
    pub code: String,
    /// The primary message.
    pub message: String,
    /// The detail line, if any.
    pub detail: Option<String>,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (SQLSTATE {})", self.message, self.code)?;
        if let Some(d) = &self.detail {
            write!(f, " {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ServerError {}

/// A replication session.
pub struct ReplConn {
    io: Box<dyn Stream>,
    inbuf: BytesMut,
    out: BytesMut,
    display: String,
    pid: i32,
    /// Set once the CopyBoth stream is open: reads are then coalesced (see [`COALESCE_BELOW`]).
    streaming: bool,
    /// Bytes the last read returned.
    last_read: usize,
}

/// A read of the stream that took fewer bytes than this (with what was already there when it
/// returned) makes the next one wait [`COALESCE_WAIT`] first. A client faster than the
/// walsender otherwise reads each few messages the moment they land: one wake-up, one `recv`
/// and one window update each time, which cost the client more CPU (kernel time) than decoding
/// the changes. Waiting a millisecond lets a read take tens of kilobytes. The socket's buffer
/// holds more than a millisecond of a fast walsender, and a read that returns this much or
/// more never waits, so the server is not held back; a change becomes visible at most that
/// millisecond later.
const COALESCE_BELOW: usize = 16 * 1024;
/// How long a small read makes the next one wait.
const COALESCE_WAIT: Duration = Duration::from_millis(1);

/// A failure on the session: the server's error, or a broken connection.
#[derive(Debug)]
pub enum ConnError {
    /// The server answered with an error.
    Server(ServerError),
    /// The connection failed or broke.
    Io(String),
    /// The client refused to go on (an authentication the settings forbid): retrying cannot
    /// help.
    Refused(String),
}

impl ConnError {
    /// As a sluice error, for operations without an error of their own to say.
    pub fn into_error(self, what: &str, display: &str) -> Error {
        match self {
            ConnError::Server(e) => {
                Error::source_permanent(format!("{what} on {display} failed: {e}")).with_cause(e)
            }
            ConnError::Io(e) => Error::source_transient(format!(
                "the replication connection to {display} was lost during {what}: {e}"
            )),
            ConnError::Refused(e) => Error::source_permanent(format!("{what} on {display}: {e}")),
        }
    }
}

type CResult<T> = std::result::Result<T, ConnError>;

fn io_err(e: std::io::Error) -> ConnError {
    ConnError::Io(e.to_string())
}

impl ReplConn {
    /// Open a replication session (`replication=database`) to the first host of `target` that
    /// accepts one.
    pub async fn connect(target: &PgTarget) -> Result<ReplConn> {
        let mut failures = Vec::new();
        for host in &target.params().hosts {
            match Self::connect_host(target, host).await {
                Ok(c) => return Ok(c),
                Err(e) => failures.push((host.host_str(), e)),
            }
        }
        let display = target.display();
        let single = failures.len() == 1;
        let mut retry = Retry::Permanent;
        let mut parts = Vec::new();
        for (host, e) in failures {
            match e {
                ConnError::Server(s) => {
                    let advice = match s.code.as_str() {
                        "28000" | "28P01" => {
                            " The user needs the REPLICATION attribute (ALTER ROLE … \
                             REPLICATION) and a pg_hba.conf line that allows replication \
                             connections to this database from this host, with a password in \
                             the URL, PGPASSWORD or ~/.pgpass."
                        }
                        "53300" => {
                            " The server has no free walsender: raise max_wal_senders or stop \
                             an unused replication client."
                        }
                        _ => "",
                    };
                    parts.push(format!("{host}: {s}.{advice}"));
                }
                ConnError::Io(s) => {
                    retry = Retry::Transient;
                    parts.push(format!("{host}: {s}"));
                }
                ConnError::Refused(s) => parts.push(format!("{host}: {s}")),
            }
        }
        Err(Error::new(
            ErrorKind::Source,
            retry,
            format!(
                "could not open a replication connection to {display}{} {}",
                if single { ":" } else { " (every host failed):" },
                parts.join(" | ")
            ),
        ))
    }

    async fn connect_host(target: &PgTarget, host: &HostSpec) -> CResult<ReplConn> {
        let params = target.params();
        let timeout = params.connect_timeout.unwrap_or(Duration::from_secs(3600));
        let tcp = matches!(host.host, PgHost::Tcp(_));
        let want_tls = tcp && !matches!(params.sslmode, SslMode::Disable | SslMode::Allow);
        let attempt = |tls: bool| async move {
            tokio::time::timeout(timeout, Self::open(target, host, tls))
                .await
                .map_err(|_| {
                    ConnError::Io(format!(
                        "no answer within {} s (connect_timeout)",
                        timeout.as_secs()
                    ))
                })?
        };
        match attempt(want_tls).await {
            // libpq's prefer: a failed TLS session is retried without TLS.
            Err(ConnError::Io(_)) if want_tls && params.sslmode == SslMode::Prefer => {
                attempt(false).await
            }
            other => other,
        }
    }

    async fn open(target: &PgTarget, host: &HostSpec, tls: bool) -> CResult<ReplConn> {
        let params = target.params();
        // The server certificate's hash, when TLS is up (SCRAM channel binding).
        let mut binding = None;
        let mut io: Box<dyn Stream> = match &host.host {
            PgHost::Tcp(name) => {
                let addr = match host.hostaddr {
                    Some(a) => a.to_string(),
                    None => name.clone(),
                };
                let s = tokio::net::TcpStream::connect((addr.as_str(), host.port))
                    .await
                    .map_err(io_err)?;
                let _ = s.set_nodelay(true);
                if tls {
                    let (io, b) = Self::start_tls(target, s, name, params.sslmode).await?;
                    binding = b;
                    io
                } else {
                    Box::new(s)
                }
            }
            PgHost::Unix(dir) => {
                let path = dir.join(format!(".s.PGSQL.{}", host.port));
                Box::new(
                    tokio::net::UnixStream::connect(&path)
                        .await
                        .map_err(io_err)?,
                )
            }
        };
        let mut out = BytesMut::new();
        let mut startup = vec![
            ("user", params.user.as_str()),
            ("database", params.dbname.as_str()),
            ("application_name", params.application_name.as_str()),
            ("replication", "database"),
        ];
        if let Some(o) = &params.options {
            startup.push(("options", o.as_str()));
        }
        frontend::startup_message(startup.iter().copied(), &mut out).map_err(io_err)?;
        io.write_all(&out).await.map_err(io_err)?;
        let mut conn = ReplConn {
            io,
            inbuf: BytesMut::with_capacity(64 * 1024),
            out: BytesMut::new(),
            display: target.display().to_string(),
            pid: 0,
            streaming: false,
            last_read: 0,
        };
        conn.authenticate(target, host, binding).await?;
        conn.query(super::TIMEOUTS_OFF).await?;
        Ok(conn)
    }

    async fn start_tls(
        target: &PgTarget,
        mut s: tokio::net::TcpStream,
        name: &str,
        mode: SslMode,
    ) -> CResult<(Box<dyn Stream>, Option<Vec<u8>>)> {
        if !target.params().direct_tls {
            let mut b = BytesMut::new();
            frontend::ssl_request(&mut b);
            s.write_all(&b).await.map_err(io_err)?;
            let mut answer = [0u8; 1];
            s.read_exact(&mut answer).await.map_err(io_err)?;
            if answer[0] != b'S' {
                if mode == SslMode::Prefer {
                    return Ok((Box::new(s), None));
                }
                return Err(ConnError::Io(format!(
                    "the server does not accept TLS connections, but sslmode={} requires TLS",
                    mode.as_str()
                )));
            }
        }
        let server = rustls::pki_types::ServerName::try_from(name.to_string())
            .map_err(|_| ConnError::Io(format!("{name:?} is not a host name TLS can verify")))?;
        let tls = tokio_rustls::TlsConnector::from(target.tls().client_config())
            .connect(server, s)
            .await
            .map_err(|e| ConnError::Io(format!("TLS handshake failed: {e}")))?;
        let binding = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|certs| certs.first())
            .and_then(|cert| server_end_point(cert.as_ref()));
        Ok((Box::new(tls), binding))
    }

    /// Authenticate as `channel_binding` allows: `binding` is the TLS session's
    /// `tls-server-end-point` hash (none without TLS, or for a certificate signed with an
    /// algorithm that has no single hash).
    async fn authenticate(
        &mut self,
        target: &PgTarget,
        host: &HostSpec,
        binding: Option<Vec<u8>>,
    ) -> CResult<()> {
        let mode = target.params().channel_binding();
        let binding = binding.filter(|_| mode != BindingMode::Disable);
        // With `require`, every way in but SCRAM-SHA-256-PLUS is refused (libpq's rule).
        let unbound = |how: &str| {
            if mode == BindingMode::Require {
                Err(ConnError::Refused(format!(
                    "channel_binding=require, but the server {how}, which does not bind the TLS \
                     session{}. Use sslmode=require or stronger and scram-sha-256 for this user \
                     in pg_hba.conf, or drop channel_binding=require.",
                    if binding.is_none() {
                        " (and there is no TLS session whose certificate could be bound)"
                    } else {
                        ""
                    }
                )))
            } else {
                Ok(())
            }
        };
        let mut bound = false;
        let password = || {
            target.params().password_for(host).ok_or_else(|| {
                ConnError::Io(format!(
                    "the server asks for a password and none was given: put it in the URL, in \
                     PGPASSWORD, or in the password file {}",
                    target.params().passfile_display()
                ))
            })
        };
        let mut scram: Option<ScramSha256> = None;
        loop {
            let (tag, body) = self.read_message().await?;
            match tag {
                b'R' => {
                    let mut b = &body[..];
                    let code = b.get_i32();
                    self.out.clear();
                    match code {
                        0 if !bound => unbound("let the session in without a password")?,
                        0 => {}
                        3 => {
                            unbound("asks for a cleartext password")?;
                            frontend::password_message(password()?.as_bytes(), &mut self.out)
                                .map_err(io_err)?;
                        }
                        5 => {
                            unbound("asks for an MD5 password")?;
                            let salt = [b[0], b[1], b[2], b[3]];
                            let hash = postgres_protocol::authentication::md5_hash(
                                target.params().user.as_bytes(),
                                password()?.as_bytes(),
                                salt,
                            );
                            frontend::password_message(hash.as_bytes(), &mut self.out)
                                .map_err(io_err)?;
                        }
                        10 => {
                            let offered = String::from_utf8_lossy(b);
                            let has = |m: &str| offered.split('\0').any(|o| o == m);
                            let (mechanism, cb) = match &binding {
                                Some(hash) if has(sasl::SCRAM_SHA_256_PLUS) => {
                                    bound = true;
                                    (
                                        sasl::SCRAM_SHA_256_PLUS,
                                        ChannelBinding::tls_server_end_point(hash.clone()),
                                    )
                                }
                                _ if !has(sasl::SCRAM_SHA_256) => {
                                    return Err(ConnError::Refused(format!(
                                        "the server offers only SASL mechanisms {offered:?}; \
                                         sluice speaks SCRAM-SHA-256 and SCRAM-SHA-256-PLUS"
                                    )));
                                }
                                // Over TLS: "could bind, the server did not offer it".
                                Some(_) => (sasl::SCRAM_SHA_256, ChannelBinding::unrequested()),
                                None => (sasl::SCRAM_SHA_256, ChannelBinding::unsupported()),
                            };
                            if !bound {
                                unbound("does not offer SCRAM-SHA-256-PLUS")?;
                            }
                            let s = ScramSha256::new(password()?.as_bytes(), cb);
                            frontend::sasl_initial_response(mechanism, s.message(), &mut self.out)
                                .map_err(io_err)?;
                            scram = Some(s);
                        }
                        11 => {
                            let s = scram.as_mut().ok_or_else(|| {
                                ConnError::Io("SASL continue without a SASL start".into())
                            })?;
                            s.update(b).map_err(io_err)?;
                            frontend::sasl_response(s.message(), &mut self.out).map_err(io_err)?;
                        }
                        12 => {
                            let s = scram.as_mut().ok_or_else(|| {
                                ConnError::Io("SASL final without a SASL start".into())
                            })?;
                            s.finish(b).map_err(io_err)?;
                        }
                        other => {
                            return Err(ConnError::Io(format!(
                                "the server asks for authentication method {other} (GSSAPI, \
                                 SSPI or Kerberos), which sluice does not speak; allow \
                                 scram-sha-256 for this user in pg_hba.conf"
                            )));
                        }
                    }
                    if !self.out.is_empty() {
                        self.io.write_all(&self.out).await.map_err(io_err)?;
                    }
                }
                b'K' => {
                    let mut b = &body[..];
                    self.pid = b.get_i32();
                }
                b'Z' => return Ok(()),
                b'E' => return Err(ConnError::Server(parse_error(&body))),
                _ => {}
            }
        }
    }

    /// The backend pid of the walsender.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The redacted URL, for messages.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// The room a read gets: while streaming, four times [`COALESCE_BELOW`], so a read that
    /// returns less than that has emptied the socket (and not merely filled a small buffer,
    /// which would turn the coalescing wait into a cap on the rate).
    fn read_room(&self) -> usize {
        if self.streaming {
            4 * COALESCE_BELOW
        } else {
            8192
        }
    }

    /// Read one message: its tag and body.
    async fn read_message(&mut self) -> CResult<(u8, BytesMut)> {
        loop {
            if self.inbuf.len() >= 5 {
                let len = u32::from_be_bytes([
                    self.inbuf[1],
                    self.inbuf[2],
                    self.inbuf[3],
                    self.inbuf[4],
                ]) as usize;
                if self.inbuf.len() > len {
                    let tag = self.inbuf[0];
                    let mut frame = self.inbuf.split_to(len + 1);
                    frame.advance(5);
                    return Ok((tag, frame));
                }
                self.inbuf
                    .reserve((len + 1 - self.inbuf.len()).max(self.read_room()));
            } else {
                self.inbuf.reserve(self.read_room());
            }
            if self.streaming && self.last_read < COALESCE_BELOW {
                tokio::time::sleep(COALESCE_WAIT).await;
            }
            let n = self.io.read_buf(&mut self.inbuf).await.map_err(io_err)?;
            if n == 0 {
                return Err(ConnError::Io("the server closed the connection".into()));
            }
            self.last_read = n;
            if self.streaming {
                // Take what else is there already: a TLS session hands over one record
                // (at most 16 KB) per read, which alone would always look small.
                while self.inbuf.capacity() > self.inbuf.len() {
                    match self.io.read_buf(&mut self.inbuf).now_or_never() {
                        Some(Ok(m)) if m > 0 => self.last_read += m,
                        Some(Err(e)) => return Err(io_err(e)),
                        _ => break,
                    }
                }
            }
        }
    }

    /// Run one command with the simple query protocol and return its rows as text (NULL as
    /// `None`). Replication commands answer this way too.
    pub async fn query(&mut self, sql: &str) -> CResult<Vec<Vec<Option<String>>>> {
        self.out.clear();
        frontend::query(sql, &mut self.out).map_err(io_err)?;
        self.io.write_all(&self.out).await.map_err(io_err)?;
        let mut rows = Vec::new();
        let mut failed = None;
        loop {
            let (tag, body) = self.read_message().await?;
            match tag {
                b'D' => rows.push(parse_row(&body)),
                b'E' => failed = Some(parse_error(&body)),
                b'Z' => {
                    return match failed {
                        Some(e) => Err(ConnError::Server(e)),
                        None => Ok(rows),
                    };
                }
                _ => {}
            }
        }
    }

    /// Send `START_REPLICATION …` and wait for the CopyBoth stream to open.
    pub async fn start_copy_both(&mut self, sql: &str) -> CResult<()> {
        self.out.clear();
        frontend::query(sql, &mut self.out).map_err(io_err)?;
        self.io.write_all(&self.out).await.map_err(io_err)?;
        loop {
            let (tag, body) = self.read_message().await?;
            match tag {
                b'W' => {
                    self.streaming = true;
                    return Ok(());
                }
                b'E' => {
                    let e = parse_error(&body);
                    // Drain to ReadyForQuery so the session stays usable.
                    loop {
                        let (t, _) = self.read_message().await?;
                        if t == b'Z' {
                            break;
                        }
                    }
                    return Err(ConnError::Server(e));
                }
                _ => {}
            }
        }
    }

    /// The next CopyData payload of the stream, or `None` when the server ended the stream.
    /// Cancel-safe only between messages: callers wrap it in a timeout and treat a timeout
    /// as "nothing yet" (a partly read message stays in the buffer).
    pub async fn recv(&mut self) -> CResult<Option<BytesMut>> {
        loop {
            let (tag, body) = self.read_message().await?;
            match tag {
                b'd' => return Ok(Some(body)),
                b'c' | b'C' | b'Z' => return Ok(None),
                b'E' => return Err(ConnError::Server(parse_error(&body))),
                _ => {}
            }
        }
    }

    /// True when a whole message is already buffered, so [`Self::recv`] returns without
    /// waiting (the stream then skips arming a timer per message).
    pub fn has_message(&self) -> bool {
        self.inbuf.len() >= 5
            && self.inbuf.len()
                > u32::from_be_bytes([self.inbuf[1], self.inbuf[2], self.inbuf[3], self.inbuf[4]])
                    as usize
    }

    /// Send one CopyData message (a standby status update).
    pub async fn send(&mut self, data: &[u8]) -> CResult<()> {
        self.out.clear();
        self.out.extend_from_slice(b"d");
        self.out
            .extend_from_slice(&((data.len() + 4) as u32).to_be_bytes());
        self.out.extend_from_slice(data);
        self.io.write_all(&self.out).await.map_err(io_err)?;
        self.io.flush().await.map_err(io_err)
    }

    /// End the CopyBoth stream and the session.
    pub async fn close(&mut self) {
        self.out.clear();
        frontend::copy_done(&mut self.out);
        frontend::terminate(&mut self.out);
        let _ = self.io.write_all(&self.out).await;
        let _ = self.io.shutdown().await;
    }
}

fn cstr(b: &[u8]) -> (&[u8], &[u8]) {
    match b.iter().position(|&c| c == 0) {
        Some(i) => (&b[..i], &b[i + 1..]),
        None => (b, &[]),
    }
}

fn parse_error(body: &[u8]) -> ServerError {
    let mut e = ServerError {
        code: String::new(),
        message: String::new(),
        detail: None,
    };
    let mut b = body;
    while let Some((&kind, rest)) = b.split_first() {
        if kind == 0 {
            break;
        }
        let (value, rest) = cstr(rest);
        let value = String::from_utf8_lossy(value).into_owned();
        match kind {
            b'C' => e.code = value,
            b'M' => e.message = value,
            b'D' => e.detail = Some(value),
            _ => {}
        }
        b = rest;
    }
    e
}

fn parse_row(body: &[u8]) -> Vec<Option<String>> {
    let mut b = body;
    if b.len() < 2 {
        return Vec::new();
    }
    let n = b.get_i16().max(0) as usize;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if b.len() < 4 {
            break;
        }
        let len = b.get_i32();
        if len < 0 {
            out.push(None);
        } else {
            let len = (len as usize).min(b.len());
            out.push(Some(String::from_utf8_lossy(&b[..len]).into_owned()));
            b.advance(len);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_errors_and_rows() {
        let e = parse_error(b"SERROR\0C55006\0Mreplication slot \"s\" is active\0Dheld\0\0");
        assert_eq!(e.code, "55006");
        assert!(e.to_string().contains("is active"));
        let mut row = Vec::new();
        row.extend_from_slice(&2i16.to_be_bytes());
        row.extend_from_slice(&3i32.to_be_bytes());
        row.extend_from_slice(b"abc");
        row.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(parse_row(&row), vec![Some("abc".to_string()), None]);
    }
}
