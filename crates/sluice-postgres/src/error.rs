//! Classifying PostgreSQL's errors into sluice's [`Error`]: whose side, whether a retry helps,
//! and what to change.
//!
//! Classification is by SQLSTATE, never by message text, so it holds across server versions
//! and locales.

use sluice_core::{Error, ErrorKind, Retry};
use tokio_postgres::error::SqlState;

pub use sluice_core::error::Phase;

/// Turn a driver error into a sluice error. `target` is the redacted URL or the object being
/// read, used in the message.
pub fn classify(e: tokio_postgres::Error, phase: Phase, target: &str) -> Error {
    let Some(db) = e.as_db_error() else {
        // No server error: the connection failed or broke.
        let detail = e.to_string();
        let io = std::error::Error::source(&e)
            .map(|s| s.to_string())
            .unwrap_or_default();
        let msg = if phase == Phase::Connect {
            format!(
                "could not connect to PostgreSQL at {target}: {detail}{}{io}. Check that the \
                 server is running, that host and port in the URL are right, and that a \
                 firewall does not block the port.",
                if io.is_empty() { "" } else { ": " }
            )
        } else {
            format!(
                "the connection to PostgreSQL ({target}) was lost: {detail}{}{io}.",
                if io.is_empty() { "" } else { ": " }
            )
        };
        return Error::new(ErrorKind::Source, Retry::Transient, msg).with_cause(e);
    };
    let code = db.code().clone();
    let server_msg = db.message().to_string();
    let (kind, retry, advice): (ErrorKind, Retry, String) = match code {
        SqlState::INVALID_PASSWORD | SqlState::INVALID_AUTHORIZATION_SPECIFICATION => (
            ErrorKind::Source,
            Retry::Permanent,
            "Check the user name and the password (in the URL or the PGPASSWORD environment \
             variable), and that pg_hba.conf allows this user from this host."
                .into(),
        ),
        SqlState::INVALID_CATALOG_NAME => (
            ErrorKind::Source,
            Retry::Permanent,
            "Check the database name at the end of the URL (psql -l lists the databases).".into(),
        ),
        SqlState::UNDEFINED_TABLE | SqlState::UNDEFINED_COLUMN | SqlState::INVALID_SCHEMA_NAME => (
            ErrorKind::Config,
            Retry::Permanent,
            "Check the table and column names; quote names with capitals or special characters \
             in double quotes."
                .into(),
        ),
        SqlState::INSUFFICIENT_PRIVILEGE => (
            ErrorKind::Source,
            Retry::Permanent,
            "The user lacks a privilege sluice needs: grant it, e.g. GRANT SELECT ON <table> TO \
             <user> (and USAGE on its schema), or connect as a user that has it. If the message \
             names a row-level security policy (sluice reads with row_security = off, as \
             pg_dump does, so policies fail the read instead of hiding rows): connect as the \
             table's owner or a role with BYPASSRLS, or pass --enable-row-security to export \
             only the rows this user may see."
                .into(),
        ),
        SqlState::QUERY_CANCELED => (
            ErrorKind::Source,
            Retry::Permanent,
            "The statement was cancelled, usually by statement_timeout. Retrying the same chunk \
             would time out again: use smaller chunks (--chunk-size), more chunks, or raise the \
             timeout for the export's user (ALTER ROLE … SET statement_timeout = …)."
                .into(),
        ),
        SqlState::ADMIN_SHUTDOWN | SqlState::CRASH_SHUTDOWN | SqlState::CANNOT_CONNECT_NOW => (
            ErrorKind::Source,
            Retry::Transient,
            "The server ended the session (terminated, shutting down or restarting).".into(),
        ),
        SqlState::T_R_SERIALIZATION_FAILURE | SqlState::T_R_DEADLOCK_DETECTED => (
            ErrorKind::Source,
            Retry::Transient,
            "A concurrency conflict; retrying.".into(),
        ),
        SqlState::LOCK_NOT_AVAILABLE => (
            ErrorKind::Source,
            Retry::Transient,
            "A lock could not be taken within lock_timeout (10 s): another session holds or \
             waits for an exclusive lock on the table (ALTER, TRUNCATE, DROP, VACUUM FULL, \
             REFRESH MATERIALIZED VIEW); pg_locks and pg_stat_activity show which. Run the \
             export once that statement has finished."
                .into(),
        ),
        SqlState::TOO_MANY_CONNECTIONS => (
            ErrorKind::Source,
            Retry::Transient,
            "The server has no free connection slots: lower --parallel, or raise \
             max_connections."
                .into(),
        ),
        SqlState::SNAPSHOT_TOO_OLD => (
            ErrorKind::Source,
            Retry::Permanent,
            "The snapshot is too old (old_snapshot_threshold): use --consistency chunk, or \
             export fewer tables per run."
                .into(),
        ),
        _ if code.code().starts_with("08") => (
            ErrorKind::Source,
            Retry::Transient,
            "The connection failed.".into(),
        ),
        _ if code.code().starts_with("53") => (
            ErrorKind::Source,
            Retry::Transient,
            "The server is short of a resource (memory, disk, connections).".into(),
        ),
        _ => (ErrorKind::Source, Retry::Permanent, String::new()),
    };
    let what = match phase {
        Phase::Connect => "connecting to",
        Phase::Catalog => "reading the catalog of",
        Phase::Snapshot => "taking the snapshot on",
        Phase::Read => "reading",
    };
    let mut msg = format!(
        "PostgreSQL error {} while {what} {target}: {server_msg}.",
        code.code()
    );
    if let Some(detail) = db.detail() {
        msg.push_str(&format!(" Detail: {detail}."));
    }
    if !advice.is_empty() {
        msg.push(' ');
        msg.push_str(&advice);
    }
    Error::new(kind, retry, msg).with_cause(e)
}

/// The SQLSTATE of a driver error, if the server sent one.
pub fn sqlstate(e: &tokio_postgres::Error) -> Option<&str> {
    e.as_db_error().map(|d| d.code().code())
}
