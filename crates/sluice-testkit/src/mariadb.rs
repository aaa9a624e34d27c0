//! A throwaway MariaDB (Debian's `mariadb-server`) for tests, scripts and benchmarks: its own
//! temporary directory, 127.0.0.1 on a free port, stopped and deleted when dropped. MariaDB
//! refuses to run as root, so when this process is root it runs as the `mysql` user (created by
//! Debian's package).

use crate::server::{as_server_user, free_port, is_root, run};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A MySQL-family server's directory before its start: a temporary directory, a free loopback
/// port, the socket's and `my.cnf`'s paths, and a `tmp` of the server's own (servers installed
/// at the same time in the shared /tmp removed each other's temporary tables, and
/// `mariadb-install-db` then failed).
pub(crate) struct ServerDir {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) port: u16,
    pub(crate) socket: PathBuf,
    pub(crate) cnf: PathBuf,
    pub(crate) tmp: PathBuf,
}

/// Whether the server on `socket` answers `admin` (`mariadb-admin`, `mysqladmin`)'s ping.
pub(crate) fn pings(admin: &Path, socket: &Path) -> bool {
    Command::new(admin)
        .arg("--no-defaults")
        .arg(format!("--socket={}", socket.display()))
        .args(["-u", "root", "ping"])
        .output()
        .is_ok_and(|o| o.status.success())
}

impl ServerDir {
    /// A new one, its directory named `prefix…`.
    pub(crate) fn new(prefix: &str) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp)?;
        Ok(ServerDir {
            port: free_port()?,
            socket: dir.path().join("mysqld.sock"),
            cnf: dir.path().join("my.cnf"),
            tmp,
            dir,
        })
    }
}

/// Password of the test user [`MariadbServer::USER`] (loopback-only throwaway server).
pub const MARIADB_PASSWORD: &str = "sluice-test-pw";

/// A running throwaway MariaDB (Debian's `mariadb-server`).
pub struct MariadbServer {
    dir: tempfile::TempDir,
    child: std::process::Child,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
}

impl MariadbServer {
    /// The test user: all privileges, with a password, from 127.0.0.1.
    pub const USER: &'static str = "sluice";

    /// `mariadb-install-db` + start `mariadbd`, with a binary log in row format (for snapshot
    /// positions and, later, CDC), and durability off (a test server needs speed, not crash
    /// safety). Then create [`Self::USER`] with [`MARIADB_PASSWORD`].
    pub fn start() -> Result<Self> {
        Self::start_with(None, "")
    }

    /// [`Self::start`] with `settings` appended to the `[mysqld]` section (later lines win),
    /// for tests of a server configured otherwise (e.g. `binlog_format=STATEMENT`).
    pub fn start_with_settings(settings: &str) -> Result<Self> {
        Self::start_with(None, settings)
    }

    /// Like [`Self::start`], with TLS from `pki`'s certificate for
    /// [`crate::tls::NAMED_HOST`] and `require_secure_transport = ON`: TCP sessions must use
    /// TLS (the Unix socket, used for setup, counts as secure). The user
    /// [`crate::tls::CLIENT_USER`] (no password, `REQUIRE X509`) logs in by client certificate.
    pub fn start_tls(pki: &crate::tls::TestPki) -> Result<Self> {
        Self::start_with(Some(pki), "")
    }

