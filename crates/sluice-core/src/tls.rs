//! TLS for source connections, shared by the database adapters: trusted CAs, client
//! certificates, the three levels of server verification database clients offer, and
//! messages that name a refused certificate's problem.
//!
//! Why here: libpq and the MySQL clients agree on what the levels mean (encrypt only; verify
//! the certificate chain; verify the chain and the host name) and on what a user must do when
//! a certificate is refused. Only the option names differ, so an adapter words the fix with its
//! own names after [`explain`] has named the problem.
//!
//! The stack is rustls with the ring provider, as the object-store destinations use: no
//! OpenSSL and no aws-lc-rs (no C toolchain at build time). Limits: private keys must be
//! unencrypted PEM (PKCS#8, PKCS#1 or SEC1); certificate revocation lists are not read.

use crate::{Error, Result};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod explain;
pub use explain::{Failure, Problem, explain, presented_names};

/// The crypto provider every TLS connection of sluice uses (ring).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Install ring as the process-wide default provider, for libraries that build their TLS
/// configuration with `ClientConfig::builder()` (the MySQL driver, object-store clients).
/// Installing twice is harmless.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Encrypt only: any certificate is accepted (libpq `require`, MySQL `REQUIRED`). Protects
    /// against eavesdropping, not against a server impersonating the real one.
    None,
    /// The certificate must chain to a trusted CA; its host names are not checked (libpq
    /// `verify-ca`, MySQL `VERIFY_CA`).
    Chain,
    /// The chain and the host name the client connected to (libpq `verify-full`, MySQL
    /// `VERIFY_IDENTITY`).
    Full,
}

/// Where trusted CA certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roots {
    /// A PEM file of one or more CA certificates.
    File(PathBuf),
    /// The operating system's trust store.
    System,
}

impl std::fmt::Display for Roots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Roots::File(p) => write!(f, "{}", p.display()),
            Roots::System => f.write_str("the system's trust store"),
        }
    }
}

/// Load trusted CAs. `option` is the user-facing option name (`sslrootcert`, `ssl-ca`), used
/// in messages.
pub fn load_roots(roots: &Roots, option: &str) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            let bytes = std::fs::read(path).map_err(|e| {
                Error::config(format!(
                    "cannot read the CA certificate file {option}={}: {e}. Point {option} at the \
                     PEM file of the certificate authority that signed the server's certificate.",
                    path.display()
                ))
            })?;
            let mut bad = 0usize;
            for cert in CertificateDer::pem_slice_iter(&bytes) {
                match cert
                    .map_err(|_| ())
                    .and_then(|c| store.add(c).map_err(|_| ()))
                {
                    Ok(()) => {}
                    Err(()) => bad += 1,
                }
            }
            if store.is_empty() {
                return Err(Error::config(format!(
                    "the CA certificate file {option}={} holds no usable PEM certificate \
                     (-----BEGIN CERTIFICATE-----){}. Point {option} at the PEM file of the \
                     certificate authority that signed the server's certificate.",
                    path.display(),
                    if bad > 0 {
                        format!("; {bad} could not be parsed")
                    } else {
                        String::new()
                    }
                )));
            }
        }
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                return Err(Error::config(format!(
                    "{option}=system found no trusted CA certificates in the system's trust store \
                     (on Debian and Ubuntu: install the ca-certificates package, or set \
                     SSL_CERT_FILE). Or point {option} at a CA certificate file."
                )));
            }
        }
    }
    Ok(store)
}

/// A client certificate chain and its private key. `Debug` never shows the key.
#[derive(Clone)]
pub struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("certificates", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// Names of the options that point at a client certificate and its key, for messages.
#[derive(Debug, Clone, Copy)]
pub struct IdentityOptions<'a> {
    /// The certificate option (`sslcert`, `ssl-cert`).
    pub cert: &'a str,
    /// The key option (`sslkey`, `ssl-key`).
    pub key: &'a str,
    /// Refuse a key file others can read, as libpq does (MySQL clients do not check).
    pub check_key_permissions: bool,
}

