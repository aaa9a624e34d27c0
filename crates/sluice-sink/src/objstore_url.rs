//! Object-store locations: parsing `--to` URLs into stores, and classifying store errors.
//!
//! Credentials come from each cloud's standard environment variables (`AWS_*`, `GOOGLE_*`,
//! `AZURE_*`, read by `object_store`'s `from_env` builders) and may be overridden by URL query
//! options (`s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=eu-west-1`). Query keys
//! are `object_store`'s configuration keys, plus sluice's own `part_size` and
//! `upload_concurrency`. Query values never reach a message: locations are shown without
//! their query.

use crate::objstore_gcs::GcsJson;
use object_store::ObjectStore;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::{BackoffConfig, RetryConfig};
use sluice_core::{Error, Result, Retry};
use std::sync::Arc;
use std::time::Duration;

/// Which cloud a location is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloud {
    /// Amazon S3 or an S3-compatible store (MinIO, Ceph, R2) via an endpoint override.
    S3,
    /// Google Cloud Storage.
    Gcs,
    /// Azure Blob Storage (and ADLS Gen2 through its blob endpoint).
    Azure,
}

impl Cloud {
    /// The cloud serving URL `to`, if its scheme names an object store.
    pub fn of(to: &str) -> Option<Cloud> {
        let scheme = to.split_once("://")?.0.to_ascii_lowercase();
        match scheme.as_str() {
            "s3" | "s3a" => Some(Cloud::S3),
            "gs" | "gcs" => Some(Cloud::Gcs),
            "az" | "azure" | "abfs" | "abfss" => Some(Cloud::Azure),
            _ => None,
        }
    }

    /// Where the credentials come from, for messages.
    pub fn credential_hint(self) -> &'static str {
        match self {
            Cloud::S3 => {
                "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or run with web-identity or \
                 instance credentials), AWS_REGION, and AWS_ENDPOINT_URL for S3-compatible stores"
            }
            Cloud::Gcs => {
                "set GOOGLE_APPLICATION_CREDENTIALS or GOOGLE_SERVICE_ACCOUNT to a service-account \
                 key file (or run where instance credentials exist)"
            }
            Cloud::Azure => {
                "set AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY, a SAS token \
                 (AZURE_STORAGE_SAS_KEY) or a service principal (AZURE_CLIENT_ID, \
                 AZURE_CLIENT_SECRET, AZURE_TENANT_ID)"
            }
        }
    }

    /// "bucket" or "container", for messages.
    pub fn bucket_word(self) -> &'static str {
        match self {
            Cloud::Azure => "container",
            _ => "bucket",
        }
    }
}

/// Default bytes per uploaded part: S3's minimum part size, so memory per open file stays small.
pub const DEFAULT_PART_SIZE: usize = 5 << 20;
/// Default parts of one file uploaded at once.
pub const DEFAULT_UPLOAD_CONCURRENCY: usize = 2;

/// A parsed object-store location.
pub struct Location {
    /// The cloud.
    pub cloud: Cloud,
    /// The store, rooted at the bucket.
    pub store: Arc<dyn ObjectStore>,
    /// Bucket or container name.
    pub bucket: String,
    /// Key prefix inside the bucket (no leading or trailing `/`), possibly empty.
    pub prefix: String,
    /// The URL without its query, for messages and the manifest.
    pub shown: String,
    /// Bytes per uploaded part.
    pub part_size: usize,
    /// Parts of one file in flight at once.
    pub upload_concurrency: usize,
    /// GCS only: the JSON-API client that serves everything but uploads (see
    /// [`crate::objstore_gcs`]).
    pub gcs: Option<GcsJson>,
}

/// Retries inside `object_store` (per HTTP request): bounded so that an unreachable endpoint
/// fails in seconds, not minutes; the engine retries a failed part as a whole on top.
fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            base: 2.0,
        },
        max_retries: 5,
        retry_timeout: Duration::from_secs(60),
    }
}

fn bad_url(to: &str, why: &str) -> Error {
    Error::config(format!("--to {}: {why}", shown_url(to)))
}

/// `to` without its query (which may hold credentials).
pub fn shown_url(to: &str) -> String {
    to.split_once('?').map(|(a, _)| a).unwrap_or(to).to_string()
}

/// Parse a size such as `8MiB`, `16MB`, `5242880` (`sluice_core::size`'s units).
fn parse_size(s: &str) -> Option<usize> {
    sluice_core::size::parse_size(s, "part_size")
        .ok()
        .and_then(|n| usize::try_from(n).ok())
}

