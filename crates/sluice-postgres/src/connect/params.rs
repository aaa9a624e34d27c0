//! libpq's connection parameters: the URL, the `PG*` environment variables, `~/.pgpass`.
//!
//! Users script against libpq's conventions (psql, pg_dump), so a URL or environment that
//! works there means the same here: `postgres://[user[:password]@][host[:port][,…]][/dbname]
//! [?param=value&…]` with percent-encoded parts, host lists, Unix-socket directories as hosts
//! (`host=/var/run/postgresql`, or percent-encoded in the authority), a parameter given in the
//! URL overriding its environment variable, and the environment overriding libpq's defaults.
//! Parameters libpq has but sluice does not implement (GSSAPI, CRLs, service files, key
//! passphrases) are refused by name rather than ignored.

use sluice_core::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The URL query parameters (libpq keywords) sluice accepts.
pub const KEYWORDS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "connect_timeout",
    "application_name",
    "fallback_application_name",
    "options",
    "sslmode",
    "ssl",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslnegotiation",
    "sslsni",
    "target_session_attrs",
    "channel_binding",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "gssencmode",
    "load_balance_hosts",
];

/// Environment variables and the keyword each one defaults.
const ENV: &[(&str, &str)] = &[
    ("PGHOST", "host"),
    ("PGHOSTADDR", "hostaddr"),
    ("PGPORT", "port"),
    ("PGDATABASE", "dbname"),
    ("PGUSER", "user"),
    ("PGPASSWORD", "password"),
    ("PGPASSFILE", "passfile"),
    ("PGOPTIONS", "options"),
    ("PGAPPNAME", "application_name"),
    ("PGSSLMODE", "sslmode"),
    ("PGSSLROOTCERT", "sslrootcert"),
    ("PGSSLCERT", "sslcert"),
    ("PGSSLKEY", "sslkey"),
    ("PGSSLNEGOTIATION", "sslnegotiation"),
    ("PGSSLSNI", "sslsni"),
    ("PGCONNECT_TIMEOUT", "connect_timeout"),
    ("PGTARGETSESSIONATTRS", "target_session_attrs"),
    ("PGCHANNELBINDING", "channel_binding"),
    ("PGGSSENCMODE", "gssencmode"),
    ("PGLOADBALANCEHOSTS", "load_balance_hosts"),
];

/// Where libpq's defaults and the environment come from; tests pass their own.
pub struct Env<'a> {
    /// Reads an environment variable.
    pub var: &'a dyn Fn(&str) -> Option<String>,
    /// The home directory (`~/.pgpass`, `~/.postgresql/`).
    pub home: Option<PathBuf>,
}

impl Env<'static> {
    /// The process environment.
    pub fn process() -> Env<'static> {
        Env {
            var: &|k| std::env::var(k).ok().filter(|v| !v.is_empty()),
            home: std::env::var_os("HOME").map(PathBuf::from),
        }
    }
}

/// The URL split into libpq keywords, with the environment applied: the first stage of
/// [`super::PgParams`]. Keys are libpq keywords; every value is decoded.
#[derive(Clone, Default)]
pub struct Keywords {
    values: BTreeMap<String, String>,
}

impl std::fmt::Debug for Keywords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password.
        f.debug_list()
            .entries(self.values.keys().filter(|k| *k != "password"))
            .finish()
    }
}

impl Keywords {
    /// A keyword's value.
    pub fn get(&self, k: &str) -> Option<&str> {
        self.values.get(k).map(String::as_str)
    }

    /// True when the URL or the environment set `k`.
    pub fn is_set(&self, k: &str) -> bool {
        self.values.contains_key(k)
    }
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Parse a `postgres://` or `postgresql://` URL into keywords, then fill unset ones from the
/// environment. `bad` builds the error for a malformed URL from a reason.
pub fn keywords(url: &str, env: &Env<'_>, bad: &dyn Fn(&str) -> Error) -> Result<Keywords> {
    let rest = url
        .strip_prefix("postgresql://")
        .or_else(|| url.strip_prefix("postgres://"))
        .ok_or_else(|| bad("is not a PostgreSQL URL: it must start with postgres://"))?;
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let mut kw = Keywords::default();
    let set = |kw: &mut Keywords, k: &str, v: String| {
        kw.values.insert(k.to_string(), v);
    };
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    if let Some(ui) = userinfo {
        let (u, p) = match ui.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (ui, None),
        };
        if !u.is_empty() {
            set(&mut kw, "user", decode(u));
        }
        if let Some(p) = p {
            set(&mut kw, "password", decode(p));
        }
    }
    if !hostlist.is_empty() {
        let mut hosts = Vec::new();
        let mut ports = Vec::new();
        for spec in hostlist.split(',') {
            let (host, port) = if let Some(v6) = spec.strip_prefix('[') {
                let (h, after) = v6
                    .split_once(']')
                    .ok_or_else(|| bad("has an IPv6 address without its closing ]"))?;
                (h, after.strip_prefix(':'))
            } else {
                match spec.rsplit_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (spec, None),
                }
            };
            hosts.push(decode(host));
            ports.push(port.map(decode).unwrap_or_default());
        }
        if hosts.iter().any(|h| !h.is_empty()) {
            set(&mut kw, "host", hosts.join(","));
        }
        if ports.iter().any(|p| !p.is_empty()) {
            set(&mut kw, "port", ports.join(","));
        }
    }
    if let Some(db) = path
        && !db.is_empty()
    {
        set(&mut kw, "dbname", decode(db));
    }
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = decode(k);
        let v = decode(v);
        if !KEYWORDS.contains(&k.as_str()) {
            return Err(bad(&format!(
                "has the parameter {k:?}, which sluice does not support (it accepts {})",
                KEYWORDS.join(", ")
            )));
        }
        // JDBC's ssl=true, which libpq accepts in URLs as sslmode=require.
        if k == "ssl" {
            if v == "true" {
                set(&mut kw, "sslmode", "require".into());
                continue;
            }
            return Err(bad(&format!("has ssl={v:?}; only ssl=true is accepted")));
        }
        set(&mut kw, &k, v);
    }
    for (var, k) in ENV {
        if !kw.values.contains_key(*k)
            && let Some(v) = (env.var)(var)
        {
            kw.values.insert((*k).to_string(), v);
        }
    }
    Ok(kw)
}

