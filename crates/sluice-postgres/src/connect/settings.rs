//! From libpq keywords to resolved parameters: the host list, `sslmode` and the certificate
//! options (read and checked here, so a bad path fails before any connection), timeouts and
//! session attributes.
//!
//! Length: about 450 lines of code plus the unit tests of every keyword: one table of libpq
//! keywords and the checks that make a bad value fail before any connection.

use super::SESSION_OPTIONS;
use super::params::{self, Env};
use sluice_core::tls::{self as core_tls, Roots, Verify};
use sluice_core::{Error, Result};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio_postgres::Config;
use tokio_postgres::config::{
    ChannelBinding, SslMode as DriverSsl, SslNegotiation, TargetSessionAttrs,
};

/// The `application_name` of sessions when neither the URL nor `PGAPPNAME` names one.
pub const DEFAULT_APPLICATION_NAME: &str = "sluice";

/// How long connecting to one host may take when `connect_timeout` is not given.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// Plaintext first; TLS if the server refuses it.
    Allow,
    /// TLS if the server offers it (the default).
    Prefer,
    /// Always TLS; the certificate is not verified (unless a root certificate file exists).
    Require,
    /// Always TLS; the certificate must chain to a trusted CA.
    VerifyCa,
    /// Always TLS; the certificate must chain to a trusted CA and match the host name.
    VerifyFull,
}

impl SslMode {
    /// Parse libpq's spelling.
    pub fn parse(v: &str) -> Option<SslMode> {
        Some(match v {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// The libpq spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// One host of the host list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgHost {
    /// A host name or address (also the name a certificate is checked against).
    Tcp(String),
    /// A directory holding the server's Unix socket.
    Unix(PathBuf),
}

/// One entry of the host list: where to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSpec {
    /// The host.
    pub host: PgHost,
    /// `hostaddr`: the address to connect to instead of resolving the host name.
    pub hostaddr: Option<IpAddr>,
    /// The port (also the Unix socket's file name suffix).
    pub port: u16,
}

impl HostSpec {
    /// The host as libpq writes it (a name, an address or a socket directory).
    pub fn host_str(&self) -> String {
        match &self.host {
            PgHost::Tcp(h) => h.clone(),
            PgHost::Unix(p) => p.display().to_string(),
        }
    }
}

/// The resolved connection parameters: what every session, the cancel request and (later) a
/// replication connection connect with. The password is kept private; [`Self::password_for`]
/// gives it per host, as `~/.pgpass` entries are per host.
#[derive(Clone)]
pub struct PgParams {
    /// Hosts, tried in order (or shuffled with `load_balance_hosts=random`).
    pub hosts: Vec<HostSpec>,
    /// The user name.
    pub user: String,
    password: Option<String>,
    passfile: Option<PathBuf>,
    /// The database.
    pub dbname: String,
    /// `application_name` of every session.
    pub application_name: String,
    /// `options` from the URL or `PGOPTIONS` (sluice's session settings are added to them).
    pub options: Option<String>,
    /// Row-level security applies to the sessions (`--enable-row-security`); otherwise they
    /// run with `row_security = off`, as pg_dump's do.
    pub row_security: bool,
    /// Per-host connect timeout; `None` waits as long as the network does.
    pub connect_timeout: Option<Duration>,
    /// `sslmode`.
    pub sslmode: SslMode,
    /// `sslnegotiation=direct`.
    pub direct_tls: bool,
    /// How far the server certificate is verified when TLS is used.
    pub verify: Verify,
    /// The trusted CAs in use, if any.
    pub sslrootcert: Option<Roots>,
    /// The client certificate in use, if any.
    pub sslcert: Option<PathBuf>,
    /// `target_session_attrs`.
    pub target_session_attrs: TargetSessionAttrs,
    channel_binding: ChannelBinding,
    /// `load_balance_hosts=random`: try the hosts in random order.
    pub load_balance: bool,
    keepalives: Option<bool>,
    keepalives_idle: Option<Duration>,
    keepalives_interval: Option<Duration>,
    keepalives_count: Option<u32>,
    tcp_user_timeout: Option<Duration>,
}

impl std::fmt::Debug for PgParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgParams")
            .field("hosts", &self.hosts)
            .field("user", &self.user)
            .field("dbname", &self.dbname)
            .field("sslmode", &self.sslmode)
            .finish_non_exhaustive()
    }
}

