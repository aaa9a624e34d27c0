//! The harm budget: limits a DBA sets on what the export may do to production, and the
//! governor that keeps to them by changing the export's pace *between chunks*.
//!
//! | module      | responsibility                                                      |
//! |-------------|---------------------------------------------------------------------|
//! | this file   | the budget ([`HarmBudget`]), its presets and how its values are typed |
//! | `law`       | the control law: zones, cooldown, hysteresis (pure, unit-tested)    |
//! | `brake`     | the same rules outside an export: work held while a signal is over |
//! | `gate`      | what workers ask before taking a chunk                              |
//! | `run`       | the running governor: the law every 250 ms, the gate, the timeline  |
//! | `slots`     | each governed signal: its value now, fail-closed reading, its task   |
//! | `timeline`  | the per-second record the report carries                            |
//!
//! The signals are foreign load only (see `sluice_core::budget`): a governor steering on a
//! signal its own reads move strangles itself. The governor never interrupts a chunk's
//! statement: it decides how many workers may *start* a chunk and whether any may.

mod brake;
mod gate;
mod law;
mod run;
mod slots;
pub mod timeline;

pub use brake::{Brake, BrakeRecord};
pub use gate::Gate;
pub use law::{COOLDOWN, Law, RESUME_BELOW};
pub(crate) use run::Inputs;
pub use run::{Governor, probe_signals};

use sluice_core::{Error, Result};
use std::time::Duration;

/// How far the export may hold back VACUUM.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum XminLimit {
    /// How long the snapshot (or, with chunk consistency, a chunk's transaction) may be held.
    Time(Duration),
    /// How many transactions old the oldest xmin the run holds may get (PostgreSQL only).
    Xids(u64),
}

/// A plain cap on the read rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RateLimit {
    /// Rows per second.
    Rows(f64),
    /// Source bytes per second.
    Bytes(f64),
}

/// The limits of a harm budget; `None` leaves a signal unread. The default (every limit
/// `None`) governs nothing and reads no signal.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HarmBudget {
    /// Replay lag of any replica (`--max-replica-lag`).
    pub max_replica_lag: Option<Duration>,
    /// The canary query's 95th-percentile latency (`--max-latency`).
    pub max_latency: Option<Duration>,
    /// How far the run may hold back VACUUM (`--max-xmin-age`). With snapshot consistency it
    /// bounds the whole run: the run stops before exceeding it, and `--resume` continues under
    /// a new snapshot.
    pub max_xmin_age: Option<XminLimit>,
    /// Other sessions running a statement (`--max-active`).
    pub max_active: Option<u32>,
    /// A plain cap on the read rate (`--max-rate`).
    pub max_rate: Option<RateLimit>,
    /// Replicas to read lag on directly (`--replica`).
    pub replicas: Vec<String>,
    /// The canary's statement (`--probe-sql`; default: a catalog lookup).
    pub probe_sql: Option<String>,
}

/// `--harm-budget`: several limits at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// Replica lag 10 s, canary p95 50 ms, xmin age 15 min.
    Gentle,
    /// Replica lag 60 s, canary p95 250 ms, xmin age 1 h.
    Normal,
    /// Nothing is governed and no signal is read.
    None,
}

impl HarmBudget {
    /// The budget of `preset`, with the limits given explicitly (`self`) winning over its.
    /// `Preset::None` with an explicit limit is refused: the request contradicts itself.
    pub fn with_preset(self, preset: Option<Preset>) -> Result<HarmBudget> {
        let secs = Duration::from_secs;
        let (lag, latency, xmin) = match preset {
            None => return Ok(self),
            Some(Preset::None) => {
                if self.governs() {
                    return Err(Error::config(
                        "--harm-budget none reads no signal and governs nothing, but limits \
                         (--max-…) were given too: drop one of them.",
                    ));
                }
                return Ok(HarmBudget::default());
            }
            Some(Preset::Gentle) => (secs(10), Duration::from_millis(50), secs(15 * 60)),
            Some(Preset::Normal) => (secs(60), Duration::from_millis(250), secs(3600)),
        };
        Ok(HarmBudget {
            max_replica_lag: self.max_replica_lag.or(Some(lag)),
            max_latency: self.max_latency.or(Some(latency)),
            max_xmin_age: self.max_xmin_age.or(Some(XminLimit::Time(xmin))),
            ..self
        })
    }

    /// Whether any limit is set (otherwise no signal is read).
    pub fn governs(&self) -> bool {
        self.max_replica_lag.is_some()
            || self.max_latency.is_some()
            || self.max_xmin_age.is_some()
            || self.max_active.is_some()
            || self.max_rate.is_some()
    }