/// Load a client certificate (PEM chain) and its private key (unencrypted PEM). Messages name
/// the files, never their content.
pub fn load_identity(cert: &Path, key: &Path, opts: IdentityOptions<'_>) -> Result<Identity> {
    let cert_bytes = std::fs::read(cert).map_err(|e| {
        Error::config(format!(
            "cannot read the client certificate {}={}: {e}.",
            opts.cert,
            cert.display()
        ))
    })?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_bytes)
        .filter_map(|c| c.ok())
        .collect();
    if chain.is_empty() {
        return Err(Error::config(format!(
            "the client certificate file {}={} holds no PEM certificate \
             (-----BEGIN CERTIFICATE-----).",
            opts.cert,
            cert.display()
        )));
    }
    if opts.check_key_permissions {
        check_key_permissions(key, opts.key)?;
    }
    let key_bytes = std::fs::read(key).map_err(|e| {
        Error::config(format!(
            "cannot read the private key {}={}: {e}.",
            opts.key,
            key.display()
        ))
    })?;
    let private = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|_| {
        let encrypted = key_bytes
            .windows(b"ENCRYPTED".len())
            .any(|w| w == b"ENCRYPTED");
        Error::config(if encrypted {
            format!(
                "the private key {}={} is encrypted with a passphrase, which sluice cannot \
                 read: write an unencrypted copy readable only by you (openssl pkey -in KEY \
                 -out KEY.plain; chmod 600 KEY.plain) and point {} at it.",
                opts.key,
                key.display(),
                opts.key
            )
        } else {
            format!(
                "the private key file {}={} holds no PEM private key (-----BEGIN PRIVATE \
                 KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY).",
                opts.key,
                key.display()
            )
        })
    })?;
    Ok(Identity {
        chain,
        key: Arc::new(private),
    })
}

/// libpq's rule for private key files: a regular file, with no group or world access when the
/// current user owns it (0600 or less), or at most group read when root owns it (0640).
pub fn check_key_permissions(path: &Path, option: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| {
        Error::config(format!(
            "cannot read the private key {option}={}: {e}.",
            path.display()
        ))
    })?;
    if !meta.is_file() {
        return Err(Error::config(format!(
            "the private key {option}={} is not a regular file.",
            path.display()
        )));
    }
    let mode = meta.mode();
    let mine = meta.uid() == crate::tls::euid();
    let too_open = (mine && mode & 0o077 != 0) || (meta.uid() == 0 && mode & 0o037 != 0);
    if too_open {
        return Err(Error::config(format!(
            "the private key {option}={} has group or world access (mode {:04o}); it must have \
             permissions u=rw (0600) or less if owned by the current user, or u=rw,g=r (0640) or \
             less if owned by root. Fix it with chmod 600 {}.",
            path.display(),
            mode & 0o7777,
            path.display()
        )));
    }
    Ok(())
}

