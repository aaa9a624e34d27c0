//! A throwaway MySQL 9 (Oracle's server, not MariaDB) for tests, scripts and benchmarks: its own
//! temporary directory, 127.0.0.1 on a free port, stopped and deleted when dropped; and what
//! tests use of it ([`server_url`], [`test_db`]).
//!
//! Debian's stable releases carry no MySQL: `ensure_mysql9` of `scripts/lib/common.sh` unpacks
//! Debian sid's under `~/.cache/sluice/mysql9` (`SLUICE_MYSQL9_HOME` overrides), whose `bin/`
//! runs each program through sid's own loader and libraries. The server is set up as a change
//! capture source is: binary log in ROW format with full metadata, GTIDs on.
//!
//! MySQL 9 has no `mysql_native_password`: the test user has `caching_sha2_password`. Over
//! plain TCP its first full authentication needs the server's RSA public key, which the driver
//! asks for (mysql_async does) and the server generates at initialisation, along with
//! self-signed TLS certificates in its data directory: a client may use TLS too, but cannot
//! verify the server (no CA is handed out).
//!
//! When this process is root the server runs as root (`user=root`): the installation is under
//! root's home, which the `mysql` user may not read.

use crate::mariadb::{ServerDir, pings};
use crate::server::{is_root, run};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The variable `sluice-testkit run --mysql` sets to the test user's URL.
pub const URL_VAR: &str = "SLUICE_TEST_MYSQL9_URL";

/// Password of the test user [`Mysql9Server::USER`] (loopback-only throwaway server).
pub const MYSQL9_PASSWORD: &str = "sluice-test-pw";

/// Where the MySQL 9 installation is: `$SLUICE_MYSQL9_HOME`, else `~/.cache/sluice/mysql9`
/// (checked: its `bin/mysqld` must exist).
pub fn home() -> Result<PathBuf> {
    let dir = match std::env::var_os("SLUICE_MYSQL9_HOME") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?)
            .join(".cache/sluice/mysql9"),
    };
    if !dir.join("bin/mysqld").exists() {
        bail!(
            "MySQL 9 is not installed in {}: run ./scripts/test, which installs it, or \
             `bash -c 'source scripts/lib/common.sh && ensure_mysql9'` (SLUICE_MYSQL9_HOME \
             chooses another directory)",
            dir.display()
        );
    }
    Ok(dir)
}

/// A running throwaway MySQL 9.
pub struct Mysql9Server {
    dir: tempfile::TempDir,
    bin: PathBuf,
    child: Child,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// The server's `VERSION()`, e.g. `9.7.4-2`.
    pub version: String,
}

impl Mysql9Server {
    /// The test user: all privileges, with a password, from 127.0.0.1.
    pub const USER: &'static str = "sluice";

    /// `mysqld --initialize-insecure` + start `mysqld`, with a binary log in ROW format with
    /// full metadata and GTIDs on (for snapshot positions and change capture), and durability
    /// off (a test server needs speed, not crash safety). Then create [`Self::USER`] with
    /// [`MYSQL9_PASSWORD`].
    pub fn start() -> Result<Self> {
        Self::start_with_settings("")
    }

