//! TLS for PostgreSQL sessions: what `sslmode` and the certificate options ask for
//! ([`tls_settings`], with libpq's rules), and tokio-postgres's TLS hooks over tokio-rustls: [`PgTls`] makes a connector per host name,
//! and the stream reports `tls-server-end-point` channel binding so SCRAM can bind the login to
//! the TLS session (`channel_binding`).
//!
//! Written here rather than taken from a crate because it is small, and because it keeps one
//! rustls configuration (built by `sluice_core::tls`) for sessions, cancel requests and, later,
//! the replication connection.

use super::params::{self, Env};
use super::settings::{SslMode, home_file};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use sluice_core::tls::{self as core_tls, Roots, Verify};
use sluice_core::{Error, Result};
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// Makes TLS connectors for tokio-postgres from one rustls configuration. Cloning is cheap.
#[derive(Clone)]
pub struct PgTls {
    config: Arc<ClientConfig>,
    /// Set when a handshake is started (see [`PgTls::watched`]).
    started: Option<Arc<AtomicBool>>,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTls").finish_non_exhaustive()
    }
}

impl PgTls {
    /// A connector using `config` (verification, client certificate and ALPN decided there).
    pub fn new(config: ClientConfig) -> PgTls {
        PgTls {
            config: Arc::new(config),
            started: None,
        }
    }

    /// A copy that records whether a TLS handshake was started, for libpq's `prefer` rule:
    /// a connection that failed *over TLS* is retried without it.
    pub fn watched(&self) -> (PgTls, Arc<AtomicBool>) {
        let flag = Arc::new(AtomicBool::new(false));
        let tls = PgTls {
            config: self.config.clone(),
            started: Some(flag.clone()),
        };
        (tls, flag)
    }

    /// The rustls configuration, for connections tokio-postgres does not make (replication).
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }
}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<PgTlsConnect> {
        // tokio-postgres asks for a connector even for Unix sockets and plaintext sessions
        // (with an empty name); a missing name only matters if a handshake is attempted.
        Ok(PgTlsConnect {
            config: self.config.clone(),
            started: self.started.clone(),
            name: ServerName::try_from(domain.to_string()).ok(),
            domain: domain.to_string(),
        })
    }
}

/// A connector for one host name.
pub struct PgTlsConnect {
    config: Arc<ClientConfig>,
    started: Option<Arc<AtomicBool>>,
    name: Option<ServerName<'static>>,
    domain: String,
}

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgTlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            if let Some(flag) = &self.started {
                flag.store(true, Ordering::Relaxed);
            }
            let name = self.name.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{:?} is not a host name TLS can verify", self.domain),
                )
            })?;
            let tls = tokio_rustls::TlsConnector::from(self.config)
                .connect(name, stream)
                .await?;
            Ok(PgTlsStream(tls))
        })
    }
}

/// A TLS session to the server.
pub struct PgTlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgTlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        let (_, session) = self.0.get_ref();
        session
            .peer_certificates()
            .and_then(|certs| certs.first())
            .and_then(|cert| server_end_point(cert.as_ref()))
            .map(ChannelBinding::tls_server_end_point)
            .unwrap_or_else(ChannelBinding::none)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// RFC 5929 `tls-server-end-point`: the server certificate hashed with its signature's hash
/// (SHA-256 for MD5 and SHA-1). `None` for algorithms without one hash (RSA-PSS, Ed25519):
/// SCRAM then runs without channel binding, as `channel_binding=prefer` allows.
pub(crate) fn server_end_point(cert: &[u8]) -> Option<Vec<u8>> {
    use ring::digest::{SHA256, SHA384, SHA512, digest};
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA_SHA2: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03];
    const ECDSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01];
    let oid = signature_oid(cert)?;
    let alg = if let Some(last) = oid.strip_prefix(RSA) {
        match last {
            [0x04] | [0x05] | [0x0b] => &SHA256,
            [0x0c] => &SHA384,
            [0x0d] => &SHA512,
            _ => return None,
        }
    } else if let Some(last) = oid.strip_prefix(ECDSA_SHA2) {
        match last {
            [0x02] => &SHA256,
            [0x03] => &SHA384,
            [0x04] => &SHA512,
            _ => return None,
        }
    } else if oid == ECDSA_SHA1 {
        &SHA256
    } else {
        return None;
    };
    Some(digest(alg, cert).as_ref().to_vec())
}

/// The signature algorithm's OID of a DER certificate:
/// `SEQUENCE { tbsCertificate, SEQUENCE { OID, … }, BIT STRING }`.
fn signature_oid(cert: &[u8]) -> Option<&[u8]> {
    let (tag, body, _) = der(cert)?;
    if tag != 0x30 {
        return None;
    }
    let (_, _, after_tbs) = der(body)?;
    let (tag, alg, _) = der(after_tbs)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, oid, _) = der(alg)?;
    (tag == 0x06).then_some(oid)
}