/// Parse `to` (an `s3://`, `gs://`, `az://`… URL) and build its store. `extra` holds options
/// given outside the URL (the CLI's `--part-size`, `--upload-concurrency`, `--storage-option`
/// and their YAML keys), with the same keys as the query; they are applied after the query,
/// so they win over it.
pub fn open(to: &str, extra: &[(String, String)]) -> Result<Location> {
    // reqwest is built without a bundled TLS provider (to keep aws-lc-rs out); use ring's.
    // Installing twice is harmless (the second call reports the first and changes nothing).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cloud = Cloud::of(to).ok_or_else(|| bad_url(to, "not an object-store URL"))?;
    let url = url::Url::parse(to).map_err(|e| {
        bad_url(
            to,
            &format!("not a valid URL ({e}); write e.g. s3://bucket/prefix"),
        )
    })?;
    let host = url.host_str().unwrap_or("").to_string();
    if host.is_empty() && url.username().is_empty() {
        return Err(bad_url(
            to,
            &format!(
                "names no {}; write e.g. {}://{}/prefix",
                cloud.bucket_word(),
                url.scheme(),
                cloud.bucket_word()
            ),
        ));
    }
    let prefix = url.path().trim_matches('/').to_string();
    let prefix = percent_encoding::percent_decode_str(&prefix)
        .decode_utf8_lossy()
        .into_owned();
    // The builders parse the bucket (and, for abfss://container@account…, the account) from
    // the URL without its path and query.
    let base = format!(
        "{}://{}{}",
        url.scheme(),
        if url.username().is_empty() {
            String::new()
        } else {
            format!("{}@", url.username())
        },
        host
    );
    let mut part_size = DEFAULT_PART_SIZE;
    let mut upload_concurrency = DEFAULT_UPLOAD_CONCURRENCY;
    let mut options = Vec::new();
    let pairs = url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .chain(extra.iter().cloned());
    for (k, v) in pairs {
        match k.as_ref() {
            "part_size" => {
                part_size = parse_size(&v).filter(|n| *n >= 1 << 20).ok_or_else(|| {
                    bad_url(to, "part_size must be a size of at least 1MB, e.g. 8MB")
                })?;
            }
            "upload_concurrency" => {
                upload_concurrency = v.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                    bad_url(
                        to,
                        "upload_concurrency must be a whole number of at least 1",
                    )
                })?;
            }
            _ => options.push((k, v)),
        }
    }
    let unknown = |k: &str| {
        bad_url(
            to,
            &format!(
                "the option {k:?} is not a known {cloud:?} setting; remove it or fix its name"
            ),
        )
    };
    let built: std::result::Result<(Arc<dyn ObjectStore>, String, Option<GcsJson>), _> = match cloud
    {
        Cloud::S3 => {
            let mut b = AmazonS3Builder::from_env()
                .with_url(&base)
                .with_retry(retry_config());
            for (k, v) in &options {
                let key: AmazonS3ConfigKey = k.parse().map_err(|_| unknown(k))?;
                b = b.with_config(key, v);
            }
            let bucket = b
                .get_config_value(&AmazonS3ConfigKey::Bucket)
                .unwrap_or_default();
            b.build()
                .map(|s| (Arc::new(s) as Arc<dyn ObjectStore>, bucket, None))
        }
        Cloud::Gcs => {
            let mut b = GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(&host)
                .with_retry(retry_config());
            for (k, v) in &options {
                let key: GoogleConfigKey = k.parse().map_err(|_| unknown(k))?;
                b = b.with_config(key, v);
            }
            let base_url = b
                .get_config_value(&GoogleConfigKey::BaseUrl)
                .unwrap_or_else(|| "https://storage.googleapis.com".to_string());
            b.build().and_then(|s| {
                let json = GcsJson::new(&base_url, &host, s.credentials().clone())?;
                Ok((
                    Arc::new(s) as Arc<dyn ObjectStore>,
                    host.clone(),
                    Some(json),
                ))
            })
        }
        Cloud::Azure => {
            let mut b = MicrosoftAzureBuilder::from_env()
                .with_url(&base)
                .with_retry(retry_config());
            for (k, v) in &options {
                let key: AzureConfigKey = k.parse().map_err(|_| unknown(k))?;
                b = b.with_config(key, v);
            }
            let bucket = b
                .get_config_value(&AzureConfigKey::ContainerName)
                .unwrap_or_default();
            b.build()
                .map(|s| (Arc::new(s) as Arc<dyn ObjectStore>, bucket, None))
        }
    };
    let (store, bucket, gcs) = built.map_err(|e| {
        Error::config(format!(
            "--to {}: cannot set up the {cloud:?} client: {}. To fix: {}.",
            shown_url(to),
            scrub(&e.to_string()),
            cloud.credential_hint()
        ))
    })?;
    Ok(Location {
        cloud,
        store,
        bucket,
        prefix,
        shown: shown_url(to),
        part_size,
        upload_concurrency,
        gcs,
    })
}

