//! `sluice-testkit run [--pg] [--pg-tls] [--mariadb] [--mariadb-tls] [--firebird] [--s3] [--gcs]
//! [--azure] -- COMMAND …`: start throwaway servers, run COMMAND with their URLs in the
//! environment (`SLUICE_TEST_PG_URL`, `SLUICE_TEST_MYSQL_URL`, `SLUICE_TEST_S3_URL`… and each
//! cloud's credential variables; for `--firebird` an embedded runtime, see
//! `sluice_testkit::firebird`; for the TLS servers `SLUICE_TEST_PG_TLS_URL`,
//! `SLUICE_TEST_PG_TLS_SOCKET_URL`, `SLUICE_TEST_MYSQL_TLS_URL`,
//! `SLUICE_TEST_MYSQL_TLS_SOCKET_URL` and `SLUICE_TEST_TLS_DIR`, the certificates they use),
//! stop and delete the servers, and exit with COMMAND's status. Used by scripts/test,
//! scripts/demo and bench/run.

use anyhow::{Context, Result, bail};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    match run() {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("sluice-testkit: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run() -> Result<u8> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(split) = args.iter().position(|a| a == "--") else {
        bail!(
            "usage: sluice-testkit run [--pg] [--pg-tls] [--mariadb] [--mariadb-tls] [--firebird] [--s3] [--gcs] [--azure] -- COMMAND [ARGS…]"
        );
    };
    let (opts, cmd) = (&args[..split], &args[split + 1..]);
    if opts.first().map(String::as_str) != Some("run") || cmd.is_empty() {
        bail!(
            "usage: sluice-testkit run [--pg] [--pg-tls] [--mariadb] [--mariadb-tls] [--firebird] [--s3] [--gcs] [--azure] -- COMMAND [ARGS…]"
        );
    }
    let mut command = Command::new(&cmd[0]);
    command.args(&cmd[1..]);
    let mut servers = Vec::new();
    let mut runtimes = Vec::new();
    let mut emulators = Vec::new();
    let mut pki: Option<(tempfile::TempDir, sluice_testkit::tls::TestPki)> = None;
    for o in &opts[1..] {
        if matches!(o.as_str(), "--pg-tls" | "--mariadb-tls") && pki.is_none() {
            let dir = tempfile::Builder::new().prefix("sluice-tls-").tempdir()?;
            let certs = sluice_testkit::tls::TestPki::generate(dir.path())
                .context("generating test certificates")?;
            command.env(sluice_testkit::tls::DIR_VAR, dir.path());
            pki = Some((dir, certs));
        }
        let certs = pki.as_ref().map(|(_, c)| c);
        match o.as_str() {
            "--pg" => {
                let pg =
                    sluice_testkit::server::PgServer::start().context("starting PostgreSQL")?;
                eprintln!("sluice-testkit: PostgreSQL on 127.0.0.1:{}", pg.port);
                command.env("SLUICE_TEST_PG_URL", pg.url());
                servers.push(Server::Pg(pg));
            }
            "--pg-tls" => {
                let certs = certs.context("no certificates")?;
                let pg = sluice_testkit::server::PgServer::start_tls(certs)
                    .context("starting PostgreSQL with TLS")?;
                pg.create_tls_users()?;
                eprintln!(
                    "sluice-testkit: PostgreSQL (TLS only) on 127.0.0.1:{}",
                    pg.port
                );
                command.env(
                    "SLUICE_TEST_PG_TLS_URL",
                    format!("postgres://postgres@localhost:{}/postgres", pg.port),
                );
                command.env("SLUICE_TEST_PG_TLS_SOCKET_URL", pg.socket_url());
                servers.push(Server::Pg(pg));
            }
            "--mariadb-tls" => {
                let certs = certs.context("no certificates")?;
                let m = sluice_testkit::mariadb::MariadbServer::start_tls(certs)
                    .context("starting MariaDB with TLS")?;
                eprintln!(
                    "sluice-testkit: MariaDB (secure transport required) on 127.0.0.1:{}",
                    m.port
                );
                command.env("SLUICE_TEST_MYSQL_TLS_URL", m.url());
                command.env("SLUICE_TEST_MYSQL_TLS_SOCKET_URL", m.socket_url());
                servers.push(Server::Mariadb(m));
            }
            "--mariadb" => {
                let m =
                    sluice_testkit::mariadb::MariadbServer::start().context("starting MariaDB")?;
                eprintln!("sluice-testkit: MariaDB on 127.0.0.1:{}", m.port);
                command.env("SLUICE_TEST_MYSQL_URL", m.url());
                servers.push(Server::Mariadb(m));
            }
            "--firebird" => {
                let fb = sluice_testkit::firebird::Runtime::prepare()
                    .context("preparing the embedded Firebird runtime")?;
                eprintln!(
                    "sluice-testkit: embedded Firebird in {}",
                    fb.root().display()
                );
                command.envs(fb.env());
                runtimes.push(fb);
            }
            "--s3" | "--gcs" | "--azure" => {
                use sluice_testkit::objstore::{Emulator, Store};
                let store = match o.as_str() {
                    "--s3" => Store::S3,
                    "--gcs" => Store::Gcs,
                    _ => Store::Azure,
                };
                let em = Emulator::start(store)
                    .with_context(|| format!("starting the {store:?} emulator"))?;
                eprintln!(
                    "sluice-testkit: {store:?} emulator on 127.0.0.1:{}",
                    em.port
                );
                command.envs(em.env());
                emulators.push(em);
            }
            other => bail!("unknown option {other}"),
        }
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("running {}", cmd[0]))?;
    // Ctrl-C reaches the child (same process group); this process must outlive it to stop the
    // servers, so it ignores the signal itself — after the spawn, so the child does not inherit
    // the disposition.
    ignore_interrupts();
    let status = child.wait()?;
    drop(servers);
    drop(runtimes);
    drop(emulators);
    drop(pki);
    Ok(status.code().map(|c| c.clamp(0, 255) as u8).unwrap_or(1))
}

/// A server kept alive (and stopped on drop) while the command runs.
#[allow(dead_code)]
enum Server {
    Pg(sluice_testkit::server::PgServer),
    Mariadb(sluice_testkit::mariadb::MariadbServer),
}

#[allow(unsafe_code)]
fn ignore_interrupts() {
    // SAFETY: installing SIG_IGN for SIGINT/SIGTERM has no memory-safety preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
}