    /// [`Self::start`] with `settings` appended to the `[mysqld]` section (later lines win),
    /// for tests of a server configured otherwise (e.g. `gtid_mode=OFF`).
    pub fn start_with_settings(settings: &str) -> Result<Self> {
        let home = home()?;
        let bin = home.join("bin");
        let share = home.join("root/usr/share/mysql");
        let d = ServerDir::new("sluice-mysql9-")?;
        let (dir, port, socket, cnf, tmp) = (d.dir, d.port, d.socket, d.cnf, d.tmp);
        // The compiled-in paths (/usr/share/mysql, /usr/lib/mysql/plugin) are the system's,
        // where MariaDB's files may be: every one points into the unpacked tree instead.
        // `mysqlx=OFF`: the X Protocol would listen on a second port (33060) that is not free
        // for every server. `secure_file_priv=` (empty) lets tests load and write files.
        std::fs::write(
            &cnf,
            format!(
                "[mysqld]\n{user}basedir={usr}\nlc_messages_dir={share}\n\
                 character_sets_dir={share}/charsets\nplugin_dir={usr}/lib/mysql/plugin\n\
                 datadir={data}\nsocket={socket}\nport={port}\nbind_address=127.0.0.1\n\
                 mysqlx=OFF\npid_file={dir}/mysqld.pid\nlog_error={dir}/error.log\n\
                 tmpdir={tmp}\nsecure_file_priv=\nlog_bin=mysql-bin\nserver_id=1\n\
                 binlog_format=ROW\nbinlog_row_image=FULL\nbinlog_row_metadata=FULL\n\
                 gtid_mode=ON\nenforce_gtid_consistency=ON\ninnodb_buffer_pool_size=256M\n\
                 innodb_flush_log_at_trx_commit=0\nsync_binlog=0\nskip_name_resolve\n\
                 max_connections=200\n{settings}\n",
                user = if is_root() { "user=root\n" } else { "" },
                usr = home.join("root/usr").display(),
                share = share.display(),
                data = dir.path().join("data").display(),
                socket = socket.display(),
                dir = dir.path().display(),
                tmp = tmp.display(),
            ),
        )?;
        // `--defaults-file` must come first.
        let defaults = format!("--defaults-file={}", cnf.display());
        if let Err(e) = run(
            Command::new(bin.join("mysqld"))
                .arg(&defaults)
                .arg("--initialize-insecure"),
            "mysqld --initialize-insecure",
        ) {
            return Err(e.context(format!(
                "MySQL 9 could not initialise its data directory; the end of its error log:\n{}",
                log_tail(dir.path())
            )));
        }
        // The wrapper `exec`s the loader, which runs mysqld in the same process: the child is
        // the server itself, and killing it stops the server.
        let child = Command::new(bin.join("mysqld"))
            .arg(&defaults)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.join("mysqld").display()))?;
        let mut server = Mysql9Server {
            dir,
            bin,
            child,
            port,
            version: String::new(),
        };
        server.wait_ready(&socket)?;
        server.version = server.root_sql("SELECT VERSION()")?.trim().to_string();
        server.root_sql(&format!(
            "CREATE USER '{u}'@'127.0.0.1' IDENTIFIED WITH caching_sha2_password BY \
             '{MYSQL9_PASSWORD}'; GRANT ALL PRIVILEGES ON *.* TO '{u}'@'127.0.0.1' WITH GRANT \
             OPTION;",
            u = Self::USER
        ))?;
        Ok(server)
    }

    /// Run `sql` as `root` through the Unix socket with the `mysql` client; its output (tab
    /// separated, no column names).
    pub fn root_sql(&self, sql: &str) -> Result<String> {
        let out = Command::new(self.bin.join("mysql"))
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.socket().display()))
            .args(["-u", "root", "--batch", "--skip-column-names", "-e", sql])
            .output()
            .context("running MySQL 9's mysql client")?;
        if !out.status.success() {
            bail!(
                "{sql}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("mysqld.sock")
    }

    fn wait_ready(&mut self, socket: &Path) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "MySQL 9 exited at start ({status}); the end of its error log:\n{}",
                    log_tail(self.dir.path())
                );
            }
            if pings(&self.bin.join("mysqladmin"), socket) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!(
            "MySQL 9 did not accept connections on port {} within 60 s; the end of its error \
             log:\n{}",
            self.port,
            log_tail(self.dir.path())
        )
    }

    /// URL of `root` through the Unix socket (no password).
    pub fn socket_url(&self) -> String {
        format!(
            "mysql://root@localhost/mysql?socket={}",
            self.socket().display()
        )
    }

    /// URL of the test user, without a database (tests add their own).
    pub fn url(&self) -> String {
        format!(
            "mysql://{}:{MYSQL9_PASSWORD}@127.0.0.1:{}/mysql",
            Self::USER,
            self.port
        )
    }

    /// Stop the server now (also done on drop): SIGKILL, as the data is thrown away.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Mysql9Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last 20 lines of the server's error log (the log goes with the temporary directory).
fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// The MySQL 9 test server's URL (a user with every privilege and a password), from
/// `SLUICE_TEST_MYSQL9_URL`.
///
/// # Panics
/// When the variable is not set: a test that needs a server fails loudly, it never skips.
pub fn server_url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| {
        panic!(
            "{URL_VAR} is not set, so there is no MySQL 9 to test against. Run ./scripts/test, \
             which installs MySQL 9 and starts a throwaway server, or wrap the command in \
             `sluice-testkit run --mysql -- …`, or set {URL_VAR} to a \
             mysql://user:password@127.0.0.1:port/db URL of a disposable MySQL 9 server whose \
             user may create databases."
        )
    })
}

/// A database created for one test on the MySQL 9 test server ([`crate::mysql::TestDb`]).
pub async fn test_db() -> crate::mysql::TestDb {
    crate::mysql::TestDb::new_on(&server_url()).await
}

/// [`test_db`] for a test that hurts the whole server ([`crate::mysql::TestDb::alone`]).
pub async fn test_db_alone() -> crate::mysql::TestDb {
    crate::mysql::TestDb::alone_on(&server_url()).await
}