    fn start_with(pki: Option<&crate::tls::TestPki>, settings: &str) -> Result<Self> {
        let d = ServerDir::new("sluice-mariadb-")?;
        let (dir, port, socket, cnf, tmp) = (d.dir, d.port, d.socket, d.cnf, d.tmp);
        let data = dir.path().join("data");
        std::fs::write(
            &cnf,
            format!(
                "[mysqld]\ndatadir={}\nsocket={}\nport={port}\nbind-address=127.0.0.1\n\
                 pid-file={}\nlog-error={}\ntmpdir={}\nlog-bin=mariadb-bin\nserver-id=1\n\
                 binlog_format=ROW\nbinlog_row_image=FULL\nbinlog_row_metadata=FULL\ninnodb_buffer_pool_size=256M\n\
                 innodb_log_file_size=128M\ninnodb_flush_log_at_trx_commit=0\nsync_binlog=0\n\
                 skip-name-resolve\nmax_connections=200\ncharacter-set-server=utf8mb4\n\
                 collation-server=utf8mb4_bin\nsecure-file-priv=\n{settings}",
                data.display(),
                socket.display(),
                dir.path().join("mariadbd.pid").display(),
                dir.path().join("error.log").display(),
                tmp.display(),
            ),
        )?;
        if let Some(pki) = pki {
            for (from, to) in [
                (pki.named_server_cert(), "server.crt"),
                (pki.named_server_key(), "server.key"),
                (pki.ca(), "ca.crt"),
            ] {
                std::fs::copy(&from, dir.path().join(to))
                    .with_context(|| format!("copying {}", from.display()))?;
            }
            crate::server::append(
                &cnf,
                &format!(
                    "ssl_cert={d}/server.crt\nssl_key={d}/server.key\nssl_ca={d}/ca.crt\n\
                     require_secure_transport=ON\n",
                    d = dir.path().display()
                ),
            )?;
        }
        if is_root() {
            run(
                Command::new("chown").arg("-R").arg("mysql").arg(dir.path()),
                "chown of the server directory",
            )?;
        }
        let defaults = format!("--defaults-file={}", cnf.display());
        let mut install = Command::new("mariadb-install-db");
        install
            .arg(&defaults)
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
        if is_root() {
            install.arg("--user=mysql");
        }
        if let Err(e) = run(&mut install, "mariadb-install-db") {
            // Its log goes with the temporary directory: keep its end in the error.
            let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(e.context(format!(
                "MariaDB's mariadb-install-db failed or is missing: install Debian's \
                 mariadb-server package (scripts/test does). The end of its error log:\n{}",
                tail.join("\n")
            )));
        }
        let child = as_server_user(Path::new("/usr/sbin/mariadbd"), "mysql")
            .arg(&defaults)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting /usr/sbin/mariadbd")?;
        let server = MariadbServer { dir, child, port };
        server.wait_ready(&socket)?;
        let mut sql = format!(
            "CREATE USER '{u}'@'127.0.0.1' IDENTIFIED BY '{MARIADB_PASSWORD}'; \
             GRANT ALL PRIVILEGES ON *.* TO '{u}'@'127.0.0.1' WITH GRANT OPTION;",
            u = Self::USER
        );
        if pki.is_some() {
            sql.push_str(&format!(
                "CREATE USER '{c}'@'127.0.0.1' REQUIRE X509; \
                 GRANT ALL PRIVILEGES ON *.* TO '{c}'@'127.0.0.1';",
                c = crate::tls::CLIENT_USER
            ));
        }
        run(
            Command::new("mariadb")
                .arg("--no-defaults")
                .arg(format!("--socket={}", socket.display()))
                .args(["-u", "root", "-e", &sql]),
            "creating the MariaDB test user",
        )?;
        Ok(server)
    }

    /// A replica of this server: a new server (`server-id=2`) replicating from this one's
    /// current binary log position, so databases created from now on (every test's) reach it.
    /// Tests read its lag (`SHOW SLAVE STATUS`) and stop its SQL thread
    /// (`STOP SLAVE SQL_THREAD`).
    pub fn start_replica(&self) -> Result<Self> {
        let status = Command::new("mariadb")
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.socket().display()))
            .args(["-u", "root", "-N", "-B", "-e", "SHOW MASTER STATUS"])
            .output()
            .context("asking the primary for its binary log position")?;
        let text = String::from_utf8_lossy(&status.stdout).into_owned();
        let mut fields = text.split_whitespace();
        let (Some(file), Some(pos)) = (fields.next(), fields.next()) else {
            bail!("the primary has no binary log position: {text:?}");
        };
        let replica = Self::start_with(None, "server-id=2\nread_only=ON\n")?;
        let sql = format!(
            "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, MASTER_USER='{}', \
             MASTER_PASSWORD='{MARIADB_PASSWORD}', MASTER_LOG_FILE='{file}', \
             MASTER_LOG_POS={pos}, MASTER_USE_GTID=no; START SLAVE;",
            self.port,
            Self::USER
        );
        run(
            Command::new("mariadb")
                .arg("--no-defaults")
                .arg(format!("--socket={}", replica.socket().display()))
                .args(["-u", "root", "-e", &sql]),
            "starting the MariaDB replica",
        )?;
        Ok(replica)
    }

    fn socket(&self) -> std::path::PathBuf {
        self.dir.path().join("mysqld.sock")
    }

    fn wait_ready(&self, socket: &Path) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if pings(Path::new("mariadb-admin"), socket) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let log = std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default();
        bail!(
            "MariaDB did not accept connections on port {} within 60 s; error log:\n{log}",
            self.port
        )
    }

    /// URL of `root` through the Unix socket (for setting up a server that requires secure
    /// transport; the socket counts as secure).
    pub fn socket_url(&self) -> String {
        format!(
            "mysql://root@localhost/mysql?socket={}",
            self.dir.path().join("mysqld.sock").display()
        )
    }

    /// URL of the test user, without a database (tests add their own).
    pub fn url(&self) -> String {
        format!(
            "mysql://{}:{MARIADB_PASSWORD}@127.0.0.1:{}/mysql",
            Self::USER,
            self.port
        )
    }

    /// Stop the server now (also done on drop): SIGKILL to `mariadbd` (found by its pid file,
    /// since under `runuser` the child is not the server itself), as the data is thrown away.
    pub fn stop(&mut self) {
        let pid_file = self.dir.path().join("mariadbd.pid");
        if let Some(pid) = std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            kill_now(pid);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for MariadbServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[allow(unsafe_code)]
fn kill_now(pid: i32) {
    if pid > 1 {
        // SAFETY: kill(2) with a positive pid read from the server's own pid file; it touches
        // no memory of this process.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}
