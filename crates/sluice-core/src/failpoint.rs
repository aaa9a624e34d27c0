//! Named failpoints: places in the code where a test makes the process die, fail or wait, so
//! fault tests are deterministic instead of racing the program with sleeps.
//!
//! Failpoints are armed by the environment of the process, read once:
//!
//! ```text
//! SLUICE_FAILPOINTS="export.after_receipt=exit@3,read.after_batch=error"
//! ```
//!
//! Each entry is `NAME=ACTION` or `NAME=ACTION@N` (only the N-th hit of that name, counting from
//! 1, triggers; without `@N` every hit does). Actions:
//!
//! | action  | effect at the failpoint |
//! |---------|-------------------------|
//! | `exit`  | the process aborts on the spot (no destructors, no flush: as `kill -9` would leave it) |
//! | `error` | [`hit`] returns a transient error naming the failpoint, on the failpoint's side (source unless the call site says otherwise with [`hit_as`]) |
//! | `fatal` | [`hit`] returns a permanent error naming the failpoint, on the failpoint's side |
//! | `panic` | the calling thread panics |
//! | `wait`  | creates `$SLUICE_FAILPOINT_DIR/NAME.reached` and blocks until `NAME.release` exists there (the test acts in between: kills a session, runs DDL, sends a signal) |
//!
//! Why in the library and not behind a cargo feature: tests run the real binary, and a feature
//! would make the tested binary differ from the shipped one. Unarmed, a failpoint costs one
//! atomic load. Names are `area.event` (`export.after_receipt`); every name in use is listed in
//! ARCHITECTURE.md. Limits: `wait` blocks the calling thread (callers on an async runtime accept
//! that in tests); the environment is read once per process.

use crate::error::{Error, ErrorKind, Result, Retry};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable that arms failpoints.
pub const ENV: &str = "SLUICE_FAILPOINTS";
/// The directory where `wait` failpoints signal and are released.
pub const DIR_ENV: &str = "SLUICE_FAILPOINT_DIR";

/// What an armed failpoint does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Abort the process.
    Exit,
    /// Return a transient error.
    Error,
    /// Return a permanent error.
    Fatal,
    /// Panic.
    Panic,
    /// Signal the test and wait to be released.
    Wait,
}

#[derive(Debug)]
struct Armed {
    action: Action,
    /// Trigger only on this hit (1-based); `None` for every hit.
    on_hit: Option<u64>,
    hits: u64,
}

fn table() -> &'static Option<Mutex<HashMap<String, Armed>>> {
    static TABLE: OnceLock<Option<Mutex<HashMap<String, Armed>>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let spec = std::env::var(ENV).ok()?;
        match parse(&spec) {
            Ok(map) if !map.is_empty() => Some(Mutex::new(map)),
            Ok(_) => None,
            Err(e) => {
                // A typo must not silently disarm a fault test.
                eprintln!("sluice: {ENV}: {e}");
                std::process::abort();
            }
        }
    })
}

fn parse(spec: &str) -> std::result::Result<HashMap<String, Armed>, String> {
    let mut out = HashMap::new();
    for entry in spec
        .split([',', ';'])
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let (name, rest) = entry
            .split_once('=')
            .ok_or_else(|| format!("{entry:?} is not NAME=ACTION[@N]"))?;
        let (action, on_hit) = match rest.split_once('@') {
            Some((a, n)) => {
                let n: u64 = n
                    .parse()
                    .map_err(|_| format!("{entry:?}: @{n} is not a hit number"))?;
                (a, Some(n))
            }
            None => (rest, None),
        };
        let action = match action {
            "exit" => Action::Exit,
            "error" => Action::Error,
            "fatal" => Action::Fatal,
            "panic" => Action::Panic,
            "wait" => Action::Wait,
            other => return Err(format!("{entry:?}: unknown action {other:?}")),
        };
        out.insert(
            name.trim().to_string(),
            Armed {
                action,
                on_hit,
                hits: 0,
            },
        );
    }
    Ok(out)
}

/// Whether any failpoint is armed in this process.
pub fn armed() -> bool {
    table().is_some()
}

/// Pass the failpoint `name`, a place on the source's side (an injected `error` is a source
/// error). Unarmed (the normal case) this returns `Ok(())` at once.
pub fn hit(name: &str) -> Result<()> {
    hit_as(name, ErrorKind::Source)
}

/// Pass the failpoint `name`, a place on `side`'s side: an injected `error` or `fatal` is an
/// error of that kind, so it travels the same path as a real failure there would (a failpoint in
/// the part writer injects a destination error, which must not cost the worker its source
/// session). Unarmed this returns `Ok(())` at once.
pub fn hit_as(name: &str, side: ErrorKind) -> Result<()> {
    let Some(table) = table() else {
        return Ok(());
    };
    let action = {
        let Ok(mut map) = table.lock() else {
            return Ok(());
        };
        let Some(armed) = map.get_mut(name) else {
            return Ok(());
        };
        armed.hits += 1;
        match armed.on_hit {
            Some(n) if n != armed.hits => return Ok(()),
            _ => armed.action,
        }
    };
    match action {
        Action::Exit => {
            eprintln!("sluice: failpoint {name}: exit");
            std::process::abort();
        }
        Action::Error => Err(Error::new(
            side,
            Retry::Transient,
            format!("failpoint {name} injected a transient failure"),
        )),
        Action::Fatal => Err(Error::new(
            side,
            Retry::Permanent,
            format!("failpoint {name} injected a permanent failure"),
        )),
        Action::Panic => panic!("failpoint {name}"),
        Action::Wait => {
            wait(name);
            Ok(())
        }
    }
}

fn wait(name: &str) {
    let dir = std::env::var_os(DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let reached = dir.join(format!("{name}.reached"));
    let release = dir.join(format!("{name}.release"));
    let _ = std::fs::write(&reached, std::process::id().to_string());
    while !release.exists() {
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_actions_and_hit_numbers() {
        let m = parse("a.b=exit@3, c=error;d=wait").unwrap_or_default();
        assert_eq!(m.len(), 3);
        assert_eq!(m["a.b"].action, Action::Exit);
        assert_eq!(m["a.b"].on_hit, Some(3));
        assert_eq!(m["c"].action, Action::Error);
        assert_eq!(m["c"].on_hit, None);
        assert_eq!(m["d"].action, Action::Wait);
    }

    #[test]
    fn rejects_typos() {
        assert!(parse("a=explode").is_err());
        assert!(parse("a").is_err());
        assert!(parse("a=exit@x").is_err());
    }

    #[test]
    fn unarmed_hits_pass() {
        // The test process has no SLUICE_FAILPOINTS.
        assert!(hit("never.armed").is_ok());
    }
}
