//! Local disk destination.
//!
//! A file is written as a hidden temporary (`.part-00003.parquet.<random>.tmp`) beside its final
//! name, flushed and fsynced, then renamed — an atomic step on POSIX file systems — and the
//! directory is fsynced so the rename itself survives a crash. A killed run therefore leaves no
//! file under a final name that is not complete.

use crate::destination::{Destination, ObjectInfo, ObjectWriter, io_error, on_blocking};
use crate::layout::LOCK;
use crate::lock::{LockHolder, OutputLock, held_by};
use async_trait::async_trait;
use sluice_core::{Error, Result};
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Buffer between the format writer and the file.
const WRITE_BUFFER: usize = 1 << 20;

/// A directory on local disk.
#[derive(Debug, Clone)]
pub struct LocalDestination {
    root: PathBuf,
    fsync: bool,
}

impl LocalDestination {
    /// A destination rooted at `root` (created if missing). With `fsync`, every committed file
    /// and its directory entry are made durable before the commit returns.
    pub fn new(root: impl Into<PathBuf>, fsync: bool) -> Self {
        LocalDestination {
            root: root.into(),
            fsync,
        }
    }

    fn full(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }

    fn shown(&self, path: &Path) -> String {
        path.display().to_string()
    }
}

fn temp_for(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let nonce: u64 = rand::random();
    path.with_file_name(format!(".{name}.{nonce:016x}.tmp"))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A file being written under a temporary name.
struct LocalWriter {
    file: Option<BufWriter<File>>,
    temp: PathBuf,
    target: PathBuf,
    fsync: bool,
}

impl Write for LocalWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.file.as_mut() {
            Some(f) => f.write(buf),
            None => Err(io::Error::other("file already closed")),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self.file.as_mut() {
            Some(f) => f.write_all(buf),
            None => Err(io::Error::other("file already closed")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.file.as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

impl ObjectWriter for LocalWriter {
    fn commit(mut self: Box<Self>) -> Result<()> {
        let shown = self.target.display().to_string();
        let file = self
            .file
            .take()
            .ok_or_else(|| Error::internal("file committed twice"))?;
        let file = file
            .into_inner()
            .map_err(|e| io_error(e.error(), "write", &shown))?;
        if self.fsync {
            file.sync_all()
                .map_err(|e| io_error(&e, "flush to disk", &shown))?;
        }
        drop(file);
        fs::rename(&self.temp, &self.target)
            .map_err(|e| io_error(&e, "rename into place", &shown))?;
        if self.fsync
            && let Some(dir) = self.target.parent()
        {
            sync_dir(dir).map_err(|e| io_error(&e, "flush directory", &shown))?;
        }
        Ok(())
    }

    fn abort(mut self: Box<Self>) {
        self.discard();
    }
}

impl LocalWriter {
    fn discard(&mut self) {
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

impl Drop for LocalWriter {
    fn drop(&mut self) {
        self.discard();
    }
}

/// The file system calls behind [`Destination`]: synchronous, run on blocking threads.
impl LocalDestination {
    fn check_writable_now(&self) -> Result<()> {
        let shown = self.shown(&self.root);
        if self.root.exists() && !self.root.is_dir() {
            return Err(Error::config(format!(
                "--to {shown} is a file, not a directory: choose a directory for the output."
            )));
        }
        fs::create_dir_all(&self.root)
            .map_err(|e| io_error(&e, "create the output directory", &shown))?;
        let probe = self
            .root
            .join(format!(".sluice-write-test-{:016x}", rand::random::<u64>()));
        fs::write(&probe, b"ok").map_err(|e| io_error(&e, "write into", &shown))?;
        fs::remove_file(&probe).map_err(|e| io_error(&e, "remove a test file in", &shown))?;
        Ok(())
    }

    fn put_now(&self, path: &str, data: &[u8]) -> Result<()> {
        let mut w = self.create(path)?;
        let shown = self.shown(&self.full(path));
        w.write_all(data)
            .map_err(|e| io_error(&e, "write", &shown))?;
        w.commit()
    }

    fn get_now(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let full = self.full(path);
        match fs::read(&full) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error(&e, "read", &self.shown(&full))),
        }
    }

    fn size_now(&self, path: &str) -> Result<Option<u64>> {
        let full = self.full(path);
        match fs::metadata(&full) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error(&e, "inspect", &self.shown(&full))),
        }
    }

    fn list_now(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let mut out = Vec::new();
        let start = self.full(prefix);
        let mut stack = vec![start];
        while let Some(dir) = stack.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error(&e, "list", &self.shown(&dir))),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io_error(&e, "list", &self.shown(&dir)))?;
                let path = entry.path();
                let meta = entry
                    .metadata()
                    .map_err(|e| io_error(&e, "inspect", &self.shown(&path)))?;
                if meta.is_dir() {
                    stack.push(path);
                } else if let Ok(rel) = path.strip_prefix(&self.root) {
                    let rel = rel
                        .components()
                        .map(|c| c.as_os_str().to_string_lossy())
                        .collect::<Vec<_>>()
                        .join("/");
                    out.push(ObjectInfo {
                        path: rel,
                        size: meta.len(),
                    });
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn delete_now(&self, path: &str) -> Result<()> {
        let full = self.full(path);
        match fs::remove_file(&full) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&e, "delete", &self.shown(&full))),
        }
    }
}

