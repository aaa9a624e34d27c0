//! A throwaway Redis server for the stream's external state (`sluice stream --state redis://…`):
//! loopback, a free port, no persistence, stopped when dropped. Needs Debian's `redis-server`.

use anyhow::{Context, Result, bail};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Redis server.
pub struct RedisServer {
    /// The port on 127.0.0.1.
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Start one and wait until it accepts connections.
    pub fn start() -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("sluice-redis-").tempdir()?;
        let port = crate::server::free_port()?;
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server (Debian package redis-server)")?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("redis-server did not accept connections on port {port} within 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(RedisServer {
            port,
            child,
            _dir: dir,
        })
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test server's URL, from `SLUICE_TEST_REDIS_URL`.
///
/// # Panics
/// When the variable is not set: a test that needs a server fails loudly, it never skips.
pub fn server_url() -> String {
    std::env::var("SLUICE_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_REDIS_URL is not set, so there is no Redis to test against. Run \
             ./scripts/test, or sluice-testkit run --redis -- …"
        )
    })
}
