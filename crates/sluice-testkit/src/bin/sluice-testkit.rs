//! `sluice-testkit run [--pg] [--pg-replica] [--pg-tls] [--mariadb] [--mariadb-replica] [--mariadb-tls] [--mysql] [--firebird] [--s3]
//! [--gcs] [--azure] [--redis] -- COMMAND …`: start throwaway servers, run COMMAND with their URLs
//! in the environment (`SLUICE_TEST_PG_URL`, `SLUICE_TEST_PG_REPLICA_URL` (`--pg-replica`: a
//! streaming replica of the `--pg` server), `SLUICE_TEST_MYSQL_URL` (MariaDB),
//! `SLUICE_TEST_MYSQL_REPLICA_URL` (`--mariadb-replica`: a replica of the `--mariadb` server),
//! `SLUICE_TEST_MYSQL9_URL` (`--mysql`: MySQL 9), `SLUICE_TEST_S3_URL`… and each
//! cloud's credential variables; for `--firebird` an embedded runtime, see
//! `sluice_testkit::firebird`; for the TLS servers `SLUICE_TEST_PG_TLS_URL`,
//! `SLUICE_TEST_PG_TLS_SOCKET_URL`, `SLUICE_TEST_MYSQL_TLS_URL`,
//! `SLUICE_TEST_MYSQL_TLS_SOCKET_URL` and `SLUICE_TEST_TLS_DIR`, the certificates they use;
//! `SLUICE_TEST_REDIS_URL` for `--redis`),
//! stop and delete the servers, and exit with COMMAND's status. Used by scripts/test,
//! scripts/demo and bench/run. COMMAND also gets `SLUICE_TESTKIT`, this program's path.
//!
//! `sluice-testkit firebird-writer DB [--create N] [--accounts N] [--per-commit N]
//! [--read-committed] [--log FILE]`: the concurrent writer of Firebird consistency tests (see
//! `sluice_testkit::firebird_writer`), in a process of its own. It prints `committed N` after
//! every commit and stops, after a commit, when its standard input is closed.

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
    if args.first().map(String::as_str) == Some("firebird-writer") {
        return firebird_writer(&args[1..]);
    }
    let Some(split) = args.iter().position(|a| a == "--") else {
        bail!(
            "usage: sluice-testkit run [--pg] [--pg-replica] [--pg-tls] [--mariadb] [--mariadb-replica] [--mariadb-tls] [--mysql] [--firebird] [--s3] [--gcs] [--azure] [--redis] -- COMMAND [ARGS…]"
        );
    };
    let (opts, cmd) = (&args[..split], &args[split + 1..]);
    if opts.first().map(String::as_str) != Some("run") || cmd.is_empty() {
        bail!(
            "usage: sluice-testkit run [--pg] [--pg-replica] [--pg-tls] [--mariadb] [--mariadb-replica] [--mariadb-tls] [--mysql] [--firebird] [--s3] [--gcs] [--azure] [--redis] -- COMMAND [ARGS…]"
        );
    }
    let mut command = Command::new(&cmd[0]);
    command.args(&cmd[1..]);
    if let Ok(me) = std::env::current_exe() {
        command.env("SLUICE_TESTKIT", me);
    }
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
            "--pg-replica" => {
                let Some(Server::Pg(primary)) =
                    servers.iter().rev().find(|s| matches!(s, Server::Pg(_)))
                else {
                    bail!("--pg-replica replicates the --pg server: give --pg before it");
                };
                let replica = primary
                    .start_replica()
                    .context("starting the PostgreSQL replica")?;
                eprintln!(
                    "sluice-testkit: PostgreSQL replica of port {} on 127.0.0.1:{}",
                    primary.port, replica.port
                );
                command.env("SLUICE_TEST_PG_REPLICA_URL", replica.url());
                servers.push(Server::Pg(replica));
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
            "--mariadb-replica" => {
                let Some(Server::Mariadb(primary)) = servers
                    .iter()
                    .rev()
                    .find(|s| matches!(s, Server::Mariadb(_)))
                else {
                    bail!(
                        "--mariadb-replica replicates the --mariadb server: give --mariadb before it"
                    );
                };
                let replica = primary
                    .start_replica()
                    .context("starting the MariaDB replica")?;
                eprintln!(
                    "sluice-testkit: MariaDB replica of port {} on 127.0.0.1:{}",
                    primary.port, replica.port
                );
                command.env("SLUICE_TEST_MYSQL_REPLICA_URL", replica.url());
                servers.push(Server::Mariadb(replica));
            }
            "--mysql" => {
                let m =
                    sluice_testkit::mysql9::Mysql9Server::start().context("starting MySQL 9")?;
                eprintln!(
                    "sluice-testkit: MySQL {} on 127.0.0.1:{}",
                    m.version, m.port
                );
                command.env(sluice_testkit::mysql9::URL_VAR, m.url());
                servers.push(Server::Mysql9(m));
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
            "--redis" => {
                let r = sluice_testkit::redis::RedisServer::start().context("starting Redis")?;
                eprintln!("sluice-testkit: Redis on 127.0.0.1:{}", r.port);
                command.env("SLUICE_TEST_REDIS_URL", r.url());
                servers.push(Server::Redis(r));
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

/// `firebird-writer`: transfers between accounts until standard input is closed.
fn firebird_writer(args: &[String]) -> Result<u8> {
    use sluice_testkit::firebird_writer::{Transfers, create_accounts, run_transfers};
    use std::io::{Read, Write};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let usage = "usage: sluice-testkit firebird-writer DB [--create N] [--accounts N] \
                 [--per-commit N] [--read-committed] [--log FILE]";
    let mut db = None;
    let mut spec = Transfers::default();
    let mut create = None;
    let mut log = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .with_context(|| format!("{a} needs a value; {usage}"))
        };
        match a.as_str() {
            "--create" => create = Some(value()?.parse::<u64>()?),
            "--accounts" => spec.accounts = value()?.parse()?,
            "--per-commit" => spec.per_commit = value()?.parse()?,
            "--read-committed" => {
                spec.set_transaction =
                    "SET TRANSACTION READ WRITE WAIT ISOLATION LEVEL READ COMMITTED".into()
            }
            "--log" => log = Some(std::fs::File::create(value()?)?),
            _ if db.is_none() && !a.starts_with('-') => db = Some(std::path::PathBuf::from(a)),
            _ => bail!("unknown argument {a}; {usage}"),
        }
    }
    let db = db.context(usage)?;
    if let Some(n) = create {
        create_accounts(&db, n);
        spec.accounts = n;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        s.store(true, Ordering::Relaxed);
    });
    let mut out = std::io::stdout();
    let mut log = log.map(std::io::BufWriter::new);
    run_transfers(
        &db,
        &spec,
        log.as_mut().map(|l| l as &mut dyn Write),
        || stop.load(Ordering::Relaxed),
        |n| {
            let _ = writeln!(out, "committed {n}");
            let _ = out.flush();
        },
    )?;
    if let Some(mut l) = log {
        l.flush()?;
    }
    Ok(0)
}

/// A server kept alive (and stopped on drop) while the command runs.
#[allow(dead_code)]
enum Server {
    Pg(sluice_testkit::server::PgServer),
    Mariadb(sluice_testkit::mariadb::MariadbServer),
    Mysql9(sluice_testkit::mysql9::Mysql9Server),
    Redis(sluice_testkit::redis::RedisServer),
}

#[allow(unsafe_code)]
fn ignore_interrupts() {
    // SAFETY: installing SIG_IGN for SIGINT/SIGTERM has no memory-safety preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
}
