//! The harm budget on PostgreSQL: the export steers its pace by foreign load, between chunks.
//!
//! - replay paused on the kit's streaming replica (`--pg-replica`) during an export with
//!   `--max-replica-lag`: new chunks wait and the run says why, go on once replay resumes, and
//!   the output is the table;
//! - a foreign lock holds the canary (`--probe-sql`) past `--max-latency`: workers drop, the
//!   run pauses, then recovers; the report's timeline shows it;
//! - a signal that cannot be read (an unreachable `--replica`, a role without `pg_monitor`)
//!   pauses the run and says so; `--harm-budget none` never reads it; `sluice plan` says which
//!   signals it could read;
//! - `--max-xmin-age` under a snapshot stops the run before it is exceeded, and `--resume`
//!   finishes under a new snapshot;
//! - `--report-html` is one self-contained page with a chart, with points, for every signal,
//!   which headless Chromium parses and draws.
//!
//! Every moment is placed with the `budget.before_chunk` failpoint (workers wait there before
//! asking for a chunk) and the run's own log lines, never with sleeps. Tests that pause the
//! replica's replay take it alone (`REPLAY`).
//!
//! Length: about 590 lines — seven scenarios over one helper that watches a run's log lines
//! (`Watched`, shared with `harm_budget_mysql.rs`), and the screenshots the HTML report's
//! test compares.

use crate::common::{Failpoints, TestDb, files, finish, sluice, tempdir};
use sluice_testkit::pg::{connect, replica_url};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Taken by the tests that pause the replica's replay.
pub(crate) static REPLAY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A run whose stderr is read as it comes, so a test can wait for a line.
pub(crate) struct Watched {
    pub(crate) child: Option<Child>,
    stderr: Arc<Mutex<String>>,
}

