//! The one place that maps a URL to an adapter: sources by scheme, destinations by scheme.

use sluice_core::{Error, Result, Source};
use sluice_sink::{Destination, LocalDestination, ObjectStoreDestination};
use std::sync::Arc;

/// A kind of source this build reads, for `sluice --version --verbose` and `sluice doctor`.
pub struct SourceKind {
    /// The adapter's engine name (as in reports and manifests).
    pub engine: &'static str,
    /// The URL schemes it serves.
    pub schemes: &'static [&'static str],
    /// What it covers.
    pub about: &'static str,
}

/// Every source this build reads, in the order [`open_source`] tries them (a test checks that
/// each scheme listed here is served by the adapter named with it).
pub const SOURCES: &[SourceKind] = &[
    SourceKind {
        engine: "postgres",
        schemes: &["postgres://", "postgresql://"],
        about: "PostgreSQL",
    },
    SourceKind {
        engine: "mysql",
        schemes: &["mysql://", "mariadb://"],
        about: "MySQL and MariaDB",
    },
    SourceKind {
        engine: "firebird",
        schemes: &["firebird://"],
        about: "Firebird, embedded or server; client library loaded at run time",
    },
];

/// Every destination this build writes: what it is and the `--to` forms that select it.
pub const DESTINATIONS: &[(&str, &[&str])] = &[
    ("local directory", &["a path", "file://"]),
    ("S3 and S3-compatible stores", &["s3://", "s3a://"]),
    ("Google Cloud Storage", &["gs://", "gcs://"]),
    (
        "Azure Blob Storage",
        &["az://", "azure://", "abfs://", "abfss://"],
    ),
];

/// The MySQL/MariaDB lock bounds (`locking`) were given for `url`, which no MySQL/MariaDB
/// adapter handles: refused rather than ignored, so a user never believes a bound protects a
/// server it does not apply to.
fn refuse_locking(url: &str, locking: bool) -> Result<()> {
    if !locking {
        return Ok(());
    }
    Err(Error::config(format!(
        "--lock-wait-timeout, --long-query-guard, --long-query-wait and \
         --lock-non-transactional apply to MySQL and MariaDB sources only, and the source is \
         {}: remove them.",
        sluice_core::redact::redact_url(url)
    )))
}

/// Open the source adapter for `url`. `locking` (MySQL/MariaDB lock bounds) is refused for
/// other sources rather than ignored.
pub fn open_source(url: &str, locking: Option<sluice_mysql::Locking>) -> Result<Arc<dyn Source>> {
    if sluice_mysql::MySource::handles(url) {
        let source = sluice_mysql::MySource::new(url)?;
        return Ok(Arc::new(match locking {
            Some(l) => source.with_locking(l),
            None => source,
        }));
    }
    refuse_locking(url, locking.is_some())?;
    if sluice_postgres::PgSource::handles(url) {
        return Ok(Arc::new(sluice_postgres::PgSource::new(url)?));
    }
    if sluice_firebird::FbSource::handles(url) {
        return Ok(Arc::new(sluice_firebird::FbSource::new(url)?));
    }
    let scheme = url
        .split("://")
        .next()
        .filter(|_| url.contains("://"))
        .unwrap_or("");
    Err(Error::config(format!(
        "source URL {} has {}: sluice reads postgres://user@host:port/database, \
         mysql://user@host:port/database (MySQL and MariaDB), and \
         firebird:///abs/path/db.fdb (embedded) or firebird://user@host:port//abs/path/db.fdb.",
        sluice_core::redact::redact_url(url),
        if scheme.is_empty() {
            "no scheme".to_string()
        } else {
            format!("the unsupported scheme {scheme:?}")
        }
    )))
}