impl PgParams {
    /// The password for `host`: the URL's, else `PGPASSWORD`, else the password file's entry.
    pub fn password_for(&self, host: &HostSpec) -> Option<String> {
        self.password.clone().or_else(|| {
            let file = self.passfile.as_ref()?;
            params::pgpass(file, &host.host_str(), host.port, &self.dbname, &self.user)
        })
    }

    /// `channel_binding`: whether SCRAM binds the TLS session (the replication session
    /// implements it itself; the driver's sessions get it through [`Self::driver_config`]).
    pub fn channel_binding(&self) -> ChannelBinding {
        self.channel_binding
    }

    /// The password file consulted, for messages.
    pub fn passfile_display(&self) -> String {
        self.passfile
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "~/.pgpass".into())
    }

    /// A driver configuration for one host, with sluice's session settings and `ssl` as the
    /// driver's TLS mode (the caller decides it from [`Self::sslmode`] and its fallbacks).
    pub fn driver_config(&self, host: &HostSpec, ssl: DriverSsl) -> Config {
        let mut c = Config::new();
        match &host.host {
            PgHost::Tcp(h) => c.host(h),
            PgHost::Unix(p) => c.host_path(p),
        };
        if let Some(a) = host.hostaddr {
            c.hostaddr(a);
        }
        c.port(host.port)
            .user(&self.user)
            .dbname(&self.dbname)
            .application_name(&self.application_name)
            .ssl_mode(ssl)
            .ssl_negotiation(if self.direct_tls {
                SslNegotiation::Direct
            } else {
                SslNegotiation::Postgres
            })
            .target_session_attrs(self.target_session_attrs)
            .channel_binding(self.channel_binding)
            .options(&{
                let mut o = match &self.options {
                    Some(o) => format!("{o} {SESSION_OPTIONS}"),
                    None => SESSION_OPTIONS.to_string(),
                };
                if self.row_security {
                    // Later settings win: this undoes SESSION_OPTIONS' `row_security=off`.
                    o.push_str(" -c row_security=on");
                }
                o
            });
        if let Some(pw) = self.password_for(host) {
            c.password(pw);
        }
        if let Some(t) = self.connect_timeout {
            c.connect_timeout(t);
        }
        if let Some(k) = self.keepalives {
            c.keepalives(k);
        }
        if let Some(d) = self.keepalives_idle {
            c.keepalives_idle(d);
        }
        if let Some(d) = self.keepalives_interval {
            c.keepalives_interval(d);
        }
        if let Some(n) = self.keepalives_count {
            c.keepalives_retries(n);
        }
        if let Some(d) = self.tcp_user_timeout {
            c.tcp_user_timeout(d);
        }
        c
    }
}

pub(super) fn home_file(env: &Env<'_>, name: &str) -> Option<PathBuf> {
    env.home.as_ref().map(|h| h.join(name))
}

