//! Throwaway database servers.
//!
//! A server lives in a temporary directory, listens on 127.0.0.1 on a free port, and is
//! stopped and deleted when its handle is dropped. PostgreSQL and MariaDB refuse to run as
//! root, so when this process is root they run as the `postgres` / `mysql` users (created by
//! Debian's packages).

use anyhow::{Context, Result, bail};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A free TCP port on loopback (released before returning; a tiny race is accepted).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding a loopback port")?;
    Ok(l.local_addr()?.port())
}

fn is_root() -> bool {
    euid() == 0
}

#[allow(unsafe_code)]
fn euid() -> u32 {
    // SAFETY: geteuid() takes no arguments, cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// A command that runs as the server's user.
fn as_server_user(program: &Path, user: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.arg("-u").arg(user).arg("--").arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(c: &mut Command, what: &str) -> Result<()> {
    let out = c.output().with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Where PostgreSQL's server programs are: `$SLUICE_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin`.
pub fn pg_bin_dir() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("SLUICE_PG_BIN") {
        return Ok(PathBuf::from(p));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("PostgreSQL server binaries not found under /usr/lib/postgresql: install Debian's postgresql package (scripts/test does)")?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|v| v.parse().ok()).map(|v| (v, e.path().join("bin"))))
        .filter(|(_, p)| p.join("initdb").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, p)| p)
        .context("no PostgreSQL version with initdb under /usr/lib/postgresql")
}

/// A running throwaway PostgreSQL.
pub struct PgServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    user: String,
}

impl PgServer {
    /// initdb + start, with logical WAL (for CDC), trust for the `postgres` superuser and
    /// SCRAM passwords for every other user (so authentication failures can be tested), and
    /// durability off (a test server needs speed, not crash safety).
    pub fn start() -> Result<Self> {
        let bin = pg_bin_dir()?;
        let dir = tempfile::Builder::new().prefix("sluice-pg-").tempdir()?;
        let user = "postgres".to_string();
        if is_root() {
            run(
                Command::new("chown").arg("-R").arg(&user).arg(dir.path()),
                "chown of the server directory",
            )?;
        }
        let data = dir.path().join("data");
        let mut initdb = as_server_user(&bin.join("initdb"), &user);
        initdb.arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        run(&mut initdb, "initdb")?;
        let port = free_port()?;
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
             wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n\
             max_connections = 200\nshared_buffers = 128MB\nfsync = off\nsynchronous_commit = off\n\
             full_page_writes = off\nlog_min_messages = warning\n",
            dir.path().display()
        );
        append(&data.join("postgresql.conf"), &conf)?;
        let hba = "local all all trust\nhost all postgres 127.0.0.1/32 trust\n\
                   host replication postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n\
                   host replication all 127.0.0.1/32 scram-sha-256\n";
        std::fs::write(data.join("pg_hba.conf"), hba)?;
        if is_root() {
            run(
                Command::new("chown")
                    .arg("postgres")
                    .arg(data.join("pg_hba.conf")),
                "chown pg_hba.conf",
            )?;
        }
        let mut start = as_server_user(&bin.join("pg_ctl"), &user);
        start
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.path().join("server.log"))
            .args(["-w", "-t", "60", "start"]);
        if let Err(e) = run(&mut start, "pg_ctl start") {
            let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
            bail!("{e}\nserver log:\n{log}");
        }
        let server = PgServer {
            dir,
            bin,
            port,
            user,
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "PostgreSQL did not accept connections on port {} within 30 s",
            self.port
        )
    }

    /// Superuser URL of the `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stop the server now (also done on drop).
    pub fn stop(&self) {
        let mut stop = as_server_user(&self.bin.join("pg_ctl"), &self.user);
        stop.arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"]);
        let _ = stop.output();
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
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
        let dir = tempfile::Builder::new()
            .prefix("sluice-mariadb-")
            .tempdir()?;
        let port = free_port()?;
        let data = dir.path().join("data");
        let socket = dir.path().join("mysqld.sock");
        let cnf = dir.path().join("my.cnf");
        std::fs::write(
            &cnf,
            format!(
                "[mysqld]\ndatadir={}\nsocket={}\nport={port}\nbind-address=127.0.0.1\n\
                 pid-file={}\nlog-error={}\nlog-bin=mariadb-bin\nserver-id=1\n\
                 binlog_format=ROW\nbinlog_row_image=FULL\ninnodb_buffer_pool_size=256M\n\
                 innodb_log_file_size=128M\ninnodb_flush_log_at_trx_commit=0\nsync_binlog=0\n\
                 skip-name-resolve\nmax_connections=200\ncharacter-set-server=utf8mb4\n\
                 collation-server=utf8mb4_bin\nsecure-file-priv=\n",
                data.display(),
                socket.display(),
                dir.path().join("mariadbd.pid").display(),
                dir.path().join("error.log").display(),
            ),
        )?;
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
        run(&mut install, "mariadb-install-db").context(
            "MariaDB's mariadb-install-db failed or is missing: install Debian's mariadb-server \
             package (scripts/test does)",
        )?;
        let child = as_server_user(Path::new("/usr/sbin/mariadbd"), "mysql")
            .arg(&defaults)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting /usr/sbin/mariadbd")?;
        let server = MariadbServer { dir, child, port };
        server.wait_ready(&socket)?;
        let sql = format!(
            "CREATE USER '{u}'@'127.0.0.1' IDENTIFIED BY '{MARIADB_PASSWORD}'; \
             GRANT ALL PRIVILEGES ON *.* TO '{u}'@'127.0.0.1' WITH GRANT OPTION;",
            u = Self::USER
        );
        run(
            Command::new("mariadb")
                .arg("--no-defaults")
                .arg(format!("--socket={}", socket.display()))
                .args(["-u", "root", "-e", &sql]),
            "creating the MariaDB test user",
        )?;
        Ok(server)
    }

    fn wait_ready(&self, socket: &Path) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let ok = Command::new("mariadb-admin")
                .arg("--no-defaults")
                .arg(format!("--socket={}", socket.display()))
                .args(["-u", "root", "ping"])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if ok {
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

fn append(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
    f.write_all(text.as_bytes())?;
    Ok(())
}
