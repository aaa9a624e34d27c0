//! Classifying Firebird's errors into sluice's [`Error`]: whose side, whether a retry helps,
//! and what to change.
//!
//! The client library reports an SQLCODE and the status vector's text. Classification is by
//! SQLCODE first; within SQLCODE -902 (a catch-all for connection, file and security failures)
//! the first line of the message decides whether the failure can pass (a lost or refused
//! connection) or not (a missing file, a wrong password).

use rsfbclient_core::FbError;
use sluice_core::{Error, ErrorKind, Retry};

pub use sluice_core::error::Phase;

/// Turn a driver error into a sluice error. `target` is the redacted URL or the object being
/// read, used in the message.
pub fn classify(e: FbError, phase: Phase, target: &str) -> Error {
    let what = match phase {
        Phase::Connect => "attaching to",
        Phase::Catalog => "reading the catalog of",
        Phase::Snapshot => "taking the snapshot on",
        Phase::Read => "reading",
    };
    let (code, text) = match &e {
        FbError::Sql { code, msg } => (*code, msg.clone()),
        FbError::Io(io) => (0, io.to_string()),
        FbError::Other(m) => (0, m.clone()),
    };
    let lower = text.to_lowercase();
    let (kind, retry, advice): (ErrorKind, Retry, &str) = match code {
        -902 if lower.contains("i/o error") || lower.contains("no such file") => (
            ErrorKind::Source,
            Retry::Permanent,
            "The database file cannot be opened: check the path in the URL (an embedded URL \
             needs the absolute path, firebird:///abs/path/db.fdb), that it exists and is \
             readable. \"lock\" errors mean another process holds the file in ServerMode \
             Super: use a firebird.conf with ServerMode = SuperClassic in FIREBIRD's directory.",
        ),
        -902 if lower.contains("user name and password") || lower.contains("login") => (
            ErrorKind::Source,
            Retry::Permanent,
            "Check the user name and the password (in the URL or ISC_USER / ISC_PASSWORD).",
        ),
        -902 if lower.contains("unable to complete network request") && phase == Phase::Connect => {
            (
                ErrorKind::Source,
                Retry::Transient,
                "Check that the server runs and that host and port are right. For a local file \
                 without a server, use the embedded form firebird:///abs/path/db.fdb with \
                 FIREBIRD pointing at an embedded runtime.",
            )
        }
        -902 | -901 if lower.contains("shutdown") || lower.contains("connection") => (
            ErrorKind::Source,
            Retry::Transient,
            "The connection was lost or the database is shutting down.",
        ),
        -913 | -901 if lower.contains("deadlock") || lower.contains("lock conflict") => (
            ErrorKind::Source,
            Retry::Transient,
            "A concurrency conflict; retrying.",
        ),
        -551 => (
            ErrorKind::Source,
            Retry::Permanent,
            "The user lacks a privilege sluice needs: GRANT SELECT ON <table> TO <user>, or \
             connect as a user that has it.",
        ),
        -204 | -206 => (
            ErrorKind::Config,
            Retry::Permanent,
            "Check the table and column names; names typed without double quotes are upper \
             case in Firebird.",
        ),
        0 if phase == Phase::Connect => (
            ErrorKind::Config,
            Retry::Permanent,
            "The Firebird client library could not be loaded: set FBCLIENT to the path of \
             libfbclient.so.2 (or add ?fbclient=PATH to the URL), or FIREBIRD to an embedded \
             runtime directory that holds it. An embedded runtime also needs Debian's \
             libtommath1.",
        ),
        0 if lower.contains("utf-8") || lower.contains("utf8") => (
            ErrorKind::Data,
            Retry::Permanent,
            "A text value is not valid UTF-8: the column is probably declared with CHARACTER \
             SET NONE but holds bytes of another encoding. Export it through a view that \
             casts it with the right character set, or as OCTETS.",
        ),
        _ => (ErrorKind::Source, Retry::Permanent, ""),
    };
    let first = text.lines().collect::<Vec<_>>().join(" / ");
    let mut msg = if code != 0 {
        format!("Firebird error {code} while {what} {target}: {first}.")
    } else {
        format!("Firebird client error while {what} {target}: {first}.")
    };
    if !advice.is_empty() {
        msg.push(' ');
        msg.push_str(advice);
    }
    Error::new(kind, retry, msg).with_cause(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(code: i32, msg: &str) -> FbError {
        FbError::Sql {
            code,
            msg: msg.into(),
        }
    }

    #[test]
    fn missing_file_is_permanent() {
        let e = classify(
            sql(
                -902,
                "I/O error during \"open\" operation for file \"/x.fdb\"\nError while trying to open file\nNo such file or directory",
            ),
            Phase::Connect,
            "firebird:///x.fdb",
        );
        assert_eq!(e.retry(), Retry::Permanent);
        assert!(e.to_string().contains("check the path"), "{e}");
    }

    #[test]
    fn lost_connection_is_transient() {
        let e = classify(sql(-902, "connection shutdown"), Phase::Read, "T");
        assert!(e.is_transient(), "{e}");
        let e = classify(sql(-913, "deadlock\nupdate conflicts"), Phase::Read, "T");
        assert!(e.is_transient(), "{e}");
    }

    #[test]
    fn unknown_table_is_config() {
        let e = classify(sql(-204, "Table unknown\nNOPE"), Phase::Read, "T");
        assert_eq!(e.kind(), ErrorKind::Config);
    }
}