/// Open the change source for `url` (`sluice stream`): PostgreSQL logical replication, the
/// MySQL/MariaDB binary log. `server_id` (`--server-id`) and `locking` apply to MySQL/MariaDB
/// only, `slot_wait` (`--slot-wait`) to PostgreSQL only; each is refused for other sources
/// rather than ignored.
pub fn open_change_source(
    url: &str,
    server_id: Option<u32>,
    locking: Option<sluice_mysql::Locking>,
    bad_values: sluice_core::change::BadValues,
    slot_wait: Option<std::time::Duration>,
) -> Result<Arc<dyn sluice_core::change::ChangeSource>> {
    if sluice_mysql::MySource::handles(url) {
        if slot_wait.is_some() {
            return Err(Error::config(
                "--slot-wait bounds the creation of a PostgreSQL replication slot, and a \
                 MySQL/MariaDB binary log needs none: remove it.",
            ));
        }
        let capture =
            sluice_mysql::replication::MyCapture::new(url, server_id)?.with_bad_values(bad_values);
        return Ok(Arc::new(match locking {
            Some(l) => capture.with_locking(l),
            None => capture,
        }));
    }
    refuse_locking(url, locking.is_some())?;
    if server_id.is_some() {
        return Err(Error::config(format!(
            "--server-id names the replica id of a MySQL/MariaDB binary log stream, and the \
             source is {}: remove it.",
            sluice_core::redact::redact_url(url)
        )));
    }
    if sluice_postgres::PgSource::handles(url) {
        return Ok(Arc::new(
            sluice_postgres::replication::PgCapture::new(url)?
                .with_bad_values(bad_values)
                .with_slot_wait(slot_wait),
        ));
    }
    Err(Error::config(format!(
        "sluice stream captures changes from PostgreSQL (postgres://…) and MySQL/MariaDB \
         (mysql://…, mariadb://…); {} is neither.",
        sluice_core::redact::redact_url(url)
    )))
}

/// The apply target of `sluice replicate` for `url`.
pub fn open_apply_target(url: &str) -> Result<Arc<dyn sluice_core::apply::ApplyTarget>> {
    if sluice_mysql::MySource::handles(url) {
        return Ok(Arc::new(sluice_mysql::apply::MyApplyTarget::new(url)?));
    }
    if sluice_postgres::PgSource::handles(url) {
        return Ok(Arc::new(sluice_postgres::apply::PgApplyTarget::new(url)?));
    }
    Err(Error::config(format!(
        "--target {}: sluice replicate applies changes to PostgreSQL (postgres://…) and \
         MySQL/MariaDB (mysql://…, mariadb://…) databases.",
        sluice_core::redact::redact_url(url)
    )))
}

/// Release what source adapters hold for the whole process (today: the Firebird client
/// library, whose own exit-time shutdown can deadlock with an embedded engine). Returns true
/// when the process must then leave with `_exit` rather than run its exit handlers.
pub fn release_process_resources() -> bool {
    sluice_firebird::shutdown(std::time::Duration::from_secs(10))
}

/// Open the destination for `to`: a local path, a `file://` URL, or an object store
/// (`s3://`, `gs://`, `az://` and their aliases).
/// `storage_options` go to object stores (the `--storage-option`, `--part-size` and
/// `--upload-concurrency` settings, see `config.rs`).
pub fn open_destination(
    to: &str,
    fsync: bool,
    storage_options: &[(String, String)],
) -> Result<Arc<dyn Destination>> {
    if ObjectStoreDestination::handles(to) {
        return Ok(Arc::new(ObjectStoreDestination::open_with(
            to,
            storage_options,
        )?));
    }
    if let Some(path) = to.strip_prefix("file://") {
        return Ok(Arc::new(LocalDestination::new(path, fsync)));
    }
    if let Some((scheme, _)) = to.split_once("://") {
        return Err(Error::config(format!(
            "--to {} uses {scheme}://, which sluice cannot write to: give a local directory, \
             a file:// URL, or s3://, gs://, az:// (object storage).",
            sluice_core::redact::redact_url(to)
        )));
    }
    Ok(Arc::new(LocalDestination::new(to, fsync)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listed_schemes_are_the_ones_served() {
        for kind in SOURCES {
            for scheme in kind.schemes {
                let url = format!("{scheme}user@host/db");
                let engine = if sluice_postgres::PgSource::handles(&url) {
                    "postgres"
                } else if sluice_firebird::FbSource::handles(&url) {
                    "firebird"
                } else if sluice_mysql::MySource::handles(&url) {
                    "mysql"
                } else {
                    "none"
                };
                assert_eq!(engine, kind.engine, "{url}");
            }
        }
        for (what, forms) in DESTINATIONS {
            for form in forms.iter().filter(|f| f.ends_with("://")) {
                let url = format!("{form}bucket/prefix");
                let remote = ObjectStoreDestination::handles(&url);
                assert_eq!(remote, *what != "local directory", "{url}");
            }
        }
    }
}
