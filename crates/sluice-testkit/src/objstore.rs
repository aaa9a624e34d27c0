//! Object-storage emulators for tests: moto's S3 server, gcp-storage-emulator (GCS) and
//! Azurite (Azure Blob), each on 127.0.0.1 on a free port with its data in a temporary
//! directory, stopped when its handle is dropped.
//!
//! They are installed by `scripts/test` (`ensure_objstore_emulators` in scripts/lib/common.sh)
//! under `~/.cache/sluice/objstore`, or `$SLUICE_OBJSTORE_TOOLS`. Each server creates the
//! bucket `sluice-test` and exports, through [`Emulator::env`], the variables a client needs:
//! the cloud's standard credential and endpoint variables plus `SLUICE_TEST_S3_URL`,
//! `SLUICE_TEST_GCS_URL` or `SLUICE_TEST_AZURE_URL`.
//!
//! Emulator limits, which the tests design around: gcp-storage-emulator serves neither the
//! XML list API nor XML multipart uploads (sluice lists GCS through the JSON API; GCS tests use
//! a part size larger than their files, so every file is one `PUT`).

use crate::server::free_port;
use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The bucket (container) every emulator creates.
pub const BUCKET: &str = "sluice-test";

/// Which emulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// moto (S3).
    S3,
    /// gcp-storage-emulator (GCS).
    Gcs,
    /// Azurite (Azure Blob).
    Azure,
}

impl Store {
    /// The variable holding the store's test URL.
    pub fn url_var(self) -> &'static str {
        match self {
            Store::S3 => "SLUICE_TEST_S3_URL",
            Store::Gcs => "SLUICE_TEST_GCS_URL",
            Store::Azure => "SLUICE_TEST_AZURE_URL",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Store::S3 => "--s3",
            Store::Gcs => "--gcs",
            Store::Azure => "--azure",
        }
    }
}

/// A fresh location on the emulator of `store` for one test: its bucket URL from the
/// environment plus a random prefix (and, for GCS, a part size above any test file: see the
/// module notes).
///
/// # Panics
/// When the variable is not set: a test that needs an emulator fails loudly, it never skips.
pub fn test_url(store: Store) -> String {
    let var = store.url_var();
    let base = std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set, so there is no object-store emulator to test against. Run \
             ./scripts/test, which starts one (sluice-testkit run {} -- …).",
            store.flag()
        )
    });
    let prefix = format!("t-{:016x}", rand::random::<u64>());
    match store {
        Store::Gcs => format!("{base}/{prefix}?part_size=64MiB"),
        _ => format!("{base}/{prefix}"),
    }
}

