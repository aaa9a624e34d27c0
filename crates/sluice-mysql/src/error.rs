//! Classifying MySQL/MariaDB errors into sluice's [`Error`]: whose side, whether a retry helps,
//! and what to change.
//!
//! Classification is by the server's error number (or, for a connection that broke, by the
//! driver's error kind), never by message text, so it holds across versions and locales. Codes
//! only one of MariaDB or MySQL sends are listed side by side; none is assumed to exist.

use sluice_core::{Error, ErrorKind, Retry};

pub use sluice_core::error::Phase;

/// Server and client error numbers sluice treats specially.
#[allow(missing_docs)]
pub mod code {
    pub const ER_CON_COUNT_ERROR: u16 = 1040;
    pub const ER_DBACCESS_DENIED_ERROR: u16 = 1044;
    pub const ER_ACCESS_DENIED_ERROR: u16 = 1045;
    pub const ER_BAD_DB_ERROR: u16 = 1049;
    pub const ER_SERVER_SHUTDOWN: u16 = 1053;
    pub const ER_BAD_FIELD_ERROR: u16 = 1054;
    pub const ER_PARSE_ERROR: u16 = 1064;
    pub const ER_TABLEACCESS_DENIED_ERROR: u16 = 1142;
    pub const ER_COLUMNACCESS_DENIED_ERROR: u16 = 1143;
    pub const ER_NO_SUCH_TABLE: u16 = 1146;
    pub const ER_NET_READ_ERROR: u16 = 1158;
    pub const ER_NET_READ_INTERRUPTED: u16 = 1159;
    pub const ER_NET_ERROR_ON_WRITE: u16 = 1160;
    pub const ER_NET_WRITE_INTERRUPTED: u16 = 1161;
    pub const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
    pub const ER_LOCK_DEADLOCK: u16 = 1213;
    pub const ER_SPECIFIC_ACCESS_DENIED_ERROR: u16 = 1227;
    pub const ER_QUERY_INTERRUPTED: u16 = 1317;
    pub const ER_TABLE_DEF_CHANGED: u16 = 1412;
    pub const ER_CONNECTION_KILLED: u16 = 1927;
    /// MariaDB `max_statement_time` exceeded.
    pub const ER_STATEMENT_TIMEOUT: u16 = 1969;
    /// MySQL `max_execution_time` exceeded.
    pub const ER_QUERY_TIMEOUT: u16 = 3024;
    /// MySQL 8.0.24+: disconnected by the server for inactivity.
    pub const ER_CLIENT_INTERACTION_TIMEOUT: u16 = 4031;
    /// Client-side: the server has gone away.
    pub const CR_SERVER_GONE_ERROR: u16 = 2006;
    /// Client-side: lost connection during a query.
    pub const CR_SERVER_LOST: u16 = 2013;
}

/// How one error number is handled: kind, retry class, and advice.
fn advice(code: u16) -> (ErrorKind, Retry, &'static str) {
    use code::*;
    match code {
        ER_ACCESS_DENIED_ERROR => (
            ErrorKind::Source,
            Retry::Permanent,
            "Check the user name and the password (in the URL or the MYSQL_PWD environment \
             variable), and that the account may connect from this host.",
        ),
        ER_DBACCESS_DENIED_ERROR | ER_BAD_DB_ERROR => (
            ErrorKind::Source,
            Retry::Permanent,
            "Check the database name at the end of the URL (SHOW DATABASES lists those you may \
             see) and that the user has privileges on it.",
        ),
        ER_NO_SUCH_TABLE | ER_BAD_FIELD_ERROR | ER_PARSE_ERROR => (
            ErrorKind::Config,
            Retry::Permanent,
            "Check the table, column and query text; quote names with special characters in \
             double quotes on the command line.",
        ),
        ER_TABLEACCESS_DENIED_ERROR | ER_COLUMNACCESS_DENIED_ERROR => (
            ErrorKind::Source,
            Retry::Permanent,
            "The user lacks SELECT on a table or column: grant it (GRANT SELECT ON db.table TO \
             user), or connect as a user that has it.",
        ),
        ER_SPECIFIC_ACCESS_DENIED_ERROR => (
            ErrorKind::Source,
            Retry::Permanent,
            "The user lacks a privilege this step needs. A consistent snapshot across workers \
             needs a brief global lock, which needs the RELOAD privilege (GRANT RELOAD ON *.* TO \
             user); without it, export with --consistency chunk (each chunk its own consistent \
             read, not one point in time).",
        ),
        ER_STATEMENT_TIMEOUT | ER_QUERY_TIMEOUT => (
            ErrorKind::Source,
            Retry::Permanent,
            "The statement hit the server's statement time limit (MariaDB max_statement_time, \
             MySQL max_execution_time). Retrying the same chunk would time out again: use \
             smaller chunks (--chunk-size), or raise the limit for the export's user (MariaDB: \
             ALTER USER … WITH MAX_STATEMENT_TIME 0; MySQL: SET PERSIST max_execution_time = 0 or \
             a larger value).",
        ),
        ER_TABLE_DEF_CHANGED => (
            ErrorKind::Source,
            Retry::Permanent,
            "A table was altered, truncated or rebuilt after the snapshot was taken, so the \
             snapshot can no longer read it. Run the same command again with --resume (the \
             missing parts are read under a new snapshot), and avoid DDL on exported tables \
             while an export runs.",
        ),
        ER_LOCK_WAIT_TIMEOUT | ER_LOCK_DEADLOCK => (
            ErrorKind::Source,
            Retry::Transient,
            "A lock conflict: a lock wait timed out (sluice's sessions wait at most \
             --lock-wait-timeout) or a deadlock was broken; another session holds a lock this \
             step needs (a DDL running or queued, a long write).",
        ),
        ER_CON_COUNT_ERROR => (
            ErrorKind::Source,
            Retry::Transient,
            "The server has no free connection slots: lower --parallel, or raise \
             max_connections.",
        ),
        ER_SERVER_SHUTDOWN
        | ER_CONNECTION_KILLED
        | ER_QUERY_INTERRUPTED
        | ER_NET_READ_ERROR
        | ER_NET_READ_INTERRUPTED
        | ER_NET_ERROR_ON_WRITE
        | ER_NET_WRITE_INTERRUPTED
        | ER_CLIENT_INTERACTION_TIMEOUT
        | CR_SERVER_GONE_ERROR
        | CR_SERVER_LOST => (
            ErrorKind::Source,
            Retry::Transient,
            "The session was killed or its connection was lost.",
        ),
        _ => (ErrorKind::Source, Retry::Permanent, ""),
    }
}

