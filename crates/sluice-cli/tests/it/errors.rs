#![allow(clippy::unwrap_used)]
//! Bad input: a clear message naming the problem and the fix, a distinct exit code, no secret
//! in any output, and no complete-looking output.

use crate::common::*;
use std::path::Path;
use std::process::Command;

const SECRET: &str = "Sup3rS3cretPw";

fn assert_failed(run: &Run, code: i32, needles: &[&str], out: Option<&Path>) {
    assert_eq!(
        run.code, code,
        "expected exit {code}, got {}:\n{}",
        run.code, run.stderr
    );
    for n in needles {
        assert!(
            run.stderr.contains(n),
            "stderr lacks {n:?}:\n{}",
            run.stderr
        );
    }
    assert!(
        !run.stderr.contains(SECRET) && !run.stdout.contains(SECRET),
        "a secret leaked:\n{}",
        run.stderr
    );
    if let Some(dir) = out {
        assert!(
            !dir.join("manifest.json").exists(),
            "a manifest was written"
        );
    }
}

/// A tmpfs mounted for one test, unmounted on drop.
struct Mount(tempfile::TempDir);

impl Mount {
    fn tmpfs(options: &str) -> Mount {
        let dir = tempdir();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir.path())
            .status();
        assert!(
            ok.is_ok_and(|s| s.success()),
            "mounting a tmpfs ({options}) failed: this test needs root (CI and scripts/test run as root)"
        );
        Mount(dir)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn unparsable_url() {
    let out = tempdir();
    let run = export(
        &format!("postgres://u:{SECRET}@localhost:notaport/db"),
        out.path(),
        &["--table", "t"],
    );
    assert_failed(
        &run,
        2,
        &["cannot be parsed", "postgres://user[:password]@host"],
        Some(out.path()),
    );
}

#[test]
fn unsupported_scheme() {
    let out = tempdir();
    let run = export(
        &format!("oracle://u:{SECRET}@localhost/db"),
        out.path(),
        &["--table", "t"],
    );
    assert_failed(
        &run,
        2,
        &["unsupported scheme \"oracle\""],
        Some(out.path()),
    );
}

#[test]
fn unreachable_host() {
    let out = tempdir();
    let port = sluice_testkit::server::free_port().unwrap();
    let run = export(
        &format!("postgres://u:{SECRET}@127.0.0.1:{port}/db"),
        out.path(),
        &["--table", "t"],
    );
    assert_failed(
        &run,
        3,
        &["could not connect", "server is running"],
        Some(out.path()),
    );
}

#[tokio::test]
async fn wrong_password() {
    let db = TestDb::new().await;
    let role = format!("r_{}", db.name);
    db.exec(&format!("CREATE ROLE {role} LOGIN PASSWORD 'right-one'"))
        .await;
    let out = tempdir();
    let run = export(
        &db.url_as(&role, Some(SECRET)),
        out.path(),
        &["--table", "t"],
    );
    assert_failed(&run, 3, &["28P01", "password"], Some(out.path()));
    // The same password from PGPASSWORD is hidden too.
    let run = crate::common::run(
        sluice()
            .env("PGPASSWORD", SECRET)
            .args([
                "export",
                "--source",
                &db.url_as(&role, None),
                "--table",
                "t",
                "--to",
            ])
            .arg(out.path()),
    );
    assert_failed(&run, 3, &["28P01"], Some(out.path()));
}

#[tokio::test]
async fn missing_database() {
    let url =
        sluice_testkit::pg::with_database(&sluice_testkit::pg::server_url(), "no_such_db_here");
    let out = tempdir();
    let run = export(&url, out.path(), &["--table", "t"]);
    assert_failed(
        &run,
        3,
        &["3D000", "no_such_db_here", "database name"],
        Some(out.path()),
    );
}

#[tokio::test]
async fn missing_table() {
    let db = TestDb::new().await;
    let out = tempdir();
    let run = export(&db.url, out.path(), &["--table", "public.nope"]);
    assert_failed(&run, 2, &["public.nope does not exist"], Some(out.path()));
}

#[tokio::test]
async fn no_select_privilege() {
    let db = TestDb::new().await;
    let role = format!("r_{}", db.name);
    db.exec(&format!(
        "CREATE TABLE secret_t (id int); CREATE ROLE {role} LOGIN PASSWORD '{SECRET}'"
    ))
    .await;
    let out = tempdir();
    let run = export(
        &db.url_as(&role, Some(SECRET)),
        out.path(),
        &["--table", "secret_t"],
    );
    assert_failed(
        &run,
        3,
        &[
            "no SELECT privilege on public.secret_t",
            "GRANT SELECT ON \"public\".\"secret_t\"",
        ],
        Some(out.path()),
    );
}

#[tokio::test]
async fn output_not_writable() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE t (id int); INSERT INTO t VALUES (1)")
        .await;
    let ro = Mount::tmpfs("ro,size=1m");
    let out = ro.0.path().join("out");
    let run = export(&db.url, &out, &["--table", "t"]);
    assert_failed(&run, 4, &["not writable", "--to"], None);
    // A --to that is a file.
    let dir = tempdir();
    let file = dir.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let run = export(&db.url, &file, &["--table", "t"]);
    assert_failed(&run, 2, &["is a file, not a directory"], None);
}

