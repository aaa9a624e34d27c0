//! Connecting: URL parsing, credentials from the environment, session settings.
//!
//! Every session sluice opens runs the same output-affecting settings (UTC time zone, utf8mb4,
//! generous network write timeouts so a slow writer never makes the server drop a streaming
//! session), so values and key bounds read in one session mean the same in every other.
//! MySQL has no `application_name`; sessions are recognised by their connection ids, which the
//! [`Sessions`] registry shared by the coordinator, the readers and the harm probe keeps.
//!
//! # TLS
//! `ssl-mode` has the MySQL clients' meaning: `DISABLED`; `PREFERRED` (default: TLS when the
//! server offers it, certificate not verified); `REQUIRED` (TLS, not verified); `VERIFY_CA`
//! (the certificate must chain to `ssl-ca`, or to the system's CAs without it); and
//! `VERIFY_IDENTITY` (and be valid for the host name). `ssl-ca` without `ssl-mode` means
//! `VERIFY_CA`, as in the MySQL 8 client. `ssl-cert`/`ssl-key` present a client certificate.
//! Sessions through a Unix socket (`?socket=`) never use TLS.
//! The driver's own "skip the host name" switch does not work with the rustls version in use,
//! so `VERIFY_CA` handles a host-name mismatch itself: the chain was verified before the name
//! (see `sluice_core::tls`), and the session is made again naming a host the certificate holds.
//!
//! Length: about 530 lines of code plus its unit tests. Parsing a URL (with its TLS options)
//! and connecting with them are one sequence: the TLS level decides how a refused handshake is
//! retried and worded, so they stay together; the run's session registry lives in harm.rs.

use crate::error::{Phase, classify};
use mysql_async::{ClientIdentity, Conn, OptsBuilder, SslOpts};
use sluice_core::redact::{redact_url, scrub};
use sluice_core::tls::{self as core_tls, Problem, Roots};
use sluice_core::{Error, ErrorKind, Result, Retry};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use crate::harm::{SessionState, Sessions};

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

/// The MySQL clients' `ssl-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// No TLS.
    Disabled,
    /// TLS when the server offers it; the certificate is not verified (the default).
    Preferred,
    /// TLS; the certificate is not verified.
    Required,
    /// TLS; the certificate must chain to a trusted CA.
    VerifyCa,
    /// TLS; the certificate must chain to a trusted CA and be valid for the host name.
    VerifyIdentity,
}

impl SslMode {
    fn parse(v: &str) -> Option<SslMode> {
        Some(match v.to_ascii_uppercase().as_str() {
            "DISABLED" => SslMode::Disabled,
            "PREFERRED" => SslMode::Preferred,
            "REQUIRED" => SslMode::Required,
            "VERIFY_CA" => SslMode::VerifyCa,
            "VERIFY_IDENTITY" => SslMode::VerifyIdentity,
            _ => return None,
        })
    }

    /// The MySQL spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disabled => "DISABLED",
            SslMode::Preferred => "PREFERRED",
            SslMode::Required => "REQUIRED",
            SslMode::VerifyCa => "VERIFY_CA",
            SslMode::VerifyIdentity => "VERIFY_IDENTITY",
        }
    }
}

/// TLS settings of a target, checked at parse time.
#[derive(Clone)]
struct Tls {
    mode: SslMode,
    ca: Option<Roots>,
    identity: Option<(PathBuf, PathBuf)>,
    /// The system's CAs (DER), loaded once when `VERIFY_*` has no `ssl-ca`.
    system_roots: Arc<Vec<Vec<u8>>>,
    /// What earlier sessions of the run learnt: the server offers no TLS (`PREFERRED` then
    /// stops asking), or the name to verify a `VERIFY_CA` certificate against.
    learnt: Arc<Mutex<Learnt>>,
}

#[derive(Default)]
struct Learnt {
    no_server_tls: bool,
    name_override: Option<String>,
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
    tls: Tls,
    /// Zero-date policy (`?zero_dates=null|error`).
    pub zero_dates: ZeroDates,
    /// Row protocol (`?protocol=binary|text`).
    pub protocol: Protocol,
    /// Sessions ask for `CLIENT_FOUND_ROWS`: an update's affected rows are the rows it
    /// matched, not those it changed (an apply target counts updates that matched none).
    found_rows: bool,
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
         ?zero_dates=null|error, ?protocol=binary|text, ?socket=/path/to/mysqld.sock, \
         ?ssl-mode=DISABLED|PREFERRED|REQUIRED|VERIFY_CA|VERIFY_IDENTITY, ?ssl-ca=PATH, \
         ?ssl-cert=PATH&ssl-key=PATH."
    ))
}

