//! `sluice doctor --to … --format delta`: can a Delta table be made and committed at the output,
//! and does the store refuse a second writer of one commit? A throwaway table under
//! `_sluice/doctor-<n>/` is created (one version) and removed again; first, one object is
//! written twice with a conditional put (`If-None-Match`), whose second write must be refused:
//! a store that overwrites instead would let two writers commit the same table version, one
//! silently losing its rows.

use crate::{delta_error, open};
use deltalake_core::kernel::{DataType, StructField};
use deltalake_core::logstore::object_store::{self, ObjectStoreExt, PutMode, PutPayload};
use deltalake_core::operations::create::CreateBuilder;
use deltalake_core::protocol::SaveMode;
use deltalake_core::{ObjectStore, Path};
use futures_util::TryStreamExt;
use sluice_core::{Error, Result};
use std::sync::Arc;
use url::Url;

/// Probe the output at `root` (see the module's notes); the line doctor prints when it passed.
pub(crate) async fn probe(root: &Url, store: Option<&Arc<dyn ObjectStore>>) -> Result<String> {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let url = root
        .join(&format!("_sluice/doctor-{n:x}/"))
        .map_err(|e| Error::internal(format!("a probe directory as a URL: {e}")))?;
    let (table, _) = open(&url, store).await?;
    let log = table.log_store();
    let files = log.object_store(None);
    let outcome = async {
        let p = Path::from("conditional-put");
        let once = PutPayload::from_static(b"1");
        files
            .put_opts(&p, once, PutMode::Create.into())
            .await
            .map_err(|e| delta_error(&url, e.into()))?;
        match files
            .put_opts(&p, PutPayload::from_static(b"2"), PutMode::Create.into())
            .await
        {
            Err(object_store::Error::AlreadyExists { .. }) => {}
            Ok(_) => {
                return Err(Error::config(format!(
                    "{url}: the store replaced an object that a conditional put \
                     (If-None-Match) had to leave alone, so two writers of one Delta table \
                     could both commit the same version and one would lose its rows. Use a \
                     store that honours conditional writes (AWS S3 since 2024, MinIO, \
                     Cloudflare R2), or a local directory."
                )));
            }
            Err(e) => return Err(delta_error(&url, e.into())),
        }
        let made = CreateBuilder::new()
            .with_log_store(log.clone())
            .with_columns([StructField::new("id", DataType::LONG, false)])
            .with_save_mode(SaveMode::ErrorIfExists)
            .await
            .map_err(|e| delta_error(&url, e))?;
        Ok(format!(
            "Delta tables can be created and committed (version {} of a probe table), and a \
             second writer of one commit is refused",
            made.version().unwrap_or_default()
        ))
    }
    .await;
    // The probe leaves nothing behind, whatever it found.
    let left: Vec<Path> = files
        .list(None)
        .map_ok(|o| o.location)
        .try_collect()
        .await
        .map_err(|e| delta_error(&url, e.into()))?;
    for p in left {
        files
            .delete(&p)
            .await
            .map_err(|e| delta_error(&url, e.into()))?;
    }
    // A local directory keeps its empty folders: removed too.
    if let Ok(dir) = url.to_file_path() {
        let _ = std::fs::remove_dir_all(dir);
    }
    outcome
}
