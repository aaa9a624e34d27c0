//! Google Cloud Storage through its JSON API, for everything but uploads.
//!
//! `object_store` speaks GCS's XML API. Multipart uploads stay with it; single uploads,
//! listing, reading, sizes and deletes go through the JSON API here, which GCS serves fully
//! and which the local GCS emulators serve too (gcp-storage-emulator answers `object_store`'s
//! XML `PUT`, `HEAD` and `DELETE` with 501 and its list with an empty body, and its XML `GET`
//! carries no `ETag`, which `object_store` requires). Errors are returned as `object_store` errors so that one
//! classification serves every store.

use bytes::Bytes;
use object_store::gcp::GcpCredentialProvider;
use object_store::path::Path;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use std::ops::Range;
use std::time::Duration;

/// Everything but RFC 3986's unreserved characters is escaped in names and query values.
const ESCAPE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

type StoreResult<T> = std::result::Result<T, object_store::Error>;

/// A JSON-API client for one bucket.
#[derive(Clone)]
pub struct GcsJson {
    client: reqwest::Client,
    base: String,
    bucket: String,
    credentials: GcpCredentialProvider,
}

fn generic(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> object_store::Error {
    object_store::Error::Generic {
        store: "GCS",
        source: e.into(),
    }
}

impl GcsJson {
    /// A client for `bucket` at `base_url` (e.g. `https://storage.googleapis.com`).
    pub fn new(
        base_url: &str,
        bucket: &str,
        credentials: GcpCredentialProvider,
    ) -> StoreResult<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(generic)?;
        Ok(GcsJson {
            client,
            base: base_url.trim_end_matches('/').to_string(),
            bucket: bucket.to_string(),
            credentials,
        })
    }

    fn object_url(&self, key: &Path) -> String {
        // Object names are the keys unescaped (object_store escapes some characters in keys).
        let name = percent_encoding::percent_decode_str(key.as_ref()).decode_utf8_lossy();
        format!(
            "{}/storage/v1/b/{}/o/{}",
            self.base,
            utf8_percent_encode(&self.bucket, ESCAPE),
            utf8_percent_encode(&name, ESCAPE)
        )
    }

    /// Send a request; `Ok(None)` on 404 when `missing_ok`.
    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
        missing_ok: bool,
    ) -> StoreResult<Option<Bytes>> {
        let token = self.credentials.get_credential().await?;
        let req = if token.bearer.is_empty() {
            req
        } else {
            req.bearer_auth(&token.bearer)
        };
        // A few quick retries for throttling and server errors; the engine retries on top.
        let mut attempt = 0u32;
        loop {
            let Some(r) = req.try_clone() else {
                return Err(generic("request cannot be retried"));
            };
            let resp = match r.send().await {
                Ok(resp) => resp,
                Err(e) if attempt < 3 && (e.is_connect() || e.is_timeout()) => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                    continue;
                }
                Err(e) => {
                    // Keep the connection/timeout nature visible to the classifier.
                    let kind = if e.is_connect() || e.is_timeout() {
                        "endpoint unreachable or timed out"
                    } else {
                        "request failed"
                    };
                    return Err(generic(format!("{kind}: {}", without_url(&e))));
                }
            };
            let status = resp.status();
            if (status.as_u16() == 429 || status.is_server_error()) && attempt < 3 {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                continue;
            }
            let body = resp.bytes().await.map_err(|e| generic(without_url(&e)))?;
            if status.is_success() {
                return Ok(Some(body));
            }
            if status.as_u16() == 404 && missing_ok {
                return Ok(None);
            }
            let text: String = String::from_utf8_lossy(&body).chars().take(300).collect();
            let source: Box<dyn std::error::Error + Send + Sync> =
                format!("Server returned non-2xx status code: {status}: {text}").into();
            let path = what.to_string();
            return Err(match status.as_u16() {
                404 => object_store::Error::NotFound { path, source },
                412 => object_store::Error::Precondition { path, source },
                401 => object_store::Error::Unauthenticated { path, source },
                403 => object_store::Error::PermissionDenied { path, source },
                _ => generic(source),
            });
        }
    }

    /// The size of `key`, or `None` if it does not exist.
    pub async fn size(&self, key: &Path) -> StoreResult<Option<u64>> {
        let req = self.client.get(self.object_url(key));
        let Some(body) = self.send(req, key.as_ref(), true).await? else {
            return Ok(None);
        };
        let v: serde_json::Value = serde_json::from_slice(&body).map_err(generic)?;
        Ok(Some(size_of(&v["size"])))
    }

    /// The whole of `key`, or `None` if it does not exist.
    pub async fn get(&self, key: &Path) -> StoreResult<Option<Bytes>> {
        let req = self
            .client
            .get(format!("{}?alt=media", self.object_url(key)));
        self.send(req, key.as_ref(), true).await
    }

    /// Bytes `range` of `key` (clamped to its end).
    pub async fn get_range(&self, key: &Path, range: Range<u64>) -> StoreResult<Bytes> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let req = self
            .client
            .get(format!("{}?alt=media", self.object_url(key)))
            .header("Range", format!("bytes={}-{}", range.start, range.end - 1));
        match self.send(req, key.as_ref(), false).await {
            Ok(b) => Ok(b.unwrap_or_default()),
            // Past the end: nothing to read, as with a file.
            Err(object_store::Error::Generic { source, .. })
                if source.to_string().contains("416") =>
            {
                Ok(Bytes::new())
            }
            Err(e) => Err(e),
        }
    }

    /// Store `data` as `key` with one JSON-API media upload (atomic: the object appears whole).
    pub async fn put(&self, key: &Path, data: Bytes) -> StoreResult<()> {
        let name = percent_encoding::percent_decode_str(key.as_ref()).decode_utf8_lossy();
        let url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=media&name={}",
            self.base,
            utf8_percent_encode(&self.bucket, ESCAPE),
            utf8_percent_encode(&name, ESCAPE)
        );
        let req = self
            .client
            .post(url)
            .header("Content-Type", "application/octet-stream")
            .body(data);
        self.send(req, key.as_ref(), false).await.map(|_| ())
    }

    /// Store `data` as `key` only if the object's generation is `generation` (`"0"`: only if
    /// it does not exist). Returns the new generation, or `None` when the condition failed.
    pub async fn put_if_generation(
        &self,
        key: &Path,
        data: Bytes,
        generation: &str,
    ) -> StoreResult<Option<String>> {
        let name = percent_encoding::percent_decode_str(key.as_ref()).decode_utf8_lossy();
        let url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=media&name={}&ifGenerationMatch={}",
            self.base,
            utf8_percent_encode(&self.bucket, ESCAPE),
            utf8_percent_encode(&name, ESCAPE),
            utf8_percent_encode(generation, ESCAPE)
        );
        let req = self
            .client
            .post(url)
            .header("Content-Type", "application/octet-stream")
            .body(data);
        match self.send(req, key.as_ref(), false).await {
            Ok(body) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&body.unwrap_or_default()).map_err(generic)?;
                Ok(Some(generation_of(&v)))
            }
            Err(object_store::Error::Precondition { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The whole of `key` and its generation, or `None` if it does not exist.
    pub async fn get_with_generation(&self, key: &Path) -> StoreResult<Option<(Bytes, String)>> {
        for _ in 0..3 {
            let req = self.client.get(self.object_url(key));
            let Some(meta) = self.send(req, key.as_ref(), true).await? else {
                return Ok(None);
            };
            let v: serde_json::Value = serde_json::from_slice(&meta).map_err(generic)?;
            let generation = generation_of(&v);
            let req = self.client.get(format!(
                "{}?alt=media&ifGenerationMatch={generation}",
                self.object_url(key)
            ));
            match self.send(req, key.as_ref(), true).await {
                Ok(Some(body)) => return Ok(Some((body, generation))),
                // Replaced or removed between the two requests: look again.
                Ok(None) | Err(object_store::Error::Precondition { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(generic(format!(
            "{} kept changing while it was read",
            key.as_ref()
        )))
    }

    /// Delete `key`; a missing object is not an error.
    pub async fn delete(&self, key: &Path) -> StoreResult<()> {
        let req = self.client.delete(self.object_url(key));
        self.send(req, key.as_ref(), true).await.map(|_| ())
    }

    /// Every object under `prefix` (whole path segments), as (key, size).
    pub async fn list(&self, prefix: &Path) -> StoreResult<Vec<(String, u64)>> {
        let want = if prefix.as_ref().is_empty() {
            String::new()
        } else {
            let p = percent_encoding::percent_decode_str(prefix.as_ref()).decode_utf8_lossy();
            format!("{p}/")
        };
        let url = format!(
            "{}/storage/v1/b/{}/o",
            self.base,
            utf8_percent_encode(&self.bucket, ESCAPE)
        );
        let mut out = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let query = {
                let mut q = url::form_urlencoded::Serializer::new(String::new());
                q.append_pair("prefix", &want);
                if let Some(p) = &page {
                    q.append_pair("pageToken", p);
                }
                q.finish()
            };
            let req = self.client.get(format!("{url}?{query}"));
            let body = self
                .send(req, &self.bucket, false)
                .await?
                .unwrap_or_default();
            let v: serde_json::Value = serde_json::from_slice(&body).map_err(generic)?;
            for item in v["items"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
                let name = item["name"].as_str().unwrap_or_default();
                if !name.is_empty() && !name.ends_with('/') {
                    // Keys in the form object_store uses (segments escaped as it does).
                    out.push((
                        Path::from(name).as_ref().to_string(),
                        size_of(&item["size"]),
                    ));
                }
            }
            match v["nextPageToken"].as_str() {
                Some(t) if !t.is_empty() => page = Some(t.to_string()),
                _ => break,
            }
        }
        Ok(out)
    }
}

/// GCS reports generations as decimal strings.
fn generation_of(v: &serde_json::Value) -> String {
    match &v["generation"] {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// GCS reports sizes as decimal strings.
fn size_of(v: &serde_json::Value) -> u64 {
    match v {
        serde_json::Value::String(s) => s.parse().unwrap_or(0),
        other => other.as_u64().unwrap_or(0),
    }
}

/// A reqwest error's text without its URL (which carries no secret here, but keeps messages
/// short and uniform).
fn without_url(e: &reqwest::Error) -> String {
    let mut e2 = e.to_string();
    if let Some(u) = e.url() {
        e2 = e2.replace(u.as_str(), "<url>");
    }
    e2
}