impl MyTarget {
    /// Parse `mysql://user[:password]@host[:port]/database[?options]` (or `mariadb://`).
    ///
    /// A password missing from the URL is taken from `MYSQL_PWD`; a missing user from `USER`.
    /// A missing port means 3306. Options: `zero_dates=null|error` (strict mode fails on zero
    /// dates), `protocol=binary|text`, `socket=PATH` (connect through a Unix socket), and TLS:
    /// `ssl-mode`, `ssl-ca`, `ssl-cert`, `ssl-key` (see the module documentation). Certificate
    /// files are read here, so a bad path fails before any connection.
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
            tls: Tls {
                mode: SslMode::Preferred,
                ca: None,
                identity: None,
                system_roots: Arc::default(),
                learnt: Arc::default(),
            },
            zero_dates: ZeroDates::Null,
            protocol: Protocol::Binary,
            found_rows: false,
        };
        let mut mode = None;
        let (mut cert, mut key) = (None, None);
        for (k, v) in parsed.query_pairs() {
            match (k.as_ref(), v.as_ref()) {
                ("ssl-mode" | "ssl_mode" | "sslmode", m) => {
                    mode = Some(SslMode::parse(m).ok_or_else(|| {
                        bad_url(&display, &format!("has ssl-mode={m}, which is not a mode"))
                    })?);
                }
                ("ssl-ca" | "ssl_ca", p) if !p.is_empty() => {
                    t.tls.ca = Some(Roots::File(PathBuf::from(p)));
                }
                ("ssl-cert" | "ssl_cert", p) if !p.is_empty() => cert = Some(PathBuf::from(p)),
                ("ssl-key" | "ssl_key", p) if !p.is_empty() => key = Some(PathBuf::from(p)),
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
        t.tls.mode = match (mode, &t.tls.ca) {
            (Some(m), _) => m,
            // As the MySQL 8 client: a CA without a mode asks for verification.
            (None, Some(_)) => SslMode::VerifyCa,
            (None, None) => SslMode::Preferred,
        };
        t.tls.identity = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                return Err(bad_url(
                    &display,
                    "names only one of ssl-cert and ssl-key (a client certificate needs both)",
                ));
            }
        };
        t.check_tls()?;
        Ok(t)
    }

    /// Read and check the TLS files now, so a bad path fails before any connection.
    fn check_tls(&mut self) -> Result<()> {
        let tls = &mut self.tls;
        if tls.mode == SslMode::Disabled {
            return Ok(());
        }
        let verify = matches!(tls.mode, SslMode::VerifyCa | SslMode::VerifyIdentity);
        match &tls.ca {
            Some(ca) if verify => {
                core_tls::load_roots(ca, "ssl-ca")?;
            }
            Some(_) => tracing::warn!(
                "ssl-ca is ignored with ssl-mode={}: the server's certificate is not verified \
                 (use ssl-mode=VERIFY_CA or VERIFY_IDENTITY)",
                tls.mode.as_str()
            ),
            None if verify => {
                core_tls::load_roots(&Roots::System, "ssl-ca")?;
                tls.system_roots = Arc::new(
                    rustls_native_certs::load_native_certs()
                        .certs
                        .into_iter()
                        .map(|c| c.as_ref().to_vec())
                        .collect(),
                );
            }
            None => {}
        }
        if let Some((cert, key)) = &tls.identity {
            core_tls::load_identity(
                cert,
                key,
                core_tls::IdentityOptions {
                    cert: "ssl-cert",
                    key: "ssl-key",
                    check_key_permissions: false,
                },
            )?;
        }
        Ok(())
    }

    /// The driver's TLS options for the next session; `None` for a plaintext one.
    fn ssl_opts(&self) -> Option<SslOpts> {
        let tls = &self.tls;
        let learnt = tls.learnt.lock().ok();
        let mode = tls.mode;
        // A Unix socket never carries TLS (the driver would ask for it and then not do it).
        if mode == SslMode::Disabled
            || self.socket.is_some()
            || (mode == SslMode::Preferred && learnt.as_ref().is_some_and(|l| l.no_server_tls))
        {
            return None;
        }
        core_tls::install_default_provider();
        let verify = matches!(mode, SslMode::VerifyCa | SslMode::VerifyIdentity);
        // Without verification the driver still builds a verifier (never asked about the
        // chain), which needs some roots: its built-in ones. With verification only ours count.
        let mut opts = SslOpts::default()
            .with_disable_built_in_roots(verify)
            .with_danger_accept_invalid_certs(!verify);
        if verify {
            let roots = match &tls.ca {
                Some(Roots::File(p)) => vec![p.clone().into()],
                _ => tls
                    .system_roots
                    .iter()
                    .map(|der| der.clone().into())
                    .collect(),
            };
            opts = opts.with_root_certs(roots);
        }
        if mode == SslMode::VerifyCa
            && let Some(name) = learnt.as_ref().and_then(|l| l.name_override.clone())
        {
            opts = opts.with_danger_tls_hostname_override(Some(name));
        }
        if let Some((cert, key)) = &tls.identity {
            opts = opts.with_client_identity(Some(ClientIdentity::new(
                cert.clone().into(),
                key.clone().into(),
            )));
        }
        Some(opts)
    }

    /// The `ssl-mode` in effect.
    pub fn ssl_mode(&self) -> SslMode {
        self.tls.mode
    }

    /// The URL with the password redacted.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// This target with sessions whose updates report the rows they matched
    /// (`CLIENT_FOUND_ROWS`).
    pub fn with_found_rows(mut self) -> Self {
        self.found_rows = true;
        self
    }

    /// Where this target's sessions land, independent of how the URL spells it (`mysql://`
    /// or `mariadb://`, user, TLS options): host and port (or the socket) and the database.
    /// What a replication's default name is derived from.
    pub fn identity(&self) -> String {
        match &self.socket {
            Some(s) => format!("mysql://{s}/{}", self.database),
            None => format!("mysql://{}:{}/{}", self.host, self.port, self.database),
        }
    }

    /// The database named in the URL: where unqualified table names are looked up.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// Open a session with sluice's settings and register it in `sessions`. With
    /// `ssl-mode=PREFERRED` a server without TLS is asked once per run, then sessions go
    /// plaintext; with `VERIFY_CA` a certificate valid for another host name than the URL's is
    /// accepted by naming one of its hosts (its chain was verified).
    pub async fn connect(&self, sessions: &Sessions) -> Result<Conn> {
        let mut retried = false;
        loop {
            let ssl = self.ssl_opts();
            let with_tls = ssl.is_some();
            match self.connect_once(ssl).await {
                Ok(conn) => {
                    sessions.add(conn.id());
                    return Ok(conn);
                }
                Err(Failed::Driver(e)) if !retried => {
                    let no_tls = matches!(
                        &e,
                        mysql_async::Error::Driver(
                            mysql_async::DriverError::NoClientSslFlagFromServer
                        )
                    );
                    let name = core_tls::explain(&e)
                        .map(|f| core_tls::presented_names(&f.problem))
                        .and_then(|n| n.into_iter().next());
                    let mut learnt =
                        self.tls.learnt.lock().map_err(|_| {
                            Error::internal("the MySQL TLS state lock was poisoned")
                        })?;
                    match (self.tls.mode, no_tls, name) {
                        (SslMode::Preferred, true, _) => {
                            tracing::debug!("the server offers no TLS; connecting without it");
                            learnt.no_server_tls = true;
                        }
                        (SslMode::VerifyCa, false, Some(name)) if with_tls => {
                            tracing::debug!(
                                "the certificate's chain is trusted but it names {name}; \
                                 verifying it as {name} (ssl-mode=VERIFY_CA)"
                            );
                            learnt.name_override = Some(name);
                        }
                        _ => return Err(self.explain(e, with_tls)),
                    }
                    retried = true;
                }
                Err(Failed::Driver(e)) => return Err(self.explain(e, with_tls)),
                Err(Failed::Done(e)) => return Err(e),
            }
        }
    }

    /// A driver error as a sluice error: TLS problems named with their fix.
    fn explain(&self, e: mysql_async::Error, with_tls: bool) -> Error {
        let mode = self.tls.mode.as_str();
        if let Some(f) = core_tls::explain(&e) {
            let fix = match f.problem {
                Problem::UnknownCa => format!(
                    "Set ssl-ca to the certificate of the CA that signed the server's \
                     certificate (trusted now: {}), or use ssl-mode=REQUIRED to encrypt without \
                     verifying the server.",
                    self.tls
                        .ca
                        .as_ref()
                        .map(|r| r.to_string())
                        .unwrap_or_else(|| Roots::System.to_string())
                ),
                Problem::NameMismatch { .. } => "Connect with a host name the certificate is \
                     valid for, or use ssl-mode=VERIFY_CA to verify the CA but not the host name."
                    .to_string(),
                Problem::Validity | Problem::BadCertificate => "The server's certificate must \
                     be replaced (or this machine's clock corrected); ssl-mode=REQUIRED would \
                     encrypt without verifying it."
                    .to_string(),
                Problem::ServerRefused => "Set ssl-cert and ssl-key to a client certificate \
                     signed by a CA the server trusts (its ssl_ca)."
                    .to_string(),
                Problem::Other => "Check that the server accepts TLS 1.2 or 1.3.".to_string(),
            };
            return Error::new(
                ErrorKind::Source,
                Retry::Permanent,
                format!(
                    "could not connect to MySQL/MariaDB at {} over TLS (ssl-mode={mode}): {}. \
                     {fix}",
                    self.display, f.text
                ),
            );
        }
        if matches!(
            &e,
            mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer)
        ) {
            return Error::new(
                ErrorKind::Source,
                Retry::Permanent,
                format!(
                    "the MySQL/MariaDB server at {} does not offer TLS, but ssl-mode={mode} \
                     requires it. Configure TLS on the server (ssl_cert, ssl_key), or use \
                     ssl-mode=PREFERRED to connect without it.",
                    self.display
                ),
            );
        }
        let server_code = match &e {
            mysql_async::Error::Server(s) => Some(s.code),
            _ => None,
        };
        let base = classify(e, Phase::Connect, &self.display);
        let base = Error::new(
            base.kind(),
            base.retry(),
            scrub(base.message(), self.password.as_deref()),
        );
        match server_code {
            // MySQL: ER_SECURE_TRANSPORT_REQUIRED; MariaDB reports the same refusal as
            // "access denied".
            Some(3159) | Some(crate::error::code::ER_ACCESS_DENIED_ERROR) if !with_tls => {
                Error::new(
                    base.kind(),
                    base.retry(),
                    format!(
                        "{} The session was not encrypted (ssl-mode={mode}{}): if the server \
                         requires secure transport (require_secure_transport=ON), connect with \
                         TLS: ssl-mode=REQUIRED, VERIFY_CA or VERIFY_IDENTITY.",
                        base.message(),
                        if self.tls.mode == SslMode::Disabled {
                            ""
                        } else {
                            ", and the server did not offer TLS"
                        }
                    ),
                )
            }
            _ => base,
        }
    }

    async fn connect_once(&self, ssl: Option<SslOpts>) -> std::result::Result<Conn, Failed> {
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
            .connect_attribute("program_name", "sluice")
            .ssl_opts(ssl)
            .client_found_rows(self.found_rows)
            .init(SESSION_INIT.to_vec());
        tokio::time::timeout(Duration::from_secs(10), Conn::new(opts))
            .await
            .map_err(|_| {
                Failed::Done(Error::source_transient(format!(
                    "could not connect to MySQL/MariaDB at {} within 10 s. Check that the server \
                     is running and that host and port in the URL are right.",
                    self.display
                )))
            })?
            .map_err(Failed::Driver)
    }
}