/// The effective user id of this process.
#[allow(unsafe_code)]
pub fn euid() -> u32 {
    // SAFETY: geteuid() takes no arguments, cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Build a client configuration. `roots` is needed for [`Verify::Chain`] and [`Verify::Full`];
/// `alpn` lists the protocols to offer (PostgreSQL's direct TLS needs `postgresql`).
pub fn client_config(
    verify: Verify,
    roots: Option<RootCertStore>,
    identity: Option<&Identity>,
    alpn: &[&[u8]],
) -> Result<ClientConfig> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::internal(format!("TLS protocol versions: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match (verify, roots) {
        (Verify::None, _) => Arc::new(Relaxed {
            algorithms: provider.signature_verification_algorithms,
            chain: None,
        }),
        (level, Some(roots)) => {
            let algorithms = provider.signature_verification_algorithms;
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| Error::config(format!("the trusted CA certificates: {e}")))?;
            if level == Verify::Chain {
                Arc::new(Relaxed {
                    algorithms,
                    chain: Some(webpki),
                })
            } else {
                webpki
            }
        }
        (_, None) => {
            return Err(Error::internal(
                "certificate verification was asked for without trusted CAs",
            ));
        }
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match identity {
        Some(id) => builder
            .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
            .map_err(|e| {
                Error::config(format!(
                    "the client certificate and private key cannot be used together: {e}. \
                     Check that the key is the one the certificate was issued for."
                ))
            })?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The two verifications weaker than the WebPKI default. Either way the server must prove it
/// holds the certificate's key (the handshake signature is checked with the provider's
/// algorithms, as the WebPKI verifier does), so the session is encrypted end to end with
/// whoever answered.
#[derive(Debug)]
struct Relaxed {
    algorithms: WebPkiSupportedAlgorithms,
    /// `None`: any server certificate is accepted. `Some`: the chain is verified (trust,
    /// validity dates, key usage) but not the host name; the WebPKI verifier checks the chain
    /// before the name, so a name error means the chain was good.
    chain: Option<Arc<WebPkiServerVerifier>>,
}

impl ServerCertVerifier for Relaxed {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(webpki) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::explain::describe;
    use super::*;

    /// A CA and a leaf certificate for `name` signed by it, expired if asked.
    fn chain(name: &str, expired: bool) -> (RootCertStore, CertificateDer<'static>) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, format!("CA for {name}"));
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::new(vec![name.to_string()]).unwrap();
        if expired {
            leaf.not_before = rcgen::date_time_ymd(2001, 1, 1);
            leaf.not_after = rcgen::date_time_ymd(2002, 1, 1);
        }
        let leaf = leaf.signed_by(&key, &issuer).unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(ca_cert.der().clone()).unwrap();
        (roots, leaf.der().clone())
    }

    fn verify(
        level: Verify,
        roots: RootCertStore,
        leaf: &CertificateDer<'_>,
        host: &str,
    ) -> std::result::Result<(), Failure> {
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .unwrap();
        let v: Arc<dyn ServerCertVerifier> = match level {
            Verify::Chain => Arc::new(Relaxed {
                algorithms: provider().signature_verification_algorithms,
                chain: Some(webpki),
            }),
            _ => webpki,
        };
        let name = ServerName::try_from(host.to_string()).unwrap();
        v.verify_server_cert(leaf, &[], &name, &[], UnixTime::now())
            .map(|_| ())
            .map_err(|e| describe(&e))
    }

    #[test]
    fn certificate_problems_are_named() {
        let (roots, leaf) = chain("db.example", true);
        let f = verify(Verify::Full, roots, &leaf, "db.example").unwrap_err();
        assert_eq!(f.problem, Problem::Validity);
        assert!(
            f.text.contains("expired") && f.text.contains("2002-01-01"),
            "{}",
            f.text
        );

        let (roots, leaf) = chain("db.example", false);
        let f = verify(Verify::Full, roots.clone(), &leaf, "other.example").unwrap_err();
        assert_eq!(
            f.problem,
            Problem::NameMismatch {
                expected: "other.example".into(),
                presented: vec!["db.example".into()],
            }
        );
        assert!(f.text.contains("host name mismatch"), "{}", f.text);
        // verify-ca accepts the name mismatch, not an unknown CA.
        verify(Verify::Chain, roots, &leaf, "other.example").unwrap();
        let (other_roots, _) = chain("x", false);
        let f = verify(Verify::Chain, other_roots, &leaf, "db.example").unwrap_err();
        assert_eq!(f.problem, Problem::UnknownCa);
    }

    #[test]
    fn world_readable_keys_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join("k.pem");
        std::fs::write(&key, "not a key").expect("write");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = check_key_permissions(&key, "sslkey").unwrap_err();
        assert!(e.to_string().contains("group or world access"), "{e}");
        assert!(!e.to_string().contains("not a key"));
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        check_key_permissions(&key, "sslkey").expect("0600 is fine");
    }
}
