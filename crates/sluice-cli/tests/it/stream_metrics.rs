//! `sluice stream --metrics-addr` and `sluice replicate --metrics-addr`: a running stream's Prometheus metrics (labelled per table and
//! operation, batch histograms), a second stream on the same slot refused, SIGTERM stopping it
//! after a commit; and the dashboard and alert rules shipped in `deploy/` — valid, and using
//! only metrics a running stream serves.

use crate::common::{self, TestDb, run, tempdir};
use crate::stream::{assert_replay_equals_table, create_acct, slots_and_publications, stream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Metric `name` of the scraped `text` is at least `min`.
fn at_least(text: &str, name: &str, min: f64) {
    assert!(metric(text, name) >= min, "{name} below {min} in:\n{text}");
}

fn deploy(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(file)
}

const DASHBOARDS: [&str; 2] = [
    "grafana/sluice-stream.json",
    "grafana/sluice-replicate.json",
];
const ALERTS: &str = "prometheus/sluice-alerts.yml";

/// The `<prefix>…` names (`sluice_stream_`, `sluice_replicate_`) the dashboards' queries and
/// the alert rules' expressions use.
fn deploy_metrics(prefix: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for file in DASHBOARDS.into_iter().chain([ALERTS]) {
        let text = std::fs::read_to_string(deploy(file)).unwrap();
        for (at, _) in text.match_indices(prefix) {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    assert!(names.len() >= 8, "{names:?}");
    names
}

/// Every metric of `prefix` the shipped dashboards and alert rules use is in `scraped`.
fn assert_deploy_metrics_served(prefix: &str, scraped: &str) {
    for name in deploy_metrics(prefix) {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|base| scraped.contains(&format!("# TYPE {base} histogram")))
            .unwrap_or(&name);
        assert!(
            scraped.contains(&format!("# TYPE {family} ")),
            "deploy/ uses {name}, which /metrics does not serve:\n{scraped}"
        );
    }
}

/// The dashboards are Grafana dashboards whose every panel queries Prometheus for their
/// command's metrics; each alert rule has a name, an expression on sluice's metrics, a
/// severity and a summary.
#[test]
fn the_shipped_dashboards_and_alert_rules_are_well_formed() {
    for (file, uid) in DASHBOARDS.iter().zip(["sluice-stream", "sluice-replicate"]) {
        let d: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(deploy(file)).unwrap()).unwrap();
        assert_eq!(d["uid"], uid);
        let panels = d["panels"].as_array().unwrap();
        assert!(panels.len() >= 5, "{file}: {} panels", panels.len());
        let prefix = format!("{}_", uid.replace('-', "_"));
        for p in panels {
            let targets = p["targets"].as_array().unwrap();
            assert!(
                !targets.is_empty(),
                "{file}: panel {} has no query",
                p["title"]
            );
            for t in targets {
                let expr = t["expr"].as_str().unwrap();
                assert!(expr.contains(&prefix), "{file}: {expr}");
                assert_eq!(
                    expr.matches('(').count(),
                    expr.matches(')').count(),
                    "{expr}"
                );
            }
        }
    }
    let rules: serde_json::Value =
        yaml_serde::from_str(&std::fs::read_to_string(deploy(ALERTS)).unwrap()).unwrap();
    let rules: Vec<&serde_json::Value> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    let names: Vec<&str> = rules.iter().map(|r| r["alert"].as_str().unwrap()).collect();
    for want in [
        "SluiceStreamLagging",
        "SluiceStreamRetainsLog",
        "SluiceStreamNoCommit",
        "SluiceStreamRestarting",
        "SluiceReplicateLagging",
        "SluiceReplicateStalled",
    ] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    for r in rules {
        assert!(r["expr"].as_str().unwrap().contains("sluice_"), "{r}");
        assert!(r["labels"]["severity"].is_string(), "{r}");
        assert!(r["annotations"]["summary"].is_string(), "{r}");
    }
}

/// `/metrics` of the run serving on `port`, or `None` while it does not answer.
pub(crate) fn scrape(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The value of metric `name` in scraped `text`.
pub(crate) fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_stream_serves_metrics_refuses_a_second_one_and_stops_on_sigterm() {
    let db = TestDb::new().await;
    create_acct(&db, 1_000).await;
    let to = tempdir();
    let port = sluice_testkit::server::free_port().unwrap();
    let mut child = common::spawn(&mut stream(
        &db.url,
        to.path(),
        &[
            "--slot",
            "metrics_slot",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ],
    ));
    // Once the snapshot is written, the stream is reading from the slot.
    let state = to.path().join("_sluice/stream.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&state).is_ok_and(|s| s.contains("\"done\": true")) {
        assert!(Instant::now() < deadline, "the snapshot did not finish");
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the stream ended ({status})");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    db.exec("UPDATE acct SET v = v + 1 WHERE id <= 100").await;
    let text = loop {
        assert!(Instant::now() < deadline, "no changes counted in time");
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the stream ended ({status})");
        }
        if let Some(s) = scrape(port)
            && s.contains(r#"sluice_stream_changes_total{table="public.acct",op="update"} 100"#)
            && metric(&s, "sluice_stream_batches_total") >= 1.0
            && metric(&s, "sluice_stream_committed_position") > 0.0
        {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    at_least(&text, "sluice_stream_committed_seq", 100.0);
    // The committed position is the LSN the stream confirmed: not past the server's end.
    let end = db
        .row_strings("SELECT (pg_current_wal_lsn() - '0/0')::bigint")
        .await;
    let end: f64 = end[0].parse().unwrap();
    let committed = metric(&text, "sluice_stream_committed_position");
    assert!(committed > 0.0 && committed <= end, "{committed} vs {end}");
    assert!(text.contains("sluice_stream_retained_bytes"), "{text}");
    assert!(text.contains("sluice_stream_lag_seconds"), "{text}");
    // Labelled per table and operation; the batch histograms count the committed batch.
    for line in [
        r#"sluice_stream_changes_total{table="public.acct",op="insert"} 0"#,
        r#"sluice_stream_files_total{table="public.acct"} "#,
        r#"sluice_stream_commit_to_file_seconds_bucket{le="+Inf"} "#,
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }
    at_least(&text, "sluice_stream_batch_changes_count", 1.0);
    at_least(&text, "sluice_stream_batch_changes_sum", 100.0);
    assert!(
        metric(
            &text,
            r#"sluice_stream_bytes_written_total{table="public.acct"}"#
        ) > 0.0
    );
    // Every metric the shipped dashboard and alert rules use is served.
    assert_deploy_metrics_served("sluice_stream_", &text);
    // A second stream on the same slot is refused.
    let other = tempdir();
    let r = run(&mut stream(
        &db.url,
        other.path(),
        &["--slot", "metrics_slot", "--until-current"],
    ));
    r.refused(2, &["in use"]);
    // SIGTERM stops it cleanly, after committing.
    common::stop(child);
    let r = assert_replay_equals_table(&db, to.path()).await;
    assert_eq!(r.changes.len(), 100);
    run(&mut stream(&db.url, to.path(), &["--drop"])).ok();
    assert_eq!(slots_and_publications(&db).await, (0, 0));
}

/// `sluice replicate --metrics-addr`: once the initial load is applied, 100 source updates are
/// counted as applied changes, the apply latency histogram observes their units, and the
/// target equals the source when SIGTERM has stopped the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_replication_serves_metrics() {
    let (source, target) = (TestDb::new().await, TestDb::new().await);
    create_acct(&source, 1_000).await;
    let port = sluice_testkit::server::free_port().unwrap();
    let mut child = common::spawn(common::replicate(&source.url, &target.url).args([
        "--table",
        "public.acct",
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
    ]));
    let deadline = Instant::now() + Duration::from_secs(60);
    // The initial load is on the target once its rows are there.
    let loaded = || async {
        let r = target
            .client
            .query_one("SELECT count(*) FROM public.acct", &[])
            .await;
        r.ok().map(|r| r.get::<_, i64>(0)) == Some(1000)
    };
    while !loaded().await {
        assert!(Instant::now() < deadline, "the initial load did not finish");
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the replication ended ({status})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    source
        .exec("UPDATE acct SET v = v + 1 WHERE id <= 100")
        .await;
    let text = loop {
        assert!(
            Instant::now() < deadline,
            "no applied changes counted in time"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the replication ended ({status})");
        }
        if let Some(s) = scrape(port)
            && metric(&s, "sluice_replicate_changes_total") >= 100.0
        {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    at_least(&text, "sluice_replicate_transactions_total", 1.0);
    at_least(&text, "sluice_replicate_apply_latency_seconds_count", 1.0);
    assert!(
        text.contains("# TYPE sluice_replicate_lag_seconds gauge"),
        "{text}"
    );
    assert!(
        text.contains("sluice_replicate_apply_latency_seconds_bucket{le=\"+Inf\"}"),
        "{text}"
    );
    assert_deploy_metrics_served("sluice_replicate_", &text);
    assert!(
        text.contains(
            r#"sluice_replicate_table_changes_total{table="public.acct",op="update"} 100"#
        ),
        "per table and operation:\n{text}"
    );
    common::stop(child);
    let sql = "SELECT id, v, pad FROM public.acct";
    assert_eq!(source.row_strings(sql).await, target.row_strings(sql).await);
    run(common::replicate(&source.url, &target.url).args(["--table", "public.acct", "--drop"]))
        .ok();
}