#[async_trait]
impl Destination for LocalDestination {
    fn display(&self) -> String {
        self.root.display().to_string()
    }

    async fn check_writable(&self) -> Result<()> {
        let d = self.clone();
        on_blocking(move || d.check_writable_now()).await
    }

    fn create(&self, path: &str) -> Result<Box<dyn ObjectWriter>> {
        let target = self.full(path);
        let shown = self.shown(&target);
        if let Some(dir) = target.parent() {
            fs::create_dir_all(dir).map_err(|e| io_error(&e, "create directory for", &shown))?;
        }
        let temp = temp_for(&target);
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(|e| io_error(&e, "create", &shown))?;
        Ok(Box::new(LocalWriter {
            file: Some(BufWriter::with_capacity(WRITE_BUFFER, file)),
            temp,
            target,
            fsync: self.fsync,
        }))
    }

    async fn put(&self, path: &str, data: Vec<u8>) -> Result<()> {
        let (d, path) = (self.clone(), path.to_string());
        on_blocking(move || d.put_now(&path, &data)).await
    }

    async fn get(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let (d, path) = (self.clone(), path.to_string());
        on_blocking(move || d.get_now(&path)).await
    }

    async fn size(&self, path: &str) -> Result<Option<u64>> {
        let (d, path) = (self.clone(), path.to_string());
        on_blocking(move || d.size_now(&path)).await
    }

    fn read_range(&self, path: &str, start: u64, len: usize) -> Result<Vec<u8>> {
        use std::io::{Read, Seek, SeekFrom};
        let full = self.full(path);
        let shown = self.shown(&full);
        let mut f = File::open(&full).map_err(|e| io_error(&e, "open", &shown))?;
        f.seek(SeekFrom::Start(start))
            .map_err(|e| io_error(&e, "seek in", &shown))?;
        let mut out = Vec::with_capacity(len);
        f.take(len as u64)
            .read_to_end(&mut out)
            .map_err(|e| io_error(&e, "read", &shown))?;
        Ok(out)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let (d, prefix) = (self.clone(), prefix.to_string());
        on_blocking(move || d.list_now(&prefix)).await
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let (d, path) = (self.clone(), path.to_string());
        on_blocking(move || d.delete_now(&path)).await
    }

    async fn lock(&self, holder: &LockHolder) -> Result<Arc<dyn OutputLock>> {
        let (d, holder) = (self.clone(), holder.clone());
        on_blocking(move || d.take_lock(&holder)).await
    }

    fn lock_lives_with_process(&self) -> bool {
        true
    }
}

/// The output's lock on local disk: an advisory `flock` on `_sluice/lock.json`, which the
/// kernel releases when the holding process ends, however it ends.
struct FileLock {
    file: Mutex<Option<File>>,
}

#[async_trait]
impl OutputLock for FileLock {
    fn check(&self) -> Result<()> {
        Ok(())
    }

    async fn release(&self) {
        self.unlock();
    }
}