/// Where the emulators are installed.
pub fn tools_dir() -> PathBuf {
    if let Ok(d) = std::env::var("SLUICE_OBJSTORE_TOOLS") {
        return PathBuf::from(d);
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    PathBuf::from(home).join(".cache/sluice/objstore")
}

fn tool(rel: &str) -> Result<PathBuf> {
    let p = tools_dir().join(rel);
    if !p.exists() {
        bail!(
            "{} is missing: the object-storage emulators are installed by ./scripts/test \
             (ensure_objstore_emulators in scripts/lib/common.sh)",
            p.display()
        );
    }
    Ok(p)
}

/// A running emulator.
pub struct Emulator {
    child: Child,
    _dir: tempfile::TempDir,
    /// Which store.
    pub store: Store,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
}

impl Emulator {
    /// Start the emulator of `store` and create [`BUCKET`] on it.
    pub fn start(store: Store) -> Result<Emulator> {
        let dir = tempfile::Builder::new()
            .prefix("sluice-objstore-")
            .tempdir()?;
        let port = free_port()?;
        let log = std::fs::File::create(dir.path().join("server.log"))?;
        let mut cmd = match store {
            Store::S3 => {
                let mut c = Command::new(tool("venv/bin/moto_server")?);
                c.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
                c
            }
            Store::Gcs => {
                let mut c = Command::new(tool("venv/bin/gcp-storage-emulator")?);
                c.args([
                    "start",
                    "--host=127.0.0.1",
                    &format!("--port={port}"),
                    "--in-memory",
                    &format!("--default-bucket={BUCKET}"),
                ]);
                c
            }
            Store::Azure => {
                let mut c = Command::new(tool("npm/node_modules/.bin/azurite-blob")?);
                c.args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
                    .arg("--location")
                    .arg(dir.path().join("data"))
                    .args(["--skipApiVersionCheck", "--silent"]);
                c
            }
        };
        cmd.current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting the {store:?} emulator"))?;
        let em = Emulator {
            child,
            _dir: dir,
            store,
            port,
        };
        em.wait_ready()?;
        match store {
            Store::S3 => {
                let status = http(port, "PUT", &format!("/{BUCKET}"), &[])?;
                if !(200..300).contains(&status) {
                    bail!("creating bucket {BUCKET} on moto: HTTP {status}");
                }
            }
            Store::Gcs => {}
            Store::Azure => azure_create_container(port)?,
        }
        Ok(em)
    }

    fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let log = std::fs::read_to_string(self._dir.path().join("server.log")).unwrap_or_default();
        bail!(
            "the {:?} emulator did not listen on port {} within 60 s; its log:\n{log}",
            self.store,
            self.port
        )
    }

    /// The environment a client needs: the cloud's standard variables and the test URL.
    pub fn env(&self) -> Vec<(String, String)> {
        let endpoint = format!("http://127.0.0.1:{}", self.port);
        let pairs: Vec<(&str, String)> = match self.store {
            Store::S3 => vec![
                ("AWS_ACCESS_KEY_ID", "sluice-test".into()),
                ("AWS_SECRET_ACCESS_KEY", "sluice-test-secret".into()),
                ("AWS_REGION", "us-east-1".into()),
                ("AWS_ENDPOINT_URL", endpoint),
                ("AWS_ALLOW_HTTP", "true".into()),
                ("SLUICE_TEST_S3_URL", format!("s3://{BUCKET}")),
            ],
            Store::Gcs => vec![
                // object_store's documented emulator key: no OAuth, requests go to the base URL.
                (
                    "GOOGLE_SERVICE_ACCOUNT_KEY",
                    r#"{"private_key":"unused","private_key_id":"unused","client_email":"sluice-test","disable_oauth":true}"#.into(),
                ),
                ("GOOGLE_BASE_URL", endpoint),
                ("GOOGLE_ALLOW_HTTP", "true".into()),
                ("SLUICE_TEST_GCS_URL", format!("gs://{BUCKET}")),
            ],
            Store::Azure => vec![
                ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
                ("AZURITE_BLOB_STORAGE_URL", endpoint),
                ("SLUICE_TEST_AZURE_URL", format!("az://{BUCKET}")),
            ],
        };
        pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One plain HTTP/1.1 request to 127.0.0.1:`port`; returns the status code.
fn http(port: u16, method: &str, path: &str, headers: &[(String, String)]) -> Result<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let text = String::from_utf8_lossy(&resp);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("bad HTTP response: {text}"))
}

/// Azurite's well-known development account and key.
const AZURE_ACCOUNT: &str = "devstoreaccount1";
const AZURE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Create [`BUCKET`] on Azurite: one `Create Container` request signed with Shared Key.
fn azure_create_container(port: u16) -> Result<()> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let date = chrono::Utc::now()
        .format("%a, %d %b %Y %H:%M:%S GMT")
        .to_string();
    let version = "2021-08-06";
    // VERB and eleven empty standard headers, the x-ms-* headers, the canonical resource.
    let to_sign = format!(
        "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n\
         /{AZURE_ACCOUNT}/{AZURE_ACCOUNT}/{BUCKET}\nrestype:container"
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &b64.decode(AZURE_KEY)?);
    let sig = b64.encode(ring::hmac::sign(&key, to_sign.as_bytes()).as_ref());
    let status = http(
        port,
        "PUT",
        &format!("/{AZURE_ACCOUNT}/{BUCKET}?restype=container"),
        &[
            ("x-ms-date".into(), date),
            ("x-ms-version".into(), version.into()),
            (
                "Authorization".into(),
                format!("SharedKey {AZURE_ACCOUNT}:{sig}"),
            ),
        ],
    )?;
    if !(200..300).contains(&status) {
        bail!("creating container {BUCKET} on Azurite: HTTP {status}");
    }
    Ok(())
}