#[tokio::test]
async fn disk_full_leaves_nothing_complete_looking() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE big (id int, body text); INSERT INTO big SELECT g, md5(g::text) || md5((g*7)::text) FROM generate_series(1, 200000) g").await;
    let small = Mount::tmpfs("size=512k");
    for format in ["parquet", "csv"] {
        let out = small.0.path().join(format);
        let run = export(
            &db.url,
            &out,
            &[
                "--table",
                "big",
                "--format",
                format,
                "--compression",
                "none",
            ],
        );
        assert_failed(&run, 4, &["disk is full"], Some(&out));
        let left = files_under(&out);
        assert!(
            left.iter()
                .all(|f| !f.contains("part-") || f.starts_with("_sluice")),
            "{format}: files left behind: {left:?}"
        );
    }
}

#[test]
fn unknown_format() {
    let out = tempdir();
    let run = run(sluice()
        .args([
            "export",
            "--source",
            "postgres://u@h/db",
            "--table",
            "t",
            "--format",
            "xml",
            "--to",
        ])
        .arg(out.path()));
    assert_failed(
        &run,
        2,
        &["invalid value 'xml'", "parquet", "csv"],
        Some(out.path()),
    );
}

#[test]
fn bad_yaml_names_line_and_column() {
    let dir = tempdir();
    let cfg = dir.path().join("sluice.yaml");
    std::fs::write(
        &cfg,
        format!("source: postgres://u:{SECRET}@h/db\ntable: [a, b\nto: ./x\n"),
    )
    .unwrap();
    let run = run(sluice().args(["export", "-c"]).arg(&cfg));
    assert_failed(&run, 2, &["sluice.yaml is not valid at line"], None);
    std::fs::write(&cfg, "source: postgres://u@h/db\ntable: a\nparalell: 3\n").unwrap();
    let run = crate::common::run(sluice().args(["export", "-c"]).arg(&cfg));
    assert_failed(
        &run,
        2,
        &["line 3 column 1", "unknown field `paralell`"],
        None,
    );
}

#[test]
fn nothing_selected_and_bad_values() {
    let out = tempdir();
    assert_failed(
        &export("postgres://u@h/db", out.path(), &[]),
        2,
        &["nothing to export", "--table"],
        None,
    );
    assert_failed(
        &export(
            "postgres://u@h/db",
            out.path(),
            &["--table", "t", "--chunk-size", "12XB"],
        ),
        2,
        &["not a size"],
        None,
    );
    assert_failed(
        &export("postgres://u@h/db", out.path(), &["--table", "a.b.c"]),
        2,
        &["more than two dot-separated parts"],
        None,
    );
    assert_failed(
        &export(
            "postgres://u@h/db",
            out.path(),
            &["--table", "t", "--chunk-by", "rows"],
        ),
        2,
        &["not a strategy"],
        None,
    );
}

