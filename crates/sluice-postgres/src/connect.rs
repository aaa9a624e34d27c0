//! Connecting: libpq's parameters and environment, TLS, session settings.
//!
//! A URL means what it means to libpq (psql, pg_dump): see `params` for the forms and the
//! `PG*` variables, `~/.pgpass` for passwords, and `sslmode` for TLS, with libpq's meaning:
//!
//! | sslmode | TLS | server certificate |
//! |---------|-----|--------------------|
//! | `disable` | never | — |
//! | `allow` | only if the server refuses a plaintext session | not verified¹ |
//! | `prefer` (default) | if the server offers it; a failed TLS session is retried without | not verified¹ |
//! | `require` | always | not verified¹ |
//! | `verify-ca` | always | signed by a CA in `sslrootcert` |
//! | `verify-full` | always | signed by a CA in `sslrootcert`, and valid for the host name |
//!
//! ¹ As in libpq, when a root certificate file exists (`sslrootcert`, default
//! `~/.postgresql/root.crt`) these modes verify the chain like `verify-ca`.
//! `sslrootcert=system` trusts the operating system's CAs and requires `verify-full`. Client
//! certificates come from `sslcert`/`sslkey` (default `~/.postgresql/postgresql.crt` and
//! `.key` when they exist); the key must not be readable by others. Unix-socket connections
//! never use TLS. `sslnegotiation=direct` starts TLS without PostgreSQL's SSLRequest (servers
//! 17 and later; it needs `sslmode=require` or stronger).
//!
//! Every session carries `application_name` (default `sluice`, so a DBA sees it in
//! `pg_stat_activity`) and the same output-affecting settings (UTC, ISO dates, exact float
//! text), so text casts and key bounds round-trip identically in every session. Every session
//! also runs with `row_security = off`, as pg_dump's do: a table whose row-level security
//! policies would hide rows from the user fails to read instead of being silently filtered,
//! unless the run opted in ([`PgTarget::with_row_security`]). The run's
//! sessions are found by their backend pids, recorded per session tag when they connect
//! ([`PgTarget::sessions`]); the harm probe reads them.

mod params;
mod settings;
mod tls;

pub use params::{Env, KEYWORDS};
pub use settings::{DEFAULT_APPLICATION_NAME, HostSpec, PgHost, PgParams, SslMode};
pub use tls::PgTls;
pub(crate) use tls::server_end_point;

use crate::error::{Phase, classify};
use sluice_core::redact::redact_url;
use sluice_core::tls::{self as core_tls, Problem};
use sluice_core::{Error, ErrorKind, Result, Retry};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::config::SslMode as DriverSsl;
use tokio_postgres::error::SqlState;
use tokio_postgres::{CancelToken, Client};

/// Settings applied to every session through the startup packet (no extra round trip).
const SESSION_OPTIONS: &str = "-c TimeZone=UTC -c DateStyle=ISO -c IntervalStyle=iso_8601 \
     -c extra_float_digits=3 -c standard_conforming_strings=on -c lock_timeout=10s \
     -c row_security=off";

/// A parsed PostgreSQL connection target: the parameters, the TLS connector built from them,
/// and the backend pids of the sessions opened through it.
#[derive(Clone)]
pub struct PgTarget {
    params: Arc<PgParams>,
    tls: PgTls,
    display: String,
    sessions: Arc<Mutex<BTreeMap<String, BTreeSet<i32>>>>,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the parameters: they hold the password.
        f.debug_struct("PgTarget")
            .field("url", &self.display)
            .finish()
    }
}

impl PgTarget {
    /// Parse a `postgres://` URL with libpq's conventions, reading the process environment
    /// (`PGHOST`, `PGSSLMODE`, …) and the home directory (`~/.pgpass`, `~/.postgresql/`).
    /// TLS files are read here, so a bad certificate path fails before any connection.
    pub fn parse(url: &str) -> Result<Self> {
        Self::parse_with(url, &Env::process())
    }