    /// The adapter signals this budget needs.
    pub fn request(&self) -> sluice_core::budget::SignalRequest {
        sluice_core::budget::SignalRequest {
            replica_lag: self.max_replica_lag.is_some(),
            replicas: if self.max_replica_lag.is_some() {
                self.replicas.clone()
            } else {
                Vec::new()
            },
            latency: self.max_latency.is_some(),
            probe_sql: self.probe_sql.clone(),
            active: self.max_active.is_some(),
        }
    }
}

/// A duration as a user types it: `250ms`, `2s`, `1.5s`, `10min`, `1h` (a bare number is
/// seconds). `flag` names the setting in the error.
pub fn parse_duration(text: &str, flag: &str) -> Result<Duration> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number.parse().map_err(|_| bad_duration(text, flag))?;
    let scale = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 0.001,
        "m" | "min" | "mins" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad_duration(text, flag)),
    };
    Duration::try_from_secs_f64(n * scale).map_err(|_| bad_duration(text, flag))
}

fn bad_duration(text: &str, flag: &str) -> Error {
    Error::config(format!(
        "{flag} {text:?} is no duration: give a number with ms, s, min or h (e.g. 500ms, 10s)."
    ))
}

/// `--max-xmin-age`: a duration (`30min`) or a number of transactions (`1000000`,
/// `1000000xids`).
pub fn parse_xmin_limit(text: &str) -> Result<XminLimit> {
    let t = text.trim();
    let digits = t.trim_end_matches("xids").trim_end_matches("xid").trim();
    if let Ok(n) = digits.parse::<u64>()
        && (digits.len() == t.len() || t.ends_with("xid") || t.ends_with("xids"))
    {
        return Ok(XminLimit::Xids(n));
    }
    parse_duration(t, "--max-xmin-age").map(XminLimit::Time)
}

/// `--max-rate`: `50000rows/s` or bytes per second (`64MB/s`, `1GB/s`; powers of 1024).
pub fn parse_rate(text: &str) -> Result<RateLimit> {
    let bad = || {
        Error::config(format!(
            "--max-rate {text:?} is no rate: give ROWSrows/s (50000rows/s) or BYTES/s (64MB/s)."
        ))
    };
    let per = text.trim().strip_suffix("/s").ok_or_else(bad)?.trim();
    if let Some(rows) = per.strip_suffix("rows") {
        let n: f64 = rows.trim().parse().map_err(|_| bad())?;
        return (n > 0.0).then_some(RateLimit::Rows(n)).ok_or_else(bad);
    }
    let split = per
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(per.len());
    let (number, unit) = per.split_at(split);
    let n: f64 = number.parse().map_err(|_| bad())?;
    let scale = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "KB" | "KIB" => 1024.0,
        "MB" | "MIB" => 1024.0 * 1024.0,
        "GB" | "GIB" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(bad()),
    };
    (n > 0.0)
        .then_some(RateLimit::Bytes(n * scale))
        .ok_or_else(bad)
}

/// `12.3 s`, `45 ms`: a value in seconds as the messages show it.
pub fn show_seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else {
        format!("{s:.1} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_rates_and_xmin_limits() {
        let d = |t| parse_duration(t, "--x").unwrap();
        assert_eq!(d("2s"), Duration::from_secs(2));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("1.5"), Duration::from_millis(1500));
        assert_eq!(d("10min"), Duration::from_secs(600));
        assert!(parse_duration("fast", "--x").is_err());
        assert_eq!(parse_xmin_limit("1000").unwrap(), XminLimit::Xids(1000));
        assert_eq!(parse_xmin_limit("5xids").unwrap(), XminLimit::Xids(5));
        assert_eq!(
            parse_xmin_limit("30s").unwrap(),
            XminLimit::Time(Duration::from_secs(30))
        );
        assert_eq!(parse_rate("100rows/s").unwrap(), RateLimit::Rows(100.0));
        assert_eq!(
            parse_rate("2MB/s").unwrap(),
            RateLimit::Bytes(2.0 * 1024.0 * 1024.0)
        );
        assert!(parse_rate("2MB").is_err());
    }

    #[test]
    fn presets_fill_what_was_not_given() {
        let given = HarmBudget {
            max_latency: Some(Duration::from_millis(5)),
            ..HarmBudget::default()
        };
        let b = given.clone().with_preset(Some(Preset::Gentle)).unwrap();
        assert_eq!(b.max_latency, Some(Duration::from_millis(5)));
        assert_eq!(b.max_replica_lag, Some(Duration::from_secs(10)));
        assert!(given.with_preset(Some(Preset::None)).is_err());
        assert!(
            !HarmBudget::default()
                .with_preset(Some(Preset::None))
                .unwrap()
                .governs()
        );
    }
}
