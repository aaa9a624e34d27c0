//! Connecting: URL parsing, credentials from the environment, session settings.
//!
//! Every session sluice opens carries the run's tag as `application_name` (so the harm probe
//! and a DBA can find it in `pg_stat_activity`) and the same output-affecting settings (UTC,
//! ISO dates, exact float text), so text casts and key bounds round-trip identically in every
//! session. Every session also runs with `row_security = off`, as pg_dump's do: a table whose
//! row-level security policies would hide rows from the user fails to read instead of being
//! silently filtered, unless the run opted in ([`PgTarget::with_row_security`]).

use crate::error::{Phase, classify};
use sluice_core::redact::redact_url;
use sluice_core::{Error, Result};
use std::str::FromStr;
use std::time::Duration;
use tokio_postgres::{Client, Config, NoTls};

/// Settings applied to every session through the startup packet (no extra round trip).
const SESSION_OPTIONS: &str = "-c TimeZone=UTC -c DateStyle=ISO -c IntervalStyle=iso_8601 \
     -c extra_float_digits=3 -c standard_conforming_strings=on -c lock_timeout=10s \
     -c row_security=off";

/// A parsed PostgreSQL connection target.
#[derive(Clone)]
pub struct PgTarget {
    config: Config,
    display: String,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the config: it holds the password.
        f.debug_struct("PgTarget")
            .field("url", &self.display)
            .finish()
    }
}

impl PgTarget {
    /// Parse `postgres://user[:password]@host[:port]/database[?params]`.
    ///
    /// A password missing from the URL is taken from `PGPASSWORD`; a missing user from `PGUSER`,
    /// then `USER`. A missing port means 5432. The connect timeout defaults to 10 s.
    pub fn parse(url: &str) -> Result<Self> {
        let display = redact_url(url);
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(Error::config(format!(
                "source URL {display} is not a PostgreSQL URL: it must start with postgres:// \
                 (e.g. postgres://user@localhost:5432/mydb)."
            )));
        }
        let mut config = Config::from_str(url).map_err(|e| {
            Error::config(format!(
                "source URL {display} cannot be parsed ({}). Use the form \
                 postgres://user[:password]@host[:port]/database, percent-encoding special \
                 characters in the password.",
                sluice_core::redact::scrub(&e.to_string(), password_of(url).as_deref())
            ))
        })?;
        if config.get_hosts().is_empty() {
            return Err(Error::config(format!(
                "source URL {display} names no host: use postgres://user@HOST:port/database."
            )));
        }
        if config.get_dbname().is_none() {
            return Err(Error::config(format!(
                "source URL {display} names no database: add it after the host, e.g. \
                 postgres://user@host:5432/DATABASE."
            )));
        }
        if config.get_password().is_none()
            && let Ok(pw) = std::env::var("PGPASSWORD")
        {
            config.password(pw);
        }
        if config.get_user().is_none() {
            let user = std::env::var("PGUSER")
                .or_else(|_| std::env::var("USER"))
                .map_err(|_| {
                    Error::config(format!(
                        "source URL {display} names no user and neither PGUSER nor USER is set: \
                     write postgres://USER@host/database."
                    ))
                })?;
            config.user(user);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        let options = match config.get_options() {
            Some(existing) => format!("{existing} {SESSION_OPTIONS}"),
            None => SESSION_OPTIONS.to_string(),
        };
        config.options(options);
        Ok(PgTarget { config, display })
    }

    /// This target with row-level security applied to its sessions when `enable` (the user
    /// opted in to exporting only the rows policies let them see, `--enable-row-security`);
    /// otherwise sessions keep `row_security = off`.
    pub fn with_row_security(mut self, enable: bool) -> Self {
        if enable {
            let options = format!(
                "{} -c row_security=on",
                self.config.get_options().unwrap_or_default()
            );
            self.config.options(options);
        }
        self
    }

    /// The URL with the password redacted.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// Open a session tagged `application_name = tag`. The connection task runs on the current
    /// Tokio runtime and ends when the client is dropped.
    pub async fn connect(&self, tag: &str) -> Result<Client> {
        let mut config = self.config.clone();
        config.application_name(tag);
        let (client, connection) = config
            .connect(NoTls)
            .await
            .map_err(|e| classify(e, Phase::Connect, &self.display))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("PostgreSQL connection ended: {e}");
            }
        });
        Ok(client)
    }
}

fn password_of(url: &str) -> Option<String> {
    url::Url::parse(url).ok().and_then(|u| {
        u.password().map(|p| {
            percent_encoding::percent_decode_str(p)
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_other_schemes_without_leaking() {
        let e = PgTarget::parse("mysql://u:topsecret@h/db").unwrap_err();
        assert_eq!(e.kind(), sluice_core::ErrorKind::Config);
        assert!(!e.to_string().contains("topsecret"));
    }

    #[test]
    fn requires_database() {
        let e = PgTarget::parse("postgres://u:topsecret@localhost:5432").unwrap_err();
        assert!(e.to_string().contains("names no database"), "{e}");
        assert!(!e.to_string().contains("topsecret"));
    }

    #[test]
    fn debug_hides_password() {
        let t = PgTarget::parse("postgres://u:topsecret@localhost:5432/db").unwrap();
        assert!(!format!("{t:?}").contains("topsecret"));
        assert_eq!(t.display(), "postgres://u:***@localhost:5432/db");
    }
}
