//! One error type for every library crate.
//!
//! An error says three things: *whose side* failed ([`ErrorKind`], which the CLI maps to an exit
//! code), *whether trying again can help* ([`Retry`], which the engine's retry policy reads), and
//! *what the user should change*, in one paragraph. Adapters classify their driver's errors into
//! this shape (see each adapter's `error.rs`); nothing above them inspects driver errors.
//!
//! Messages never contain secrets: adapters build them from redacted URLs only.

use std::fmt;

/// Convenience alias used across sluice's libraries.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whose side an error is on. The CLI turns each kind into a distinct exit code so scripts can
/// tell a bad flag from a refusing database from a full disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request itself is wrong (flag, YAML, URL, unknown table): fix the invocation.
    Config,
    /// The source database refused or failed (connection, authentication, privilege, timeout).
    Source,
    /// The output location refused or failed (permission, disk full, bucket missing).
    Destination,
    /// A value in the data cannot be represented in the output as asked (e.g. NaN in a decimal).
    Data,
    /// The run was interrupted (signal) before it finished; nothing complete-looking was left.
    Interrupted,
    /// A bug in sluice: a broken invariant. Please report it.
    Internal,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Config => "configuration error",
            ErrorKind::Source => "source error",
            ErrorKind::Destination => "destination error",
            ErrorKind::Data => "data error",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::Internal => "internal error",
        })
    }
}

/// Whether repeating the failed operation can succeed.
///
/// `Transient` covers a dropped connection, a serialization failure, a deadlock, throttling;
/// the engine retries those with backoff and jitter, bounded in attempts and time. `Permanent`
/// covers everything that would fail the same way again (permission denied, missing table,
/// statement timeout on the same query) and fails the run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Retry {
    /// Trying again may succeed.
    Transient,
    /// Trying again will fail the same way.
    Permanent,
}

/// What a failing source operation was, so an adapter's message can say what to do about it
/// (each adapter's `error.rs` classifies its driver's errors by phase).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Opening a session.
    Connect,
    /// Reading the catalog or planning.
    Catalog,
    /// Taking, joining or locking for the snapshot.
    Snapshot,
    /// Streaming rows.
    Read,
}

/// The error type of every sluice library crate.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    retry: Retry,
    message: String,
    conflict: bool,
    blocked: bool,
    cause: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// A new error. `message` names the problem and the fix in one paragraph, and holds no
    /// secrets.
    pub fn new(kind: ErrorKind, retry: Retry, message: impl Into<String>) -> Self {
        Error {
            kind,
            retry,
            message: message.into(),
            conflict: false,
            blocked: false,
            cause: None,
        }
    }

    /// A change applied to a target database failed in a way that running it after every
    /// earlier transaction has committed may cure: a unique or foreign-key violation, a
    /// deadlock or a lock wait that timed out. The parallel applier rolls the transaction back
    /// and retries it once it is the oldest unfinished one; only a failure there is an error.
    pub fn apply_conflict(message: impl Into<String>) -> Self {
        let mut e = Self::new(ErrorKind::Destination, Retry::Transient, message);
        e.conflict = true;
        e
    }

    /// True for [`Error::apply_conflict`] (and [`Error::apply_blocked`]).
    pub fn is_apply_conflict(&self) -> bool {
        self.conflict
    }

    /// An [`Error::apply_conflict`] that is a lock wait given up: another session holds a
    /// lock the change needs. When the unit already runs alone, that session is not sluice's
    /// and the applier waits for it (retrying, naming it) rather than fail: the message says
    /// who holds the lock.
    pub fn apply_blocked(message: impl Into<String>) -> Self {
        let mut e = Self::apply_conflict(message);
        e.blocked = true;
        e
    }

    /// True for [`Error::apply_blocked`].
    pub fn is_apply_blocked(&self) -> bool {
        self.blocked
    }

    /// A permanent configuration error.
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, Retry::Permanent, message)
    }

    /// A source error that will not go away by retrying.
    pub fn source_permanent(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Source, Retry::Permanent, message)
    }

    /// A source error that a retry may cure.
    pub fn source_transient(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Source, Retry::Transient, message)
    }

    /// A destination error; `retry` says whether a retry may cure it.
    pub fn destination(retry: Retry, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Destination, retry, message)
    }

    /// A value that cannot be represented as requested.
    pub fn data(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Data, Retry::Permanent, message)
    }

    /// A broken invariant inside sluice.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, Retry::Permanent, message)
    }

    /// A coordinator's session used after the coordinator released it (a broken invariant).
    pub fn session_released() -> Self {
        Self::internal("the coordinator session was already released")
    }

    /// The run was interrupted on request.
    pub fn interrupted(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Interrupted, Retry::Permanent, message)
    }

    /// Attach the underlying error, kept for `source()` chains and debug logs. Its text must not
    /// contain secrets either (driver errors do not echo passwords).
    pub fn with_cause(mut self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.cause = Some(Box::new(cause));
        self
    }

    /// Append to the message (what the run left and how to go on), keeping kind, retry class
    /// and cause.
    pub fn then(mut self, suffix: impl fmt::Display) -> Self {
        self.message = format!("{} {suffix}", self.message);
        self
    }

    /// Prefix the message with where the error happened (a table, a part file), keeping its
    /// kind and retry class.
    pub fn context(mut self, prefix: impl fmt::Display) -> Self {
        self.message = format!("{prefix}: {}", self.message);
        self
    }

    /// The same failure seen from a target database's side: connection code shared by
    /// sources and targets reports a source's error (exit code 3, "source URL"); a target
    /// adapter passes it through this so it exits as a destination error and names the
    /// target URL. Retry class and cause are kept.
    pub fn as_target(mut self) -> Self {
        if self.kind == ErrorKind::Source {
            self.kind = ErrorKind::Destination;
        }
        self.message = self.message.replacen("source URL", "target URL", 1);
        self
    }

    /// Whose side failed.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether a retry can help.
    pub fn retry(&self) -> Retry {
        self.retry
    }

    /// True when a retry can help.
    pub fn is_transient(&self) -> bool {
        self.retry == Retry::Transient
    }

    /// The one-paragraph message (problem and fix).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<arrow_schema::ArrowError> for Error {
    fn from(e: arrow_schema::ArrowError) -> Self {
        Error::internal(format!("Arrow rejected a batch: {e}")).with_cause(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_keeps_kind_and_retry() {
        let e = Error::source_transient("connection reset").context("public.orders part 3");
        assert_eq!(e.kind(), ErrorKind::Source);
        assert!(e.is_transient());
        assert_eq!(e.to_string(), "public.orders part 3: connection reset");
    }
}