/// Resolve keywords into parameters and the TLS client configuration they ask for. `opt`
/// words an error about one option.
pub(super) fn resolve(
    kw: &params::Keywords,
    env: &Env<'_>,
    opt: &dyn Fn(String) -> Error,
) -> Result<(PgParams, rustls::ClientConfig)> {
    let user = match kw.get("user") {
        Some(u) => u.to_string(),
        None => std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .map_err(|_| {
                opt(
                    "names no user, and none of PGUSER, USER and LOGNAME is set: write \
                     postgres://USER@host/database."
                        .into(),
                )
            })?,
    };
    let dbname = kw.get("dbname").unwrap_or(&user).to_string();
    let hosts = host_list(kw).map_err(|why| {
        opt(format!(
            "cannot be parsed ({why}). Use the form \
             postgres://user[:password]@host[:port]/database, percent-encoding special characters."
        ))
    })?;
    let password = kw.get("password").map(str::to_string);
    let passfile = kw
        .get("passfile")
        .map(PathBuf::from)
        .or_else(|| home_file(env, ".pgpass"));
    let application_name = kw
        .get("application_name")
        .or(kw.get("fallback_application_name"))
        .unwrap_or(DEFAULT_APPLICATION_NAME)
        .to_string();
    let seconds = |k: &str| -> Result<Option<Duration>> {
        kw.get(k)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| opt(format!("{k}={v:?} is not a whole number of seconds.")))
            })
            .transpose()
            .map(|s| s.map(Duration::from_secs))
    };
    // libpq: 0 waits forever, and less than 2 s counts as 2 s.
    let connect_timeout = match seconds("connect_timeout")? {
        None => Some(DEFAULT_CONNECT_TIMEOUT),
        Some(d) if d.is_zero() => None,
        Some(d) => Some(d.max(Duration::from_secs(2))),
    };
    let target_session_attrs = match kw.get("target_session_attrs").unwrap_or("any") {
        "any" => TargetSessionAttrs::Any,
        "read-write" => TargetSessionAttrs::ReadWrite,
        "read-only" => TargetSessionAttrs::ReadOnly,
        other => {
            return Err(opt(format!(
                "target_session_attrs={other:?} is not supported: use any, read-write or \
                 read-only."
            )));
        }
    };
    let channel_binding = match kw.get("channel_binding").unwrap_or("prefer") {
        "disable" => ChannelBinding::Disable,
        "prefer" => ChannelBinding::Prefer,
        "require" => ChannelBinding::Require,
        other => {
            return Err(opt(format!(
                "channel_binding={other:?} is not one of disable, prefer, require."
            )));
        }
    };
    if let Some(g) = kw.get("gssencmode")
        && g != "disable"
        && g != "prefer"
    {
        return Err(opt(format!(
            "gssencmode={g} asks for GSSAPI encryption, which sluice does not support: use \
             TLS (sslmode) instead."
        )));
    }
    let load_balance = match kw.get("load_balance_hosts").unwrap_or("disable") {
        "disable" => false,
        "random" => true,
        other => {
            return Err(opt(format!(
                "load_balance_hosts={other:?} is not one of disable, random."
            )));
        }
    };
    let flag = |k: &str| -> Result<Option<bool>> {
        kw.get(k)
            .map(|v| match v {
                "1" | "true" | "on" | "yes" => Ok(true),
                "0" | "false" | "off" | "no" => Ok(false),
                _ => Err(opt(format!("{k}={v:?} is not 0 or 1."))),
            })
            .transpose()
    };
    let keepalives = flag("keepalives")?;
    let sni = flag("sslsni")?.unwrap_or(true);
    let keepalives_count = kw
        .get("keepalives_count")
        .map(|v| {
            v.parse::<u32>()
                .map_err(|_| opt(format!("keepalives_count={v:?} is not a number.")))
        })
        .transpose()?;
    let tcp_user_timeout = kw
        .get("tcp_user_timeout")
        .map(|v| {
            v.parse::<u64>().map(Duration::from_millis).map_err(|_| {
                opt(format!(
                    "tcp_user_timeout={v:?} is not a number of milliseconds."
                ))
            })
        })
        .transpose()?;
    let tls = super::tls::tls_settings(kw, env, opt)?;
    let mut client_config = core_tls::client_config(
        tls.verify,
        tls.roots_store,
        tls.identity.as_ref(),
        &[b"postgresql"],
    )?;
    client_config.enable_sni = sni;
    let params = PgParams {
        hosts,
        user,
        password,
        passfile,
        dbname,
        application_name,
        options: kw.get("options").map(str::to_string),
        row_security: false,
        connect_timeout,
        sslmode: tls.mode,
        direct_tls: tls.direct,
        verify: tls.verify,
        sslrootcert: tls.roots,
        sslcert: tls.cert,
        target_session_attrs,
        channel_binding,
        load_balance,
        keepalives,
        keepalives_idle: seconds("keepalives_idle")?,
        keepalives_interval: seconds("keepalives_interval")?,
        keepalives_count,
        tcp_user_timeout,
    };
    Ok((params, client_config))
}

/// The host list from `host`, `hostaddr` and `port`, with libpq's defaults.
fn host_list(kw: &params::Keywords) -> std::result::Result<Vec<HostSpec>, String> {
    let split = |k: &str| -> Vec<String> {
        kw.get(k)
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
            .unwrap_or_default()
    };
    let hosts = split("host");
    let addrs = split("hostaddr");
    let ports = split("port");
    let n = hosts.len().max(addrs.len()).max(1);
    if hosts.len() > 1 && !addrs.is_empty() && addrs.len() != hosts.len() {
        return Err(format!(
            "host names {} hosts but hostaddr {} addresses: give one address per host",
            hosts.len(),
            addrs.len()
        ));
    }
    if ports.len() > 1 && ports.len() != n {
        return Err(format!(
            "{n} hosts but {} ports: give one port, or one per host",
            ports.len()
        ));
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let port = match ports.get(i).or(ports.first()).map(String::as_str) {
            None | Some("") => 5432,
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| format!("port {p:?} is not a port number"))?,
        };
        let hostaddr = match addrs.get(i).map(String::as_str) {
            None | Some("") => None,
            Some(a) => Some(
                a.parse::<IpAddr>()
                    .map_err(|_| format!("hostaddr {a:?} is not an IP address"))?,
            ),
        };
        let host = match hosts.get(i).map(String::as_str) {
            Some(h) if h.starts_with('/') => PgHost::Unix(PathBuf::from(h)),
            Some(h) if !h.is_empty() => PgHost::Tcp(h.to_string()),
            _ => match hostaddr {
                Some(a) => PgHost::Tcp(a.to_string()),
                None => PgHost::Unix(default_socket_dir()),
            },
        };
        out.push(HostSpec {
            host,
            hostaddr,
            port,
        });
    }
    Ok(out)
}