    /// [`Self::parse`] with an explicit environment.
    pub fn parse_with(url: &str, env: &Env<'_>) -> Result<Self> {
        let display = redact_url(url);
        let bad = |why: &str| {
            Error::config(format!(
                "source URL {display} {why}. Use the form \
                 postgres://user[:password]@host[:port]/database[?sslmode=…], percent-encoding \
                 special characters."
            ))
        };
        let kw = params::keywords(url, env, &bad)?;
        let opt = |why: String| Error::config(format!("source URL {display}: {why}"));
        let (params, client_config) = settings::resolve(&kw, env, &opt)?;
        Ok(PgTarget {
            params: Arc::new(params),
            tls: PgTls::new(client_config),
            display,
            sessions: Arc::default(),
        })
    }

    /// This target with row-level security applied to its sessions when `enable` (the user
    /// opted in to exporting only the rows policies let them see, `--enable-row-security`);
    /// otherwise sessions keep `row_security = off`.
    pub fn with_row_security(mut self, enable: bool) -> Self {
        if enable {
            Arc::make_mut(&mut self.params).row_security = true;
        }
        self
    }

    /// The URL with the password redacted.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// Where this target's sessions land, independent of how the URL spells it: the hosts
    /// and ports (sorted) and the database, without user, TLS or other parameters. What a
    /// replication's default name is derived from.
    pub fn identity(&self) -> String {
        let mut hosts: Vec<String> = self
            .params
            .hosts
            .iter()
            .map(|h| format!("{}:{}", h.host_str(), h.port))
            .collect();
        hosts.sort();
        hosts.dedup();
        format!("postgres://{}/{}", hosts.join(","), self.params.dbname)
    }

    /// The resolved parameters (for connections sluice makes outside tokio-postgres).
    pub fn params(&self) -> &PgParams {
        &self.params
    }

    /// The TLS connector every session of this target uses.
    pub fn tls(&self) -> &PgTls {
        &self.tls
    }

    /// Backend pids of the sessions opened with `tag` (closed ones included until the
    /// server reuses the pid; the harm probe also matches `application_name`).
    pub fn sessions(&self, tag: &str) -> Vec<i32> {
        self.sessions
            .lock()
            .map(|s| s.get(tag).map(|p| p.iter().copied().collect()))
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Ask the server to cancel the statement running on the session `token` came from, over
    /// the same kind of channel (TLS or not) the session uses.
    pub async fn cancel(&self, token: CancelToken) -> Result<()> {
        token
            .cancel_query(self.tls.clone())
            .await
            .map_err(|e| classify(e, Phase::Connect, &self.display))?;
        tracing::debug!("sent a query cancel request to {}", self.display);
        Ok(())
    }

    /// Open a session, recorded under `tag` (see [`Self::sessions`]). Hosts are tried in
    /// order; the connection task runs on the current Tokio runtime and ends when the client
    /// is dropped.
    pub async fn connect(&self, tag: &str) -> Result<Client> {
        let mut order: Vec<&HostSpec> = self.params.hosts.iter().collect();
        if self.params.load_balance {
            use rand::seq::SliceRandom;
            order.shuffle(&mut rand::rng());
        }
        let mut failures = Vec::new();
        for host in order {
            match self.connect_host(host).await {
                Ok(client) => {
                    self.record(tag, &client).await?;
                    return Ok(client);
                }
                Err(f) => failures.push((host.host_str(), f.into_error(self, host))),
            }
        }
        Err(combine(failures))
    }

    async fn record(&self, tag: &str, client: &Client) -> Result<()> {
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .map_err(|e| classify(e, Phase::Connect, &self.display))?
            .get(0);
        if let Ok(mut s) = self.sessions.lock() {
            s.entry(tag.to_string()).or_default().insert(pid);
        }
        Ok(())
    }

    /// One host, with libpq's sslmode fallbacks: `allow` retries with TLS when the server
    /// refused the plaintext session, `prefer` retries without TLS when the TLS session failed.
    /// Unix sockets never use TLS.
    async fn connect_host(&self, host: &HostSpec) -> std::result::Result<Client, Failed> {
        let mode = self.params.sslmode;
        let tcp = matches!(host.host, PgHost::Tcp(_));
        let first = match mode {
            _ if !tcp => DriverSsl::Disable,
            SslMode::Disable | SslMode::Allow => DriverSsl::Disable,
            SslMode::Prefer => DriverSsl::Prefer,
            _ => DriverSsl::Require,
        };
        match self.attempt(host, first).await {
            Ok(c) => Ok(c),
            Err(Failed::Driver(e, false))
                if tcp && mode == SslMode::Allow && e.as_db_error().is_some() =>
            {
                tracing::debug!(
                    "plaintext session refused ({e}); retrying with TLS (sslmode=allow)"
                );
                self.attempt(host, DriverSsl::Require).await
            }
            Err(Failed::Driver(e, true)) if tcp && mode == SslMode::Prefer => {
                tracing::debug!("TLS session failed ({e}); retrying without TLS (sslmode=prefer)");
                self.attempt(host, DriverSsl::Disable).await
            }
            Err(e) => Err(e),
        }
    }

    async fn attempt(
        &self,
        host: &HostSpec,
        ssl: DriverSsl,
    ) -> std::result::Result<Client, Failed> {
        let config = self.params.driver_config(host, ssl);
        let (tls, started) = self.tls.watched();
        let connecting = config.connect(tls);
        let outcome = match self.params.connect_timeout {
            Some(t) => tokio::time::timeout(t, connecting)
                .await
                .map_err(|_| Failed::Timeout(t))?,
            None => connecting.await,
        };
        let (client, connection) =
            outcome.map_err(|e| Failed::Driver(e, started.load(Ordering::Relaxed)))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("PostgreSQL connection ended: {e}");
            }
        });
        Ok(client)
    }
}