impl FileLock {
    fn unlock(&self) {
        if let Ok(mut slot) = self.file.lock()
            && let Some(f) = slot.take()
        {
            // Emptied so nobody reads a finished run as the holder; closing unlocks.
            let _ = f.set_len(0);
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        self.unlock();
    }
}

/// Take an exclusive advisory lock on `file` without waiting: `Ok(false)` when another open
/// file holds it. Released when the file is closed (by the kernel, however the process ends).
#[allow(unsafe_code)]
fn try_flock(file: &File) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock only reads the descriptor number, which `file` keeps open during the call.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

impl LocalDestination {
    fn take_lock(&self, holder: &LockHolder) -> Result<Arc<dyn OutputLock>> {
        let path = self.full(LOCK);
        let shown = self.shown(&path);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| io_error(&e, "create directory for", &shown))?;
        }
        // The file is never removed, so the inode check only guards against someone else
        // replacing it by hand between our open and our lock.
        for _ in 0..3 {
            let mut file = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| io_error(&e, "open", &shown))?;
            match try_flock(&file) {
                Ok(true) => {}
                Ok(false) => {
                    let mut text = Vec::new();
                    let _ = file.read_to_end(&mut text);
                    return Err(held_by(
                        &self.display(),
                        LockHolder::from_bytes(&text).as_ref(),
                        "",
                    ));
                }
                Err(e) => {
                    return Err(io_error(&e, "lock", &shown).context(
                        "the output directory's file system does not support file locks; \
                         write to a local file system",
                    ));
                }
            }
            let same = match (file.metadata(), fs::metadata(&path)) {
                (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                _ => false,
            };
            if !same {
                continue;
            }
            let mut previous = Vec::new();
            let _ = file.read_to_end(&mut previous);
            if let Some(dead) = LockHolder::from_bytes(&previous) {
                tracing::info!(
                    "took over the lock of {}, which is no longer running",
                    dead.describe()
                );
            }
            file.set_len(0)
                .and_then(|()| file.rewind())
                .and_then(|()| file.write_all(&holder.to_bytes()))
                .and_then(|()| file.sync_all())
                .map_err(|e| io_error(&e, "write", &shown))?;
            return Ok(Arc::new(FileLock {
                file: Mutex::new(Some(file)),
            }));
        }
        Err(Error::config(format!(
            "{shown} keeps being replaced while sluice tries to lock it; make sure no other \
             program manages that file."
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("sluice-local-{:016x}", rand::random::<u64>()));
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[tokio::test]
    async fn files_appear_only_on_commit() {
        let root = tmpdir();
        let dest = LocalDestination::new(&root, true);
        let mut w = dest.create("a/part-00000.csv").unwrap();
        w.write_all(b"x,y\n").unwrap();
        assert!(!root.join("a/part-00000.csv").exists());
        let hidden: Vec<_> = dest.list("a").await.unwrap();
        assert_eq!(hidden.len(), 1);
        assert!(
            hidden[0].path.starts_with("a/.part-00000.csv."),
            "{hidden:?}"
        );
        w.commit().unwrap();
        assert_eq!(fs::read(root.join("a/part-00000.csv")).unwrap(), b"x,y\n");
        assert_eq!(
            dest.list("").await.unwrap().len(),
            1,
            "the temporary is gone"
        );
        fs::remove_dir_all(root).unwrap();
    }

    #[tokio::test]
    async fn dropped_writer_leaves_nothing() {
        let root = tmpdir();
        let dest = LocalDestination::new(&root, false);
        {
            let mut w = dest.create("b/part-00001.parquet").unwrap();
            w.write_all(b"partial").unwrap();
        }
        assert!(dest.list("").await.unwrap().is_empty());
        dest.put("m.json", b"{}".to_vec()).await.unwrap();
        assert_eq!(dest.get("m.json").await.unwrap().unwrap(), b"{}");
        assert!(dest.get("missing").await.unwrap().is_none());
        dest.delete("m.json").await.unwrap();
        dest.delete("m.json").await.unwrap();
        fs::remove_dir_all(root).unwrap();
    }

    #[tokio::test]
    async fn one_holder_at_a_time_and_a_released_lock_is_free() {
        let root = tmpdir();
        let dest = LocalDestination::new(&root, false);
        let now = chrono::Utc::now().to_rfc3339();
        let first = dest
            .lock(&LockHolder::this_process("first", &now))
            .await
            .unwrap();
        let refused = dest
            .lock(&LockHolder::this_process("second", &now))
            .await
            .err()
            .unwrap();
        assert!(refused.to_string().contains("run first"), "{refused}");
        first.release().await;
        let second = dest
            .lock(&LockHolder::this_process("second", &now))
            .await
            .unwrap();
        second.check().unwrap();
        drop(second);
        fs::remove_dir_all(root).unwrap();
    }
}