/// Turn a driver error into a sluice error. `target` is the redacted URL or the object being
/// read, used in the message.
pub fn classify(e: mysql_async::Error, phase: Phase, target: &str) -> Error {
    let what = match phase {
        Phase::Connect => "connecting to",
        Phase::Catalog => "reading the catalog of",
        Phase::Snapshot => "taking the snapshot on",
        Phase::Read => "reading",
    };
    match &e {
        mysql_async::Error::Server(s) => {
            let (kind, retry, advice) = advice(s.code);
            let mut msg = format!(
                "MySQL error {} ({}) while {what} {target}: {}.",
                s.code,
                s.state,
                s.message.trim_end_matches('.')
            );
            if !advice.is_empty() {
                msg.push(' ');
                msg.push_str(advice);
            }
            Error::new(kind, retry, msg).with_cause(e)
        }
        mysql_async::Error::Url(u) => Error::config(format!(
            "the source URL {target} is not valid: {u}. Use \
             mysql://user[:password]@host[:port]/database."
        )),
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) if phase == Phase::Connect => {
            let msg = format!(
                "could not connect to MySQL/MariaDB at {target}: {e}. Check that the server is \
                 running, that host and port in the URL are right, and that a firewall does not \
                 block the port."
            );
            Error::new(ErrorKind::Source, Retry::Transient, msg).with_cause(e)
        }
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => {
            let msg = format!("the connection to MySQL/MariaDB ({target}) was lost: {e}.");
            Error::new(ErrorKind::Source, Retry::Transient, msg).with_cause(e)
        }
        mysql_async::Error::Other(_) => Error::new(
            ErrorKind::Source,
            Retry::Permanent,
            format!("MySQL/MariaDB driver error while {what} {target}: {e}."),
        )
        .with_cause(e),
    }
}

/// The server's error number, if the server sent one.
pub fn server_code(e: &mysql_async::Error) -> Option<u16> {
    match e {
        mysql_async::Error::Server(s) => Some(s.code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: u16) -> mysql_async::Error {
        mysql_async::Error::Server(mysql_async::ServerError {
            code,
            message: "m".into(),
            state: "HY000".into(),
        })
    }

    #[test]
    fn transient_and_permanent_by_number() {
        for c in [2013, 2006, 1205, 1213, 1927, 1040] {
            let e = classify(server(c), Phase::Read, "t");
            assert!(e.is_transient(), "{c}");
        }
        for (c, hint) in [(1969, "max_statement_time"), (3024, "max_execution_time")] {
            let e = classify(server(c), Phase::Read, "t");
            assert!(!e.is_transient(), "{c}");
            assert!(e.message().contains(hint), "{e}");
            assert!(e.message().contains("--chunk-size"), "{e}");
        }
        let e = classify(server(1227), Phase::Snapshot, "t");
        assert!(e.message().contains("--consistency chunk"), "{e}");
        assert_eq!(
            classify(server(1146), Phase::Read, "t").kind(),
            ErrorKind::Config
        );
    }
}