/// `--parallel` past what `--memory` holds is refused (exit 2) before anything is touched:
/// a complete output survives `--overwrite`, no session is opened (an unreachable source gives
/// the same refusal, not a connection error), the message names the memory needed and the
/// worker count that fits, and both ways out it names work. `sluice plan` warns beforehand.
#[tokio::test]
async fn workers_past_memory_are_refused_before_the_output_or_the_source_is_touched() {
    let db = TestDb::new().await;
    db.numbered("t", 20_000).await;
    let out = tempdir();
    export(&db.url, out.path(), &["--table", "t"]).ok();
    let before: Vec<(String, Vec<u8>)> = files_under(out.path())
        .into_iter()
        .filter(|f| !f.ends_with("lock.json"))
        .map(|f| (f.clone(), std::fs::read(out.path().join(&f)).unwrap()))
        .collect();
    assert!(before.iter().any(|(f, _)| f == "manifest.json"));

    let too_many = ["--table", "t", "--parallel", "64", "--overwrite"];
    let run = export(&db.url, out.path(), &too_many);
    assert_failed(
        &run,
        2,
        &["64 worker(s) need at least", "--memory is 64 MB"],
        None,
    );
    let after: Vec<(String, Vec<u8>)> = files_under(out.path())
        .into_iter()
        .filter(|f| !f.ends_with("lock.json"))
        .map(|f| (f.clone(), std::fs::read(out.path().join(&f)).unwrap()))
        .collect();
    assert_eq!(before, after, "the refused --overwrite changed the output");
    // The same refusal with a server that is not there: it is decided before connecting.
    let port = sluice_testkit::server::free_port().unwrap();
    let nowhere = format!("postgres://u:{SECRET}@127.0.0.1:{port}/db");
    let elsewhere = tempdir();
    let run2 = export(&nowhere, elsewhere.path(), &too_many);
    assert_failed(
        &run2,
        2,
        &["64 worker(s) need at least"],
        Some(elsewhere.path()),
    );
    assert!(files_under(elsewhere.path()).is_empty(), "nothing written");

    // Both ways out the message names are accepted.
    let need = regex::Regex::new(r"Raise --memory to (\d+)MB or lower --parallel to (\d+)")
        .unwrap()
        .captures(&run.stderr)
        .unwrap_or_else(|| panic!("no way out named:\n{}", run.stderr))
        .iter()
        .skip(1)
        .map(|m| m.unwrap().as_str().to_string())
        .collect::<Vec<_>>();
    let memory = format!("{}MB", need[0]);
    export(
        &db.url,
        out.path(),
        &[&too_many[..], &["--memory", &memory]].concat(),
    )
    .ok();
    export(
        &db.url,
        out.path(),
        &["--table", "t", "--parallel", &need[1], "--overwrite"],
    )
    .ok();

    // sluice plan says so beforehand, and not once the memory is there.
    let plan = |extra: &[&str]| -> serde_json::Value {
        let r = crate::common::run(
            sluice()
                .args([
                    "plan",
                    "--source",
                    &db.url,
                    "--table",
                    "t",
                    "--json",
                    "--parallel",
                    "64",
                ])
                .args(extra),
        );
        r.ok();
        serde_json::from_str(&r.stdout).unwrap()
    };
    let refused = plan(&[]);
    let notes = refused["notes"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().unwrap().contains("would refuse to start")),
        "{refused}"
    );
    let roomy = plan(&["--memory", &memory]);
    assert!(
        !roomy["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("refuse")),
        "{roomy}"
    );
    assert!(
        roomy["predicted_peak_rss_bytes"].as_u64().unwrap()
            <= (need[0].parse::<u64>().unwrap() << 20)
    );
}