/// One DER element: (tag, contents, the bytes after it).
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The TLS settings decided from `sslmode` and the certificate options.
pub(super) struct TlsSettings {
    pub mode: SslMode,
    pub direct: bool,
    pub verify: Verify,
    pub roots: Option<Roots>,
    pub roots_store: Option<rustls::RootCertStore>,
    pub cert: Option<PathBuf>,
    pub identity: Option<core_tls::Identity>,
}

pub(super) fn tls_settings(
    kw: &params::Keywords,
    env: &Env<'_>,
    opt: &dyn Fn(String) -> Error,
) -> Result<TlsSettings> {
    let system = kw.get("sslrootcert") == Some("system");
    let mode = match kw.get("sslmode") {
        Some(m) => SslMode::parse(m).ok_or_else(|| {
            opt(format!(
                "sslmode={m:?} is not one of disable, allow, prefer, require, verify-ca, \
                 verify-full."
            ))
        })?,
        // libpq: sslrootcert=system makes verify-full the default.
        None if system => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    if system && mode != SslMode::VerifyFull {
        return Err(opt(format!(
            "sslmode={} is too weak to use with sslrootcert=system: use sslmode=verify-full \
             (as libpq requires).",
            mode.as_str()
        )));
    }
    let direct = match kw.get("sslnegotiation").unwrap_or("postgres") {
        "postgres" => false,
        "direct" => true,
        other => {
            return Err(opt(format!(
                "sslnegotiation={other:?} is not one of postgres, direct."
            )));
        }
    };
    if direct && matches!(mode, SslMode::Disable | SslMode::Allow | SslMode::Prefer) {
        return Err(opt(format!(
            "sslmode={} cannot be used with sslnegotiation=direct (a direct TLS handshake has \
             no plaintext fallback): use sslmode=require, verify-ca or verify-full.",
            mode.as_str()
        )));
    }
    let mut s = TlsSettings {
        mode,
        direct,
        verify: Verify::None,
        roots: None,
        roots_store: None,
        cert: None,
        identity: None,
    };
    if mode == SslMode::Disable {
        return Ok(s);
    }
    let roots = if system {
        Some(Roots::System)
    } else {
        let path = kw
            .get("sslrootcert")
            .map(PathBuf::from)
            .or_else(|| home_file(env, ".postgresql/root.crt"));
        match path {
            Some(p) if p.exists() => Some(Roots::File(p)),
            Some(p) if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) => {
                return Err(opt(format!(
                    "root certificate file {} does not exist, and sslmode={} needs one. Either \
                     provide the file (sslrootcert=PATH), use the system's trusted roots with \
                     sslrootcert=system, or change sslmode to disable server certificate \
                     verification.",
                    p.display(),
                    mode.as_str()
                )));
            }
            Some(p) => {
                if kw.is_set("sslrootcert") {
                    tracing::warn!(
                        "sslrootcert file {} does not exist: the server's certificate will not \
                         be verified (sslmode={})",
                        p.display(),
                        mode.as_str()
                    );
                }
                None
            }
            None if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) => {
                return Err(opt(format!(
                    "sslmode={} needs trusted CA certificates: set sslrootcert=PATH (or \
                     sslrootcert=system), or PGSSLROOTCERT.",
                    mode.as_str()
                )));
            }
            None => None,
        }
    };
    if let Some(r) = &roots {
        s.roots_store = Some(core_tls::load_roots(r, "sslrootcert")?);
        s.verify = if mode == SslMode::VerifyFull {
            Verify::Full
        } else {
            Verify::Chain
        };
    }
    s.roots = roots;
    let cert = kw
        .get("sslcert")
        .map(PathBuf::from)
        .or_else(|| home_file(env, ".postgresql/postgresql.crt"));
    match cert {
        Some(c) if c.exists() => {
            let key = kw
                .get("sslkey")
                .map(PathBuf::from)
                .or_else(|| home_file(env, ".postgresql/postgresql.key"))
                .filter(|k| k.exists())
                .ok_or_else(|| {
                    opt(format!(
                        "the client certificate {} is present, but not its private key: set \
                         sslkey=PATH (default ~/.postgresql/postgresql.key).",
                        c.display()
                    ))
                })?;
            s.identity = Some(core_tls::load_identity(
                &c,
                &key,
                core_tls::IdentityOptions {
                    cert: "sslcert",
                    key: "sslkey",
                    check_key_permissions: true,
                },
            )?);
            s.cert = Some(c);
        }
        Some(c) if kw.is_set("sslcert") => tracing::warn!(
            "sslcert file {} does not exist: connecting without a client certificate",
            c.display()
        ),
        _ => {}
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_point_hash_follows_the_signature() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["db.example".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = cert.der().as_ref();
        let hash = server_end_point(der).expect("ecdsa-with-SHA384 is supported");
        assert_eq!(hash.len(), 48);
        let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["db.example".into()])
            .unwrap()
            .self_signed(&ed)
            .unwrap();
        assert!(server_end_point(cert.der().as_ref()).is_none());
    }
}