/// The password for `host:port/dbname` as `user` from a libpq password file, with libpq's
/// checks: the file must be a regular file without group or world access, else it is ignored
/// with a warning. Unix-socket hosts match the entry `localhost`.
pub fn pgpass(path: &Path, host: &str, port: u16, dbname: &str, user: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        tracing::warn!(
            "password file {} is not a plain file; it is ignored",
            path.display()
        );
        return None;
    }
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(
            "password file {} has group or world access; permissions should be u=rw (0600) or \
             less. It is ignored (as libpq does): chmod 600 {}",
            path.display(),
            path.display()
        );
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let host = if host.starts_with('/') || host.is_empty() {
        "localhost"
    } else {
        host
    };
    let port = port.to_string();
    let wanted = [host, port.as_str(), dbname, user];
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_pgpass(line);
        if fields.len() < 5 {
            continue;
        }
        if fields[..4]
            .iter()
            .zip(wanted)
            .all(|(f, w)| f == "*" || f == w)
        {
            return Some(fields[4..].join(":"));
        }
    }
    None
}

/// Split a password-file line at unescaped colons, removing the backslash escapes.
fn split_pgpass(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next()
                    && let Some(last) = fields.last_mut()
                {
                    last.push(n);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                if let Some(last) = fields.last_mut() {
                    last.push(c);
                }
            }
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str, vars: &[(&str, &str)]) -> Result<Keywords> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lookup = move |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let env = Env {
            var: &lookup,
            home: None,
        };
        keywords(url, &env, &|why| Error::config(why.to_string()))
    }

    #[test]
    fn url_forms() {
        let k = parse(
            "postgres://u:p%40ss@h1:5433,h2,[::1]:5434/my%20db?sslmode=verify-full",
            &[],
        )
        .unwrap();
        assert_eq!(k.get("user"), Some("u"));
        assert_eq!(k.get("password"), Some("p@ss"));
        assert_eq!(k.get("host"), Some("h1,h2,::1"));
        assert_eq!(k.get("port"), Some("5433,,5434"));
        assert_eq!(k.get("dbname"), Some("my db"));
        assert_eq!(k.get("sslmode"), Some("verify-full"));
        let k = parse("postgres:///db?host=/var/run/postgresql", &[]).unwrap();
        assert_eq!(k.get("host"), Some("/var/run/postgresql"));
        let k = parse("postgresql://%2Ftmp%2Fpg/db", &[]).unwrap();
        assert_eq!(k.get("host"), Some("/tmp/pg"));
        let k = parse("postgres://h/db?ssl=true", &[]).unwrap();
        assert_eq!(k.get("sslmode"), Some("require"));
        let e = parse("postgres://h/db?sslcrl=x", &[]).unwrap_err();
        assert!(e.to_string().contains("sslcrl"), "{e}");
    }

    #[test]
    fn url_overrides_environment() {
        let env = [
            ("PGHOST", "envhost"),
            ("PGPORT", "6000"),
            ("PGUSER", "envuser"),
            ("PGDATABASE", "envdb"),
            ("PGSSLMODE", "require"),
            ("PGAPPNAME", "nightly"),
        ];
        let k = parse("postgres:///?sslmode=disable", &env).unwrap();
        assert_eq!(k.get("host"), Some("envhost"));
        assert_eq!(k.get("port"), Some("6000"));
        assert_eq!(k.get("user"), Some("envuser"));
        assert_eq!(k.get("dbname"), Some("envdb"));
        assert_eq!(k.get("sslmode"), Some("disable"));
        assert_eq!(k.get("application_name"), Some("nightly"));
    }

    #[test]
    fn password_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pgpass");
        std::fs::write(
            &f,
            "# comment\nother:*:*:*:no\nlocalhost:5432:*:app:sock\\:pw\n*:*:shop:*:any\n",
        )
        .unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            pgpass(&f, "/var/run/postgresql", 5432, "x", "app").as_deref(),
            Some("sock:pw")
        );
        assert_eq!(
            pgpass(&f, "db.example", 1, "shop", "u").as_deref(),
            Some("any")
        );
        assert_eq!(pgpass(&f, "db.example", 1, "other", "u"), None);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(pgpass(&f, "db.example", 1, "shop", "u"), None);
    }
}
