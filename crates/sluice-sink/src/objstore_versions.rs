//! Conditional writes on an object store: an object read with its version (S3 and Azure
//! ETags, GCS generations), created only if absent, replaced only if still at the version
//! read. The output's lock (`objstore_lock.rs`) and the stream's state (through
//! [`crate::Versioned`]) are written this way, so a run that lost the output cannot overwrite
//! what the run that took it over wrote.

use crate::destination::{Destination, ObjectVersion, Versioned};
use crate::objstore::{ObjectStoreDestination, Shared};
use async_trait::async_trait;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use sluice_core::{Error, Result, Retry};
use std::sync::Arc;

/// The version of an object this run last wrote or read, for conditional writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Version {
    /// ETag / version of S3 and Azure.
    Store(UpdateVersion),
    /// A GCS generation.
    Gcs(String),
}

fn unsupported(shown: &str, e: &object_store::Error) -> Error {
    Error::destination(
        Retry::Permanent,
        format!(
            "{shown} does not support conditional writes ({e}), which the output's lock needs so \
             that two runs never write one output. Use a store that supports them (AWS S3, \
             GCS, Azure, MinIO, R2 do)."
        ),
    )
}

/// Create the object at `path` if absent: the new version, or `None` if one exists.
pub(crate) async fn create(
    s: &Arc<Shared>,
    shown: &str,
    path: &str,
    data: Vec<u8>,
) -> Result<Option<Version>> {
    let key = s.key(path);
    if let Some(g) = &s.gcs {
        return g
            .put_if_generation(&key, data.into(), "0")
            .await
            .map(|v| v.map(Version::Gcs))
            .map_err(|e| s.error(&e, "write", path));
    }
    let opts = PutOptions::from(PutMode::Create);
    match s.store.put_opts(&key, PutPayload::from(data), opts).await {
        Ok(r) => Ok(Some(Version::Store(r.into()))),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(None),
        Err(e @ object_store::Error::NotImplemented { .. }) => Err(unsupported(shown, &e)),
        Err(e) => Err(s.error(&e, "write", path)),
    }
}

/// The content and version of the object at `path`, or `None` if it does not exist.
pub(crate) async fn read(s: &Arc<Shared>, path: &str) -> Result<Option<(Vec<u8>, Version)>> {
    let key = s.key(path);
    if let Some(g) = &s.gcs {
        return g
            .get_with_generation(&key)
            .await
            .map(|v| v.map(|(b, g)| (b.to_vec(), Version::Gcs(g))))
            .map_err(|e| s.error(&e, "read", path));
    }
    let got = async {
        match s.store.get(&key).await {
            Ok(r) => {
                let version = UpdateVersion {
                    e_tag: r.meta.e_tag.clone(),
                    version: r.meta.version.clone(),
                };
                r.bytes()
                    .await
                    .map(|b| Some((b.to_vec(), Version::Store(version))))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
    .await;
    got.map_err(|e| s.error(&e, "read", path))
}

/// Replace the object at `path` if it is still at `version`: the new version, or `None` if
/// it changed.
pub(crate) async fn replace(
    s: &Arc<Shared>,
    shown: &str,
    path: &str,
    data: Vec<u8>,
    version: &Version,
) -> Result<Option<Version>> {
    let key = s.key(path);
    match version {
        Version::Gcs(generation) => {
            let g = s
                .gcs
                .as_ref()
                .ok_or_else(|| Error::internal("GCS version without GCS"))?;
            g.put_if_generation(&key, data.into(), generation)
                .await
                .map(|v| v.map(Version::Gcs))
                .map_err(|e| s.error(&e, "write", path))
        }
        Version::Store(v) => {
            let opts = PutOptions::from(PutMode::Update(v.clone()));
            match s.store.put_opts(&key, PutPayload::from(data), opts).await {
                Ok(r) => Ok(Some(Version::Store(r.into()))),
                Err(
                    object_store::Error::Precondition { .. }
                    | object_store::Error::NotFound { .. }
                    | object_store::Error::AlreadyExists { .. },
                ) => Ok(None),
                Err(e @ object_store::Error::NotImplemented { .. }) => Err(unsupported(shown, &e)),
                Err(e) => Err(s.error(&e, "write", path)),
            }
        }
    }
}

#[async_trait]
impl Versioned for ObjectStoreDestination {
    async fn get_versioned(&self, path: &str) -> Result<Option<(Vec<u8>, ObjectVersion)>> {
        Ok(read(&self.shared, path)
            .await?
            .map(|(data, v)| (data, ObjectVersion(v))))
    }

    async fn put_if(
        &self,
        path: &str,
        data: Vec<u8>,
        expected: Option<&ObjectVersion>,
    ) -> Result<Option<ObjectVersion>> {
        let shown = self.display();
        let written = match expected {
            None => create(&self.shared, &shown, path, data).await?,
            Some(v) => replace(&self.shared, &shown, path, data, &v.0).await?,
        };
        Ok(written.map(ObjectVersion))
    }
}
