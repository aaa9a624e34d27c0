//! The output as the export of a table that joined a running stream sees it: its parts go
//! where every table's do (`<table>/part-….parquet`), its manifest and bookkeeping
//! (`manifest.json`, `_sluice/run.json`, receipts) under `_sluice/added/<id>/`, apart from the
//! initial snapshot's, so the export engine plans, resumes and completes it as an export of
//! its own.

use async_trait::async_trait;
use sluice_core::Result;
use sluice_sink::layout::MANIFEST;
use sluice_sink::{Destination, LockHolder, ObjectInfo, ObjectWriter, OutputLock};
use std::sync::Arc;

/// `inner` with the export's manifest and `_sluice/` under `prefix` (ends with `/`).
pub(crate) struct Beside {
    pub inner: Arc<dyn Destination>,
    pub prefix: String,
}

impl Beside {
    /// Bookkeeping paths moved under the prefix, the rest as they are.
    fn map(&self, path: &str) -> String {
        if path == MANIFEST || path == "_sluice" || path.starts_with("_sluice/") {
            format!("{}{path}", self.prefix)
        } else {
            path.to_string()
        }
    }
}

#[async_trait]
impl Destination for Beside {
    fn display(&self) -> String {
        self.inner.display()
    }

    async fn check_writable(&self) -> Result<()> {
        self.inner.check_writable().await
    }

    fn create(&self, path: &str) -> Result<Box<dyn ObjectWriter>> {
        self.inner.create(&self.map(path))
    }

    fn buffer_bytes_per_writer(&self) -> u64 {
        self.inner.buffer_bytes_per_writer()
    }

    async fn put(&self, path: &str, data: Vec<u8>) -> Result<()> {
        self.inner.put(&self.map(path), data).await
    }

    async fn get(&self, path: &str) -> Result<Option<Vec<u8>>> {
        self.inner.get(&self.map(path)).await
    }

    async fn size(&self, path: &str) -> Result<Option<u64>> {
        self.inner.size(&self.map(path)).await
    }

    fn read_range(&self, path: &str, start: u64, len: usize) -> Result<Vec<u8>> {
        self.inner.read_range(&self.map(path), start, len)
    }

    /// The root lists this export's own top level (its manifest and temporaries), not the
    /// whole output; `_sluice/` lists this export's bookkeeping; a table's directory lists it.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let own = prefix.is_empty() || self.map(prefix) != prefix;
        if !own {
            return self.inner.list(prefix).await;
        }
        let mut found = self.inner.list(&format!("{}{prefix}", self.prefix)).await?;
        for f in &mut found {
            f.path = f.path[self.prefix.len()..].to_string();
        }
        if prefix.is_empty() {
            found.retain(|f| !f.path.contains('/'));
        }
        Ok(found)
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.inner.delete(&self.map(path)).await
    }

    async fn lock(&self, holder: &LockHolder) -> Result<Arc<dyn OutputLock>> {
        self.inner.lock(holder).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sink::LocalDestination;

    #[tokio::test]
    async fn bookkeeping_goes_beside_parts_stay() {
        let dir = std::env::temp_dir().join(format!("sluice-beside-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let inner: Arc<dyn Destination> = Arc::new(LocalDestination::new(&dir, false));
        inner
            .put("manifest.json", b"initial".to_vec())
            .await
            .unwrap();
        let b = Beside {
            inner: inner.clone(),
            prefix: "_sluice/added/x/".into(),
        };
        assert_eq!(b.get(MANIFEST).await.unwrap(), None);
        b.put(MANIFEST, b"added".to_vec()).await.unwrap();
        b.put("_sluice/run.json", b"{}".to_vec()).await.unwrap();
        b.put("t/part-00000.parquet", b"p".to_vec()).await.unwrap();
        assert_eq!(inner.get(MANIFEST).await.unwrap().unwrap(), b"initial");
        assert_eq!(
            inner
                .get("_sluice/added/x/manifest.json")
                .await
                .unwrap()
                .unwrap(),
            b"added"
        );
        assert!(inner.get("t/part-00000.parquet").await.unwrap().is_some());
        let top: Vec<String> = b
            .list("")
            .await
            .unwrap()
            .into_iter()
            .map(|f| f.path)
            .collect();
        assert_eq!(top, vec!["manifest.json".to_string()]);
        let own: Vec<String> = b
            .list("_sluice")
            .await
            .unwrap()
            .into_iter()
            .map(|f| f.path)
            .collect();
        assert_eq!(own, vec!["_sluice/run.json".to_string()]);
        let parts = b.list("t").await.unwrap();
        assert_eq!(parts[0].path, "t/part-00000.parquet");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