/// Remove anything that looks like a signed-URL query (SAS tokens, signatures) from text that
/// came from the store client.
pub fn scrub(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split_inclusive(char::is_whitespace) {
        if word.contains("://") && word.contains('?') {
            let (head, _) = word.split_once('?').unwrap_or((word, ""));
            out.push_str(head);
            out.push_str("?***");
            if word.ends_with(char::is_whitespace) {
                out.push(' ');
            }
        } else {
            out.push_str(word);
        }
    }
    out
}

/// Whether an HTTP status, found in an `object_store` message, is worth retrying.
fn status_in(text: &str) -> Option<u16> {
    let at = text.find("status code: ")?;
    text[at + 13..].get(..3)?.parse().ok()
}

/// Turn a store error on `what` (an action and path for the message) into a destination
/// error, transient or permanent, with the fix.
pub fn classify(e: &object_store::Error, cloud: Cloud, bucket: &str, what: &str) -> Error {
    use object_store::Error as E;
    let text = scrub(&e.to_string());
    let word = cloud.bucket_word();
    match e {
        E::NotFound { .. } => Error::destination(
            Retry::Permanent,
            format!(
                "could not {what}: not found ({text}). If the {word} {bucket:?} does not exist, \
                 create it or fix --to; with a custom endpoint, check that it is the right one."
            ),
        ),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => Error::destination(
            Retry::Permanent,
            format!(
                "could not {what}: access to {word} {bucket:?} was denied ({text}). Check the \
                 credentials and their permissions: {}.",
                cloud.credential_hint()
            ),
        ),
        E::Generic { source, .. } => {
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
            while let Some(c) = cause {
                if let Some(h) = c.downcast_ref::<object_store::client::HttpError>() {
                    use object_store::client::HttpErrorKind as K;
                    if matches!(
                        h.kind(),
                        K::Connect | K::Timeout | K::Request | K::Interrupted
                    ) {
                        return Error::destination(
                            Retry::Transient,
                            format!(
                                "could not {what}: the {cloud:?} endpoint is unreachable or timed \
                                 out ({text}). Check the network and the endpoint setting."
                            ),
                        );
                    }
                }
                cause = c.source();
            }
            let retry = match status_in(&text) {
                Some(s) if s == 429 || s == 408 || s >= 500 => Retry::Transient,
                Some(404) => {
                    return Error::destination(
                        Retry::Permanent,
                        format!(
                            "could not {what}: the {word} {bucket:?} does not exist ({text}). \
                             Create it or fix --to."
                        ),
                    );
                }
                Some(_) => Retry::Permanent,
                None => Retry::Transient,
            };
            Error::destination(retry, format!("could not {what}: {text}"))
        }
        _ => Error::destination(Retry::Permanent, format!("could not {what}: {text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_and_sizes() {
        assert_eq!(Cloud::of("s3://b/p"), Some(Cloud::S3));
        assert_eq!(Cloud::of("GS://b"), Some(Cloud::Gcs));
        assert_eq!(
            Cloud::of("abfss://c@a.dfs.core.windows.net/x"),
            Some(Cloud::Azure)
        );
        assert_eq!(Cloud::of("./out"), None);
        assert_eq!(parse_size("8MiB"), Some(8 << 20));
        assert_eq!(parse_size("5242880"), Some(5 << 20));
        assert_eq!(parse_size("8 parsecs"), None);
    }

    #[test]
    fn queries_never_shown() {
        let to = "az://c/p?azure_storage_sas_key=sv%3Dsecret";
        assert_eq!(shown_url(to), "az://c/p");
        let t = scrub("error sending request for url (http://h/c/o?sig=SECRET&x=1) here");
        assert!(!t.contains("SECRET"), "{t}");
        let e = open("s3://b/p?no_such_option=1", &[])
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref().unwrap_or("").contains("no_such_option"),
            "{e:?}"
        );
    }
}