/// libpq's default socket directory: Debian's `/var/run/postgresql`, else upstream's `/tmp`.
fn default_socket_dir() -> PathBuf {
    let debian = PathBuf::from("/var/run/postgresql");
    if debian.is_dir() {
        debian
    } else {
        PathBuf::from("/tmp")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::PgTarget;
    use sluice_core::ErrorKind;

    fn parse(url: &str, vars: &[(&str, &str)]) -> Result<PgTarget> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lookup = move |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        PgTarget::parse_with(
            url,
            &Env {
                var: &lookup,
                home: None,
            },
        )
    }

    #[test]
    fn rejects_other_schemes_without_leaking() {
        let e = parse("mysql://u:topsecret@h/db", &[]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(!e.to_string().contains("topsecret"));
    }

    #[test]
    fn database_defaults_like_libpq() {
        let t = parse("postgres://u:topsecret@localhost:5432", &[]).unwrap();
        assert_eq!(t.params().dbname, "u");
        let t = parse("postgres://u@localhost", &[("PGDATABASE", "shop")]).unwrap();
        assert_eq!(t.params().dbname, "shop");
        assert_eq!(t.params().application_name, DEFAULT_APPLICATION_NAME);
        assert_eq!(t.params().sslmode, SslMode::Prefer);
    }

    #[test]
    fn debug_hides_password() {
        let t = parse("postgres://u:topsecret@localhost:5432/db", &[]).unwrap();
        assert!(!format!("{t:?}").contains("topsecret"));
        assert!(!format!("{:?}", t.params()).contains("topsecret"));
        assert_eq!(t.display(), "postgres://u:***@localhost:5432/db");
    }

    #[test]
    fn hosts_ports_and_sockets() {
        let t = parse(
            "postgres://u@a:5433,b/db?target_session_attrs=read-write",
            &[],
        )
        .unwrap();
        let hosts = &t.params().hosts;
        assert_eq!(hosts.len(), 2);
        assert_eq!(hosts[0].port, 5433);
        assert_eq!(hosts[1].port, 5432);
        assert_eq!(
            t.params().target_session_attrs,
            TargetSessionAttrs::ReadWrite
        );
        let t = parse("postgres:///db?host=/run/pg&port=6543", &[("PGUSER", "me")]).unwrap();
        assert_eq!(t.params().hosts[0].host, PgHost::Unix("/run/pg".into()));
        assert_eq!(t.params().hosts[0].port, 6543);
        assert_eq!(t.params().user, "me");
        let e = parse("postgres://u@/db?host=a,b,c&port=1,2", &[]).unwrap_err();
        assert!(e.to_string().contains("ports"), "{e}");
    }

    #[test]
    fn sslmode_rules() {
        let e = parse("postgres://u@h/db?sslmode=verify-full", &[]).unwrap_err();
        assert!(e.to_string().contains("sslrootcert"), "{e}");
        let e = parse(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent",
            &[],
        )
        .unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        let e = parse("postgres://u@h/db?sslmode=require&sslrootcert=system", &[]).unwrap_err();
        assert!(e.to_string().contains("verify-full"), "{e}");
        let e = parse("postgres://u@h/db?sslnegotiation=direct", &[]).unwrap_err();
        assert!(e.to_string().contains("sslnegotiation=direct"), "{e}");
        let e = parse("postgres://u@h/db?sslmode=bogus", &[]).unwrap_err();
        assert!(e.to_string().contains("verify-full"), "{e}");
        let t = parse("postgres://u@h/db", &[("PGSSLMODE", "require")]).unwrap();
        assert_eq!(t.params().sslmode, SslMode::Require);
        assert_eq!(t.params().verify, Verify::None);
        let t = parse(
            "postgres://u@h/db?sslmode=disable",
            &[("PGSSLMODE", "require")],
        )
        .unwrap();
        assert_eq!(t.params().sslmode, SslMode::Disable);
    }
}
