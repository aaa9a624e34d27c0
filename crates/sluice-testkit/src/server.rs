//! Throwaway database servers.
//!
//! A server lives in a temporary directory, listens on 127.0.0.1 on a free port, and is
//! stopped and deleted when its handle is dropped. PostgreSQL refuses to run as root, so when
//! this process is root the server runs as the `postgres` user (created by Debian's package).

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

pub(crate) fn is_root() -> bool {
    euid() == 0
}

#[allow(unsafe_code)]
fn euid() -> u32 {
    // SAFETY: geteuid() takes no arguments, cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// A command that runs as the server's user.
pub(crate) fn as_server_user(program: &Path, user: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.arg("-u").arg(user).arg("--").arg(program);
        c
    } else {
        Command::new(program)
    }
}

pub(crate) fn run(c: &mut Command, what: &str) -> Result<()> {
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

/// Start the server of data directory `data` with `pg_ctl` from `bin` as `user`, logging into
/// `dir/server.log`; a failed start's error carries that log.
fn pg_ctl_start(bin: &Path, user: &str, data: &Path, dir: &Path, what: &str) -> Result<()> {
    let log = dir.join("server.log");
    let mut start = as_server_user(&bin.join("pg_ctl"), user);
    start
        .arg("-D")
        .arg(data)
        .arg("-l")
        .arg(&log)
        .args(["-w", "-t", "60", "start"]);
    if let Err(e) = run(&mut start, what) {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        bail!("{e}\nserver log:\n{log}");
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

/// The password user of a TLS server ([`PgServer::create_tls_users`]).
pub const TLS_PASSWORD_USER: &str = "pwuser";

/// Its password (a throwaway loopback server's).
pub const TLS_PASSWORD: &str = "tls-test-pw-7c1e";

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
        Self::start_with(None)
    }

    /// Like [`Self::start`], but with `ssl = on` using `pki`'s server certificate, and TCP
    /// connections accepted only over TLS (`hostssl`): the `postgres` superuser by trust, the
    /// user [`crate::tls::CLIENT_USER`] by client certificate (`cert`), every other user by
    /// SCRAM password. Unix-socket sessions (for test setup) are trusted.
    /// [`Self::create_tls_users`] makes the two test users.
    pub fn start_tls(pki: &crate::tls::TestPki) -> Result<Self> {
        Self::start_with(Some(pki))
    }

    /// [`Self::start`] with `settings` appended to `postgresql.conf` (later lines win), for
    /// tests of a server configured otherwise (e.g. `wal_level = replica`).
    pub fn start_with_settings(settings: &str) -> Result<Self> {
        Self::start_with_conf(None, settings)
    }

    fn start_with(pki: Option<&crate::tls::TestPki>) -> Result<Self> {
        Self::start_with_conf(pki, "")
    }

    fn start_with_conf(pki: Option<&crate::tls::TestPki>, settings: &str) -> Result<Self> {
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
        append(&data.join("postgresql.conf"), settings)?;
        let hba = match pki {
            None => "local all all trust\nhost all postgres 127.0.0.1/32 trust\n\
                     host replication postgres 127.0.0.1/32 trust\n\
                     host all all 127.0.0.1/32 scram-sha-256\n\
                     host replication all 127.0.0.1/32 scram-sha-256\n"
                .to_string(),
            Some(pki) => {
                for (from, to) in [
                    (pki.server_cert(), "server.crt"),
                    (pki.server_key(), "server.key"),
                    (pki.ca(), "ca.crt"),
                ] {
                    std::fs::copy(&from, data.join(to))
                        .with_context(|| format!("copying {}", from.display()))?;
                }
                append(
                    &data.join("postgresql.conf"),
                    "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
                     ssl_ca_file = 'ca.crt'\n",
                )?;
                format!(
                    "local all all trust\nhostssl all postgres 127.0.0.1/32 trust\n\
                     hostssl all {} 127.0.0.1/32 cert\nhostssl all all 127.0.0.1/32 scram-sha-256\n",
                    crate::tls::CLIENT_USER
                )
            }
        };
        std::fs::write(data.join("pg_hba.conf"), hba)?;
        if is_root() {
            for f in ["pg_hba.conf", "server.crt", "server.key", "ca.crt"] {
                if data.join(f).exists() {
                    run(
                        Command::new("chown").arg("postgres").arg(data.join(f)),
                        "chown of the server's files",
                    )?;
                }
            }
        }
        pg_ctl_start(&bin, &user, &data, dir.path(), "pg_ctl start")?;
        let server = PgServer {
            dir,
            bin,
            port,
            user,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// A streaming replica of this server: `pg_basebackup` of it (with the standby's
    /// settings, `-R`), started on a port of its own with hot standby on, so tests can read
    /// its replay lag and pause its replay (`pg_wal_replay_pause()`).
    pub fn start_replica(&self) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("sluice-pg-replica-")
            .tempdir()?;
        if is_root() {
            run(
                Command::new("chown")
                    .arg("-R")
                    .arg(&self.user)
                    .arg(dir.path()),
                "chown of the replica's directory",
            )?;
        }
        let data = dir.path().join("data");
        let mut backup = as_server_user(&self.bin.join("pg_basebackup"), &self.user);
        backup
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .arg("-D")
            .arg(&data)
            .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]);
        run(&mut backup, "pg_basebackup")?;
        let port = free_port()?;
        append(
            &data.join("postgresql.conf"),
            &format!(
                "\nport = {port}\nunix_socket_directories = '{}'\nhot_standby = on\n",
                dir.path().display()
            ),
        )?;
        pg_ctl_start(
            &self.bin,
            &self.user,
            &data,
            dir.path(),
            "pg_ctl start (replica)",
        )?;
        let replica = PgServer {
            dir,
            bin: self.bin.clone(),
            port,
            user: self.user.clone(),
        };
        replica.wait_ready()?;
        Ok(replica)
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

    /// Superuser URL of the `postgres` database through the Unix socket (never TLS; how tests
    /// set up a server that accepts TCP only over TLS).
    pub fn socket_url(&self) -> String {
        format!(
            "postgres://postgres@/postgres?host={}&port={}",
            self.dir.path().display(),
            self.port
        )
    }

    /// Create the users of a TLS server: [`crate::tls::CLIENT_USER`] (client certificate) and
    /// [`TLS_PASSWORD_USER`] with [`TLS_PASSWORD`], both able to read every table.
    pub fn create_tls_users(&self) -> Result<()> {
        let sql = format!(
            "CREATE ROLE {cert} LOGIN; GRANT pg_read_all_data TO {cert}; \
             CREATE ROLE {pw} LOGIN PASSWORD '{TLS_PASSWORD}'; GRANT pg_read_all_data TO {pw};",
            cert = crate::tls::CLIENT_USER,
            pw = TLS_PASSWORD_USER
        );
        run(
            Command::new(self.bin.join("psql"))
                .arg("-h")
                .arg(self.dir.path())
                .arg("-p")
                .arg(self.port.to_string())
                .args([
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-c",
                ])
                .arg(&sql),
            "creating the TLS test users",
        )
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

pub(crate) fn append(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
    f.write_all(text.as_bytes())?;
    Ok(())
}
