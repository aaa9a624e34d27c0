//! Log lines on stderr: which ones (`-q`, `-v`, `SLUICE_LOG`), and in which form (`--log-format
//! text|json`, colour only on a terminal and never with `NO_COLOR`).
//!
//! Levels: every sluice crate logs under a target that starts with `sluice` (`sluice_engine`,
//! `sluice_mysql`, the binary's `sluice`, the adapters' `sluice::read`), and an `EnvFilter`
//! directive matches targets by prefix, so the one directive `sluice=LEVEL` raises them all,
//! crates added later included; dependencies stay one level quieter. `SLUICE_LOG` (the
//! `EnvFilter` syntax: `debug`, `warn,sluice_mysql=trace`) replaces the choice of `-q`/`-v`.
//!
//! JSON: one object per line with `timestamp` (RFC 3339 UTC), `level`, `target`, `message` and
//! `fields` (the event's other fields, typed). The final error and the end-of-run report are
//! JSON lines too ([`json_line`]), so a log collector reads every line of stderr.

use crate::args::LogFormat;
use serde_json::{Map, Value};
use std::fmt;
use std::io::IsTerminal;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The environment variable holding a log filter that replaces `-q`/`-v`.
pub const FILTER_ENV: &str = "SLUICE_LOG";

/// The filter `-q` / `-v` choose: sluice's crates one level above their dependencies.
pub fn default_filter(quiet: bool, verbose: u8) -> &'static str {
    match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn,sluice=info",
        (false, 1) => "info,sluice=debug",
        _ => "debug,sluice=trace",
    }
}

/// Whether text logs may carry colour: only on a terminal, and not when `NO_COLOR` is set to
/// anything but the empty string (<https://no-color.org>).
pub fn colour_allowed(no_color: Option<&std::ffi::OsStr>, terminal: bool) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Install the process's log subscriber. Called once, before anything logs.
pub fn init(format: LogFormat, quiet: bool, verbose: u8) {
    let (filter, bad_env) = match std::env::var(FILTER_ENV) {
        Ok(spec) => match EnvFilter::try_new(&spec) {
            Ok(f) => (f, None),
            Err(e) => (
                EnvFilter::new(default_filter(quiet, verbose)),
                Some(format!("{spec:?} ({e})")),
            ),
        },
        Err(_) => (EnvFilter::new(default_filter(quiet, verbose)), None),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_target(false)
            .with_ansi(colour_allowed(
                std::env::var_os("NO_COLOR").as_deref(),
                std::io::stderr().is_terminal(),
            ))
            .init(),
        LogFormat::Json => builder.event_format(JsonLines).init(),
    }
    if let Some(bad) = bad_env {
        tracing::warn!(
            "{FILTER_ENV}={bad} is not a log filter; using the default. Write e.g. \
             {FILTER_ENV}=debug or {FILTER_ENV}=warn,sluice_mysql=debug."
        );
    }
}

/// One JSON log line, for what the CLI writes to stderr itself (the final error, the report)
/// when logs are JSON: the same shape as the events [`JsonLines`] formats.
pub fn json_line(level: &str, message: &str, fields: Map<String, Value>) -> String {
    let mut line = Map::new();
    line.insert(
        "timestamp".into(),
        sluice_engine::export::now_rfc3339().into(),
    );
    line.insert("level".into(), level.into());
    line.insert("target".into(), "sluice".into());
    line.insert("message".into(), message.into());
    line.insert("fields".into(), Value::Object(fields));
    Value::Object(line).to_string()
}

/// Formats each event as one JSON object (see the module documentation). Spans are not
/// recorded: sluice's events carry their context in their message and fields.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            sluice_engine::export::now_rfc3339().into(),
        );
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        line.insert("message".into(), fields.message.unwrap_or_default().into());
        line.insert("fields".into(), Value::Object(fields.others));
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// An event's fields: `message` apart, the others as JSON values of their own type.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    others: Map<String, Value>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.message = Some(match value {
                Value::String(s) => s,
                other => other.to_string(),
            });
        } else {
            self.others.insert(field.name().to_string(), value);
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    /// Collects the targets of the events a filter lets through.
    struct Seen(Arc<Mutex<Vec<String>>>);
    impl<S: Subscriber> tracing_subscriber::Layer<S> for Seen {
        fn on_event(&self, e: &Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            if let Ok(mut v) = self.0.lock() {
                v.push(format!(
                    "{} {}",
                    e.metadata().level(),
                    e.metadata().target()
                ));
            }
        }
    }

    fn passed(filter: &str) -> Vec<String> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry()
            .with(EnvFilter::new(filter))
            .with(Seen(seen.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "sluice_mysql::snapshot", "x");
            tracing::debug!(target: "sluice_firebird::read", "x");
            tracing::debug!(target: "sluice_sink::objstore", "x");
            tracing::debug!(target: "sluice_engine::phase", "x");
            tracing::debug!(target: "sluice::read", "x");
            tracing::debug!(target: "hyper::client", "x");
            tracing::info!(target: "sluice_postgres::read", "x");
            tracing::info!(target: "hyper::client", "x");
        });
        seen.lock().map(|v| v.clone()).unwrap_or_default()
    }

    #[test]
    fn verbose_raises_every_sluice_crate_and_no_dependency() {
        let v1 = passed(default_filter(false, 1));
        for t in [
            "DEBUG sluice_mysql::snapshot",
            "DEBUG sluice_firebird::read",
            "DEBUG sluice_sink::objstore",
            "DEBUG sluice_engine::phase",
            "DEBUG sluice::read",
            "INFO hyper::client",
        ] {
            assert!(v1.contains(&t.to_string()), "-v lets {t} through: {v1:?}");
        }
        assert!(!v1.contains(&"DEBUG hyper::client".to_string()), "{v1:?}");
        let v0 = passed(default_filter(false, 0));
        assert_eq!(v0, ["INFO sluice_postgres::read"], "default: {v0:?}");
        assert!(passed(default_filter(true, 3)).is_empty());
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour_allowed(None, true));
        assert!(!colour_allowed(None, false));
        assert!(!colour_allowed(Some(OsStr::new("1")), true));
        // no-color.org: an empty NO_COLOR does not disable colour.
        assert!(colour_allowed(Some(OsStr::new("")), true));
    }

    #[test]
    fn json_lines_carry_level_message_and_typed_fields() {
        let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || Capture(sink.clone()))
            .event_format(JsonLines)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(
                sessions = 3u64,
                busy = true,
                who = "w\"1",
                "still {} busy",
                3
            );
        });
        let text = String::from_utf8(buf.lock().map(|b| b.clone()).unwrap_or_default())
            .unwrap_or_default();
        let v: Value = serde_json::from_str(text.trim()).unwrap_or(Value::Null);
        assert_eq!(v["level"], "WARN", "{text}");
        assert_eq!(v["message"], "still 3 busy", "{text}");
        assert_eq!(v["fields"]["sessions"], 3, "{text}");
        assert_eq!(v["fields"]["busy"], true, "{text}");
        assert_eq!(v["fields"]["who"], "w\"1", "{text}");
        assert!(v["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')));
    }

    struct Capture(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Capture {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut v) = self.0.lock() {
                v.extend_from_slice(b);
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