/// How one connection attempt failed: the driver's error and whether a TLS handshake had
/// started, or a timeout. Turned into a sluice [`Error`] once no fallback is left.
enum Failed {
    Driver(tokio_postgres::Error, bool),
    Timeout(Duration),
}

impl Failed {
    fn into_error(self, t: &PgTarget, host: &HostSpec) -> Error {
        match self {
            Failed::Timeout(d) => Error::source_transient(format!(
                "could not connect to PostgreSQL at {} (host {}) within {} s (connect_timeout). \
                 Check that the server is running and reachable, or raise connect_timeout.",
                t.display,
                host.host_str(),
                d.as_secs()
            )),
            Failed::Driver(e, used_tls) => driver_error(t, host, e, used_tls),
        }
    }
}

/// The message for a failed connection: TLS problems named with their fix, the rest as
/// [`classify`] words them, plus what the TLS settings had to do with it.
fn driver_error(t: &PgTarget, host: &HostSpec, e: tokio_postgres::Error, used_tls: bool) -> Error {
    let p = &t.params;
    let mode = p.sslmode.as_str();
    if let Some(f) = core_tls::explain(&e) {
        let fix = match &f.problem {
            Problem::UnknownCa => format!(
                "Set sslrootcert to the certificate of the CA that signed the server's \
                 certificate (trusted now: {}), or use sslmode=require to encrypt without \
                 verifying the server.",
                p.sslrootcert
                    .as_ref()
                    .map(|r| r.to_string())
                    .unwrap_or_else(|| "none".into())
            ),
            Problem::NameMismatch { .. } => "Connect with a host name the certificate is valid \
                 for, or use sslmode=verify-ca to verify the CA but not the host name."
                .to_string(),
            Problem::Validity => "The server's certificate must be renewed (or this machine's \
                 clock corrected); sslmode=require would encrypt without verifying it."
                .to_string(),
            Problem::BadCertificate => "Check the server's certificate; sslmode=require would \
                 encrypt without verifying it."
                .to_string(),
            Problem::ServerRefused => "Set sslcert and sslkey to a client certificate signed \
                 by a CA the server trusts (its ssl_ca_file)."
                .to_string(),
            Problem::Other if p.direct_tls => DIRECT_HINT.to_string(),
            Problem::Other => "Check that the server accepts TLS 1.2 or 1.3.".to_string(),
        };
        return Error::new(
            ErrorKind::Source,
            Retry::Permanent,
            format!(
                "could not connect to PostgreSQL at {} over TLS (sslmode={mode}, host {}): {}. \
                 {fix}",
                t.display,
                host.host_str(),
                f.text
            ),
        );
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    if text.contains("password missing") {
        return Error::new(
            ErrorKind::Source,
            Retry::Permanent,
            format!(
                "PostgreSQL at {} asks for a password and none was given: put it in the URL, \
                 in PGPASSWORD, or in the password file {} (whose permissions must be 0600).",
                t.display,
                p.passfile_display()
            ),
        );
    }
    if text.contains("database does not allow writes") || text.contains("database is not read only")
    {
        return Error::new(
            ErrorKind::Source,
            Retry::Permanent,
            format!(
                "host {} of {} is not {} (target_session_attrs={}): list a host that is, or \
                 relax target_session_attrs.",
                host.host_str(),
                t.display,
                if text.contains("writes") {
                    "read-write (it is a standby or read-only)"
                } else {
                    "read-only (it accepts writes)"
                },
                if text.contains("writes") {
                    "read-write"
                } else {
                    "read-only"
                }
            ),
        );
    }
    if text.contains("server does not support TLS") {
        return Error::new(
            ErrorKind::Source,
            Retry::Permanent,
            format!(
                "the PostgreSQL server at {} does not accept TLS connections (its ssl setting \
                 is off), but sslmode={mode} requires TLS. Turn ssl on in the server's \
                 postgresql.conf, or use sslmode=prefer to connect without TLS.",
                t.display
            ),
        );
    }
    if p.direct_tls && e.as_db_error().is_none() && used_tls {
        return Error::new(
            ErrorKind::Source,
            Retry::Permanent,
            format!(
                "could not connect to PostgreSQL at {} with a direct TLS handshake \
                 (sslnegotiation=direct): {text}. {DIRECT_HINT}",
                t.display
            ),
        );
    }
    let no_tls = !used_tls;
    let refused = e.as_db_error().is_some_and(|d| {
        *d.code() == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            || *d.code() == SqlState::INVALID_PASSWORD
    });
    let base = classify(e, Phase::Connect, &t.display);
    if refused
        && no_tls
        && matches!(
            p.sslmode,
            SslMode::Disable | SslMode::Allow | SslMode::Prefer
        )
    {
        return Error::new(
            base.kind(),
            base.retry(),
            format!(
                "{} The session was not encrypted (sslmode={mode}{}): if the server accepts only \
                 TLS connections from this host (hostssl in pg_hba.conf), use sslmode=require, \
                 verify-ca or verify-full.",
                base.message(),
                if p.sslmode == SslMode::Disable {
                    " forbids TLS"
                } else {
                    ", and the server did not offer TLS"
                }
            ),
        );
    }
    base
}

const DIRECT_HINT: &str = "sslnegotiation=direct needs PostgreSQL 17 or later (and no \
     connection pooler in between that expects SSLRequest): remove sslnegotiation=direct to \
     negotiate TLS the usual way.";

/// One error for a host list: the only host's, or every host's message.
fn combine(mut failures: Vec<(String, Error)>) -> Error {
    if failures.len() == 1
        && let Some((_, e)) = failures.pop()
    {
        return e;
    }
    let mut kind = ErrorKind::Source;
    let mut retry = Retry::Permanent;
    let mut parts = Vec::new();
    for (host, e) in failures {
        kind = e.kind();
        if e.is_transient() {
            retry = Retry::Transient;
        }
        parts.push(format!("{host}: {}", e.message()));
    }
    Error::new(
        kind,
        retry,
        format!(
            "could not connect to any PostgreSQL host of the list — {}",
            parts.join(" | ")
        ),
    )
}