impl Watched {
    pub(crate) fn spawn(mut cmd: Command) -> Watched {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running sluice");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Watched {
            child: Some(child),
            stderr,
        }
    }

    /// Whether stderr holds `needle` after the first `anchor`.
    fn said(&self, anchor: &str, needle: &str) -> bool {
        let s = self.stderr.lock().unwrap();
        s.find(anchor)
            .is_some_and(|i| s[i + anchor.len()..].contains(needle))
    }

    /// Wait until the run has said `needle` on stderr (it ending first fails the test).
    pub(crate) async fn wait_for(&mut self, needle: &str) {
        self.wait_for_after("", needle).await
    }

    /// Wait until the run has said `needle` after it said `anchor`.
    pub(crate) async fn wait_for_after(&mut self, anchor: &str, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.said(anchor, needle) {
            let child = self.child.as_mut().expect("a running child");
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "sluice ended ({status}) before saying {needle:?}:\n{}",
                    self.stderr.lock().unwrap()
                );
            }
            assert!(
                Instant::now() < deadline,
                "sluice did not say {needle:?}:\n{}",
                self.stderr.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait for the end: (exit code, stderr).
    pub(crate) async fn finish(mut self) -> (i32, String) {
        let child = self.child.take().expect("a running child");
        let out = tokio::task::spawn_blocking(move || finish(child))
            .await
            .unwrap();
        // The reader thread has the rest once the pipe closed.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&self.stderr) > 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let err = self.stderr.lock().unwrap().clone();
        (out.status.code().unwrap_or(-1), err)
    }

    pub(crate) fn kill(mut self) -> String {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `sluice export` of `t` from `url` into `out` in 64KB key ranges with `args`, failpoints
/// `spec` armed.
pub(crate) fn export_cmd(
    url: &str,
    out: &Path,
    args: &[&str],
    fp: &Failpoints,
    spec: Option<&str>,
) -> Command {
    let mut c = sluice();
    c.arg("export")
        .args(["--source", url, "--table", "t", "--to"])
        .arg(out)
        .args(["--chunk-by", "key", "--chunk-size", "64KB"])
        .args(args);
    if let Some(spec) = spec {
        fp.arm(&mut c, spec);
    }
    c
}

/// `sluice plan` of `t` from `url` with a replica lag budget read on `replica`.
pub(crate) fn plan_with_replica(url: &str, replica: &str) -> crate::common::Run {
    crate::common::run(sluice().args([
        "plan",
        "--source",
        url,
        "--table",
        "t",
        "--max-replica-lag",
        "5s",
        "--replica",
        replica,
    ]))
}

/// A table of 20,000 numbered rows (several 64KB chunks).
async fn table(db: &TestDb) {
    db.numbered("t", 20_000).await;
}

/// The output is exactly the table.
async fn assert_exact(db: &TestDb, out: &Path) {
    let got = files::row_strings(&files::dataset_batches(&out.join("public.t")));
    assert_eq!(got, db.row_strings("SELECT id, v FROM t").await);
}

fn report(path: &Path) -> serde_json::Value {
    files::json(path)
}

#[tokio::test(flavor = "multi_thread")]
async fn replica_lag_pauses_new_chunks_until_replay_resumes() {
    let _alone = REPLAY.lock().await;
    let db = TestDb::new().await;
    table(&db).await;
    let replica = connect(&replica_url()).await;
    // Replay runs at the start, whatever an earlier failed run left.
    replica
        .batch_execute("SELECT pg_wal_replay_resume()")
        .await
        .unwrap();
    let out = tempdir();
    let json = out.path().join("report.json");
    let fp = Failpoints::new();
    let cmd = export_cmd(
        &db.url,
        &out.path().join("out"),
        &[
            "--parallel",
            "2",
            "--max-replica-lag",
            "2s",
            "--replica",
            &replica_url(),
            "--report-json",
            json.to_str().unwrap(),
        ],
        &fp,
        Some("budget.before_chunk=wait"),
    );
    let mut run = Watched::spawn(cmd);
    fp.reached("budget.before_chunk", run.child.as_mut().unwrap())
        .await;
    // Replay stops; the primary goes on committing, so the replica falls behind.
    replica
        .batch_execute("SELECT pg_wal_replay_pause()")
        .await
        .unwrap();
    db.exec("CREATE TABLE elsewhere (x int); INSERT INTO elsewhere VALUES (1);")
        .await;
    run.wait_for("harm budget: paused: replica lag").await;
    // The workers now ask for chunks and wait; replay resumes and they go on.
    fp.release("budget.before_chunk");
    replica
        .batch_execute("SELECT pg_wal_replay_resume()")
        .await
        .unwrap();
    let (code, stderr) = run.finish().await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("harm budget: resumed"), "{stderr}");
    assert_exact(&db, &out.path().join("out")).await;
    let r = report(&json);
    let tl = &r["timeline"];
    assert!(
        tl["pauses"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["reason"].as_str().unwrap().starts_with("replica lag")),
        "{tl}"
    );
    let names: Vec<&str> = tl["signals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(
        names.iter().any(|n| n.contains("pg_stat_replication")),
        "{names:?}"
    );
    assert!(
        names
            .iter()
            .filter(|n| n.starts_with("replica lag"))
            .count()
            == 2
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_lock_on_the_canary_drops_workers_then_they_recover() {
    let db = TestDb::new().await;
    table(&db).await;
    db.exec("CREATE TABLE canary (x int); INSERT INTO canary VALUES (1);")
        .await;
    let out = tempdir();
    let json = out.path().join("report.json");
    let fp = Failpoints::new();
    let mut cmd = export_cmd(
        &db.url,
        &out.path().join("out"),
        &[
            "--parallel",
            "4",
            "--max-latency",
            "300ms",
            "--probe-sql",
            "SELECT count(*) FROM canary",
            "--report-json",
            json.to_str().unwrap(),
        ],
        &fp,
        Some("budget.before_chunk=wait"),
    );
    // The worker count's changes are logged at info.
    cmd.env("SLUICE_LOG", "warn,sluice_engine=info");
    let mut run = Watched::spawn(cmd);
    fp.reached("budget.before_chunk", run.child.as_mut().unwrap())
        .await;
    let locker = connect(&db.url).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE canary IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    run.wait_for("harm budget: paused: canary latency p95")
        .await;
    locker.batch_execute("COMMIT").await.unwrap();
    run.wait_for("harm budget: resumed").await;
    // Recovery: a worker more, after the resume.
    run.wait_for_after("harm budget: resumed", "INFO harm budget: ")
        .await;
    fp.release("budget.before_chunk");
    let (code, stderr) = run.finish().await;
    assert_eq!(code, 0, "{stderr}");
    assert_exact(&db, &out.path().join("out")).await;
    let tl = &report(&json)["timeline"];
    assert!(tl["min_workers"].as_u64().unwrap() <= 2, "{tl}");
    let pauses = tl["pauses"].as_array().unwrap();
    assert!(
        pauses
            .iter()
            .any(|p| p["reason"].as_str().unwrap().contains("canary latency p95")),
        "{tl}"
    );
    let points = tl["points"].as_array().unwrap();
    let workers: Vec<u64> = points
        .iter()
        .map(|p| p["workers"].as_u64().unwrap())
        .collect();
    let fewest = *workers.iter().min().unwrap();
    assert!(fewest <= 2, "{workers:?}");
    let low = workers.iter().position(|w| *w == fewest).unwrap();
    assert!(workers[low..].iter().any(|w| *w > fewest), "{workers:?}");
    assert!(points.iter().any(|p| p["paused"].is_string()), "{tl}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_signal_pauses_and_says_so() {
    let db = TestDb::new().await;
    table(&db).await;
    let nowhere = "postgres://postgres@127.0.0.1:1/postgres";
    // `sluice plan` says which signals it could read.
    let plan = plan_with_replica(&db.url, nowhere);
    plan.ok();
    assert!(
        plan.stdout.lines().any(|l| l
            .starts_with("signal       replica lag (pg_stat_replication): ")
            && l.ends_with("(readable)")),
        "{}",
        plan.stdout
    );
    assert!(
        plan.stdout
            .contains("replica lag (postgres://postgres@127.0.0.1:1/postgres): could not be read"),
        "{}",
        plan.stdout
    );
    // An unreachable replica: new chunks wait, and the run says why.
    let out = tempdir();
    let fp = Failpoints::new();
    let args = ["--max-replica-lag", "5s", "--replica", nowhere];
    let mut run = Watched::spawn(export_cmd(&db.url, &out.path().join("a"), &args, &fp, None));
    run.wait_for(
        "harm budget: paused: replica lag (postgres://postgres@127.0.0.1:1/postgres) unreadable",
    )
    .await;
    let stderr = run.kill();
    assert!(!out.path().join("a/manifest.json").exists(), "{stderr}");
    // --harm-budget none never reads it.
    let none = crate::common::run(&mut export_cmd(
        &db.url,
        &out.path().join("b"),
        &["--harm-budget", "none", "--replica", nowhere],
        &fp,
        None,
    ));
    none.ok();
    assert!(!none.stderr.contains("harm budget"), "{}", none.stderr);
    assert_exact(&db, &out.path().join("b")).await;
    // A role that may not see other sessions cannot count them.
    let role = format!("nomonitor_{:08x}", rand::random::<u32>());
    db.exec(&format!(
        "CREATE ROLE {role} LOGIN PASSWORD 'nomonitor-pw'; GRANT SELECT ON t TO {role};"
    ))
    .await;
    let url = db.url_as(&role, Some("nomonitor-pw"));
    let mut cmd = sluice();
    cmd.arg("export")
        .args(["--source", &url, "--table", "t", "--to"])
        .arg(out.path().join("c"))
        .args(["--max-active", "100"]);
    let mut run = Watched::spawn(cmd);
    run.wait_for("harm budget: paused: active sessions of others unreadable")
        .await;
    let stderr = run.kill();
    assert!(stderr.contains("grant it pg_monitor"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_xmin_budget_stops_a_snapshot_run_and_resume_finishes_it() {
    let db = TestDb::new().await;
    table(&db).await;
    let out = tempdir();
    let to = out.path().join("out");
    let fp = Failpoints::new();
    // The first chunk is read; the worker then waits at the next chunk boundary while the
    // snapshot ages past the budget.
    let mut run = Watched::spawn(export_cmd(
        &db.url,
        &to,
        &["--parallel", "1", "--max-xmin-age", "3s"],
        &fp,
        Some("budget.before_chunk=wait@2"),
    ));
    fp.reached("budget.before_chunk", run.child.as_mut().unwrap())
        .await;
    run.wait_for("stopping before the next chunk would exceed it")
        .await;
    fp.release("budget.before_chunk");
    let (code, stderr) = run.finish().await;
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("--resume"), "{stderr}");
    assert!(!to.join("manifest.json").exists());
    let resumed = crate::common::run(&mut export_cmd(&db.url, &to, &["--resume"], &fp, None));
    resumed.ok();
    assert_exact(&db, &to).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rate_cap_reads_everything_and_a_bad_one_is_refused() {
    let db = TestDb::new().await;
    table(&db).await;
    let out = tempdir();
    let fp = Failpoints::new();
    let capped = crate::common::run(&mut export_cmd(
        &db.url,
        &out.path().join("a"),
        &["--parallel", "2", "--max-rate", "400000rows/s"],
        &fp,
        None,
    ));
    capped.ok();
    assert_exact(&db, &out.path().join("a")).await;
    let bad = crate::common::run(&mut export_cmd(
        &db.url,
        &out.path().join("b"),
        &["--max-rate", "5MB"],
        &fp,
        None,
    ));
    bad.refused(2, &["--max-rate \"5MB\" is no rate"]);
    let contradiction = crate::common::run(&mut export_cmd(
        &db.url,
        &out.path().join("c"),
        &["--harm-budget", "none", "--max-latency", "1s"],
        &fp,
        None,
    ));
    assert_eq!(contradiction.code, 2, "{}", contradiction.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_html_report_has_a_chart_with_points_for_every_signal() {
    let db = TestDb::new().await;
    table(&db).await;
    let out = tempdir();
    let html = out.path().join("report.html");
    let json = out.path().join("report.json");
    let fp = Failpoints::new();
    let run = crate::common::run(&mut export_cmd(
        &db.url,
        &out.path().join("out"),
        &[
            "--max-latency",
            "10s",
            "--max-replica-lag",
            "10min",
            "--max-active",
            "1000",
            "--report-html",
            html.to_str().unwrap(),
            "--report-json",
            json.to_str().unwrap(),
        ],
        &fp,
        None,
    ));
    run.ok();
    let page = std::fs::read_to_string(&html).unwrap();
    let signals = report(&json)["timeline"]["signals"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(signals.len(), 3, "{signals:?}");
    // Self-contained: no script, no external resource.
    for banned in ["<script", "src=", "href=", "url(", "@import"] {
        assert!(!page.contains(banned), "{banned} in the page");
    }
    // A figure per chart: throughput, workers, then each signal, each a path with points.
    let figures: Vec<&str> = page.split("<figure>").skip(1).collect();
    assert_eq!(figures.len(), 2 + signals.len());
    for s in &signals {
        let name = s["name"].as_str().unwrap();
        let fig = figures
            .iter()
            .find(|f| f.starts_with(&format!("<figcaption>{name}</figcaption>")))
            .unwrap_or_else(|| panic!("no chart of {name}"));
        let d = fig
            .split("<path class=\"line\" d=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("no line in the chart of {name}"));
        let point = d
            .trim_start_matches('M')
            .split([' ', 'L'])
            .next()
            .unwrap_or_default();
        let xy: Vec<f64> = point.split(',').filter_map(|v| v.parse().ok()).collect();
        assert_eq!(xy.len(), 2, "the chart of {name} has no point: {d:?}");
        assert!(fig.contains("class=\"limit\""), "no limit line for {name}");
    }
    // A browser draws it: headless Chromium parses every chart as an SVG element, and each
    // chart's drawing changes its screenshot. The oracle is the browser's own rendering of the
    // same page with the charts' drawings left out (the same layout, the SVG elements empty).
    let dom = chromium(&["--dump-dom".to_string(), file_url(&html)]);
    assert_eq!(dom.matches("<svg").count(), figures.len(), "{dom}");
    let bare = out.path().join("bare.html");
    let empty: String = page
        .split("<svg")
        .enumerate()
        .map(
            |(i, part)| match (i, part.split_once('>'), part.split_once("</svg>")) {
                (0, _, _) => part.to_string(),
                (_, Some((open, _)), Some((_, after))) => format!("<svg{open}></svg>{after}"),
                _ => panic!("an unclosed SVG element in the page"),
            },
        )
        .collect();
    std::fs::write(&bare, empty).unwrap();
    let (drawn, blank) = (
        screenshot(&html, &out.path().join("page.png")),
        screenshot(&bare, &out.path().join("bare.png")),
    );
    assert_eq!(drawn.len(), blank.len(), "the two pages differ in size");
    let changed = drawn
        .chunks(4)
        .zip(blank.chunks(4))
        .filter(|(a, b)| a != b)
        .count();
    // Each chart's line, axes and limit take over a thousand pixels (about 2,600 each here);
    // charts that drew nothing would leave the screenshots nearly equal.
    assert!(
        changed > 1_000 * figures.len(),
        "the charts drew {changed} pixels in all ({} charts)",
        figures.len()
    );
}

/// A screenshot of `page` by headless Chromium, as RGBA pixels.
fn screenshot(page: &Path, png: &Path) -> Vec<u8> {
    chromium(&[
        format!("--screenshot={}", png.display()),
        "--window-size=1200,3000".to_string(),
        "--hide-scrollbars".to_string(),
        file_url(page),
    ]);
    let decoder = png::Decoder::new(std::fs::File::open(png).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    match info.color_type {
        png::ColorType::Rgba => buf,
        png::ColorType::Rgb => buf
            .chunks(3)
            .flat_map(|p| [p[0], p[1], p[2], 255])
            .collect(),
        other => panic!("a screenshot in {other:?}"),
    }
}

fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// Run headless Chromium (installed by `scripts/test`) with `args`; its stdout.
fn chromium(args: &[String]) -> String {
    let out = Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu"])
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("chromium could not be run ({e}): scripts/test installs it (Debian chromium)")
        });
    assert!(
        out.status.success(),
        "chromium {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
