//! Keeping secrets out of messages and logs.
//!
//! Every URL that reaches a message, a log line, a report or a manifest goes through
//! [`redact_url`] first. [`scrub`] is the second line of defence for text that came from
//! elsewhere (a driver error) and might echo a secret we know.

/// The placeholder shown instead of a secret.
pub const REDACTED: &str = "***";

/// The `Debug` form of a handle on a server (a change source, a target): `name { target: …,
/// .. }`, where it points (the target's own `Debug`, which redacts) and nothing of the
/// sessions or secrets it holds.
pub fn debug_handle(
    f: &mut std::fmt::Formatter<'_>,
    name: &str,
    target: &dyn std::fmt::Debug,
) -> std::fmt::Result {
    f.debug_struct(name)
        .field("target", target)
        .finish_non_exhaustive()
}

/// Return `url` with any password replaced by `***`.
///
/// Works for `scheme://user:pass@host/...` URLs and for libpq-style `key=value` strings
/// (`password=...`). Query parameters whose name suggests a secret (`password`, `secret`,
/// `token`, `key`, `sig`) are redacted too. Text that is neither is returned unchanged.
pub fn redact_url(url: &str) -> String {
    if let Ok(mut parsed) = url::Url::parse(url) {
        if parsed.password().is_some() {
            // set_password only fails for URLs that cannot have credentials; then nothing to hide.
            let _ = parsed.set_password(Some(REDACTED));
        }
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let secret = is_secret_name(&k);
                (
                    k.into_owned(),
                    if secret {
                        REDACTED.to_string()
                    } else {
                        v.into_owned()
                    },
                )
            })
            .collect();
        if !pairs.is_empty() {
            parsed.query_pairs_mut().clear().extend_pairs(pairs);
        }
        return parsed.to_string();
    }
    // Not a valid URL but shaped like one (`scheme://user:secret@host…`, e.g. a bad port):
    // redact the userinfo's password by position, so a malformed URL never leaks.
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            let userinfo = &rest[..at];
            if let Some(colon) = userinfo.find(':') {
                return format!(
                    "{}{}:{REDACTED}{}",
                    &url[..scheme_end + 3],
                    &userinfo[..colon],
                    &rest[at..]
                );
            }
        }
        return url.to_string();
    }
    // libpq key=value form.
    url.split_whitespace()
        .map(|part| match part.split_once('=') {
            Some((k, _)) if is_secret_name(k) => format!("{k}={REDACTED}"),
            _ => part.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["password", "passwd", "secret", "token", "sig", "key"]
        .iter()
        .any(|s| n.contains(s))
}

/// Replace every occurrence of `secret` in `text` by `***`. Empty secrets change nothing.
pub fn scrub(text: &str, secret: Option<&str>) -> String {
    match secret {
        Some(s) if !s.is_empty() => text.replace(s, REDACTED),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_password_is_hidden() {
        let r = redact_url("postgres://alice:s3cr%40t@db.example:5432/app?sslmode=require");
        assert!(!r.contains("s3cr"), "{r}");
        assert!(r.contains("alice:***@db.example:5432/app"), "{r}");
        assert!(r.contains("sslmode=require"), "{r}");
    }

    #[test]
    fn malformed_url_password_is_hidden() {
        let r = redact_url("postgres://u:p@ss:w@rd@host:notaport/db");
        assert_eq!(r, "postgres://u:***@host:notaport/db");
        assert_eq!(redact_url("postgres://host:x/db"), "postgres://host:x/db");
    }

    #[test]
    fn query_secret_is_hidden() {
        let r = redact_url("s3://bucket/p?aws_secret_access_key=abc&region=x");
        assert!(!r.contains("abc"), "{r}");
        assert!(r.contains("region=x"));
    }

    #[test]
    fn keyvalue_password_is_hidden() {
        let r = redact_url("host=h user=u password=hunter2 dbname=d");
        assert_eq!(r, "host=h user=u password=*** dbname=d");
    }

    #[test]
    fn scrub_removes_known_secret() {
        assert_eq!(
            scrub("auth failed for hunter2", Some("hunter2")),
            "auth failed for ***"
        );
        assert_eq!(scrub("x", Some("")), "x");
    }
}