/// How one connection attempt failed.
enum Failed {
    /// The driver's error, which a retry with other TLS settings may get past.
    Driver(mysql_async::Error),
    /// Final.
    Done(Error),
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
    fn ssl_options() {
        let t = MyTarget::parse("mysql://u@h/db").unwrap();
        assert_eq!(t.ssl_mode(), SslMode::Preferred);
        let t = MyTarget::parse("mysql://u@h/db?ssl-mode=disabled").unwrap();
        assert_eq!(t.ssl_mode(), SslMode::Disabled);
        assert!(t.ssl_opts().is_none());
        let t = MyTarget::parse("mysql://u@h/db?ssl-mode=REQUIRED").unwrap();
        assert!(t.ssl_opts().is_some());
        // A CA without a mode asks for verification; a missing CA file fails at parse time.
        let e = MyTarget::parse("mysql://u:topsecret@h/db?ssl-ca=/nonexistent/ca.pem").unwrap_err();
        assert_eq!(e.kind(), sluice_core::ErrorKind::Config);
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
        assert!(!e.to_string().contains("topsecret"), "{e}");
        for bad in [
            "mysql://u@h/db?ssl-mode=ON",
            "mysql://u@h/db?ssl-cert=/tmp/c.pem",
        ] {
            let e = MyTarget::parse(bad).unwrap_err();
            assert_eq!(e.kind(), sluice_core::ErrorKind::Config, "{bad}");
        }
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
