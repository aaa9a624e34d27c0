//! Naming the problem of a refused TLS handshake: which of the few things a user can fix
//! (an unknown CA, a host name the certificate does not hold, a validity period, a refused
//! client certificate) a rustls error means, in one sentence without the fix, which each
//! adapter words with its own option names.

use rustls::{AlertDescription, CertificateError};

/// What a failed TLS handshake was about, so an adapter can word the fix with its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The server's certificate does not chain to a trusted CA.
    UnknownCa,
    /// The certificate is valid, but not for the host name connected to.
    NameMismatch {
        /// The host name (or address) sluice connected to.
        expected: String,
        /// The names the certificate holds.
        presented: Vec<String>,
    },
    /// The server's certificate (or one in its chain) has expired or is not valid yet.
    Validity,
    /// Any other certificate defect (revoked, bad signature, wrong key usage).
    BadCertificate,
    /// The server refused the handshake; usually our client certificate (or its absence).
    ServerRefused,
    /// Anything else (protocol or version mismatch, a closed connection).
    Other,
}

/// A failed handshake, explained.
#[derive(Debug, Clone)]
pub struct Failure {
    /// What kind of problem it is.
    pub problem: Problem,
    /// One sentence naming the problem, without a fix.
    pub text: String,
}

/// Find a rustls error in `err` or its sources (also inside `std::io::Error`s, whose `source`
/// skips the error they wrap) and explain it.
pub fn explain(err: &(dyn std::error::Error + 'static)) -> Option<Failure> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(describe(r));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(found) = explain(inner)
        {
            return Some(found);
        }
        next = e.source();
    }
    None
}

fn date(secs: u64) -> String {
    chrono::DateTime::from_timestamp(i64::try_from(secs).unwrap_or(i64::MAX), 0)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| format!("{secs} s after 1970"))
}

/// `DnsName("db.example")` / `IpAddress(10.0.0.1)` (as the verifier reports them) → the name.
fn clean_name(presented: &str) -> String {
    let inner = presented
        .split_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .unwrap_or(presented);
    inner.trim_matches('"').to_string()
}

/// The names a name-mismatch error says the certificate holds, ready to connect with.
pub fn presented_names(problem: &Problem) -> Vec<String> {
    match problem {
        Problem::NameMismatch { presented, .. } => presented.clone(),
        _ => Vec::new(),
    }
}

/// Name the problem of one rustls error (see [`explain`]).
pub(super) fn describe(err: &rustls::Error) -> Failure {
    use CertificateError as C;
    let (problem, text) = match err {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => (
                Problem::UnknownCa,
                "the server's certificate is not signed by a trusted certificate authority \
                 (unknown CA)"
                    .to_string(),
            ),
            C::NotValidForNameContext {
                expected,
                presented,
            } => {
                let names: Vec<String> = presented.iter().map(|p| clean_name(p)).collect();
                let expected = expected.to_str().into_owned();
                let text = format!(
                    "the server's certificate does not match the host name {expected:?} (host \
                     name mismatch): it is valid for {}",
                    if names.is_empty() {
                        "no host name at all".to_string()
                    } else {
                        names.join(", ")
                    }
                );
                (
                    Problem::NameMismatch {
                        expected,
                        presented: names,
                    },
                    text,
                )
            }
            C::NotValidForName => (
                Problem::NameMismatch {
                    expected: String::new(),
                    presented: Vec::new(),
                },
                "the server's certificate does not match the host name connected to (host name \
                 mismatch)"
                    .to_string(),
            ),
            C::ExpiredContext { not_after, .. } => (
                Problem::Validity,
                format!(
                    "the server's certificate has expired (it was valid until {})",
                    date(not_after.as_secs())
                ),
            ),
            C::Expired => (
                Problem::Validity,
                "the server's certificate has expired".to_string(),
            ),
            C::NotValidYetContext { not_before, .. } => (
                Problem::Validity,
                format!(
                    "the server's certificate is not valid yet (it is valid from {}; check this \
                     machine's clock)",
                    date(not_before.as_secs())
                ),
            ),
            C::NotValidYet => (
                Problem::Validity,
                "the server's certificate is not valid yet (check this machine's clock)"
                    .to_string(),
            ),
            C::Revoked => (
                Problem::BadCertificate,
                "the server's certificate has been revoked".to_string(),
            ),
            C::InvalidPurpose | C::InvalidPurposeContext { .. } => (
                Problem::BadCertificate,
                "the server's certificate is not issued for a TLS server (extended key usage)"
                    .to_string(),
            ),
            other => (
                Problem::BadCertificate,
                format!("the server's certificate was refused: {other}"),
            ),
        },
        rustls::Error::AlertReceived(alert) => {
            let about = match alert {
                AlertDescription::CertificateRequired => {
                    "it requires a client certificate and none was sent"
                }
                AlertDescription::UnknownCA => {
                    "it does not trust the CA that signed our client certificate"
                }
                AlertDescription::BadCertificate
                | AlertDescription::UnsupportedCertificate
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateRevoked
                | AlertDescription::CertificateUnknown => "it refused our client certificate",
                AlertDescription::ProtocolVersion | AlertDescription::HandshakeFailure => {
                    "no TLS version or cipher suite is acceptable to both sides"
                }
                _ => "see the server's log",
            };
            (
                Problem::ServerRefused,
                format!("the server refused the TLS handshake ({alert:?} alert): {about}"),
            )
        }
        other => (Problem::Other, format!("the TLS handshake failed: {other}")),
    };
    Failure { problem, text }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_cleaned() {
        assert_eq!(clean_name("DnsName(\"db.example\")"), "db.example");
        assert_eq!(clean_name("IpAddress(127.0.0.1)"), "127.0.0.1");
    }

    #[test]
    fn explains_wrapped_errors() {
        let inner = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, inner);
        let f = explain(&io).expect("found");
        assert_eq!(f.problem, Problem::UnknownCa);
        assert!(f.text.contains("unknown CA"), "{}", f.text);
    }
}
