#![allow(clippy::unwrap_used)]
//! The command line itself, run as a user would: log lines that a file or a collector can read
//! (no colour codes off a terminal, `NO_COLOR` on one, JSON lines), the phases in the log and
//! the report, `--version --verbose`, `doctor`, completions, the man page, and the README's
//! options table against `--help`.

use crate::common::*;
use std::path::Path;
use std::process::{Command, Stdio};

/// An SGR (colour) escape sequence; cursor movement of a progress bar is not one.
fn colour_codes(text: &str) -> Vec<String> {
    regex::Regex::new(r"\x1b\[[0-9;]*m")
        .unwrap()
        .find_iter(text)
        .map(|m| format!("{:?}", m.as_str()))
        .collect()
}

#[tokio::test]
async fn logs_written_to_a_file_carry_no_escape_codes_and_list_the_phases() {
    let db = TestDb::new().await;
    db.numbered("t", 20_000).await;
    let out = tempdir();
    let log = out.path().join("stderr.log");
    let report = out.path().join("report.json");
    let status = sluice()
        // The default level, which logs the phases.
        .env_remove("SLUICE_LOG")
        .env_remove("NO_COLOR")
        .args(["export", "--source", &db.url, "--table", "t", "--merge"])
        .arg("--to")
        .arg(out.path().join("data"))
        .arg("--report-json")
        .arg(&report)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .status()
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{text}");
    assert!(
        !text.contains('\x1b'),
        "escape codes in a log file:\n{text:?}"
    );
    // Every phase is logged with its number and duration, in order.
    let mut at = 0;
    for phase in [
        "phase 1/8 connect: ",
        "phase 2/8 plan: ",
        "phase 3/8 snapshot: ",
        "phase 4/8 read: ",
        "phase 6/8 merge: ",
        "phase 8/8 manifest: ",
    ] {
        let found = text[at..]
            .find(phase)
            .unwrap_or_else(|| panic!("{phase} after byte {at} in:\n{text}"));
        at += found + phase.len();
        assert!(
            text[at..].starts_with(|c: char| c.is_ascii_digit()),
            "{text}"
        );
    }
    // The text report lists them too, and so does the JSON report.
    assert!(text.contains("phases       1 connect "), "{text}");
    let r = files::json(&report);
    let names: Vec<&str> = r["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["connect", "plan", "snapshot", "read", "merge", "manifest"]
    );
    let sum: f64 = r["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["seconds"].as_f64().unwrap())
        .sum();
    let wall = r["wall_seconds"].as_f64().unwrap();
    assert!(
        sum <= wall + 1e-3,
        "phases {sum} s within the run's {wall} s"
    );
}

#[tokio::test]
async fn json_log_lines_parse_with_level_message_and_fields() {
    let db = TestDb::new().await;
    db.numbered("t", 20_000).await;
    let out = tempdir();
    let run_json = |args: &[&str], to: &Path| {
        run(sluice()
            .env_remove("SLUICE_LOG")
            .args(["--log-format", "json", "export", "--source", &db.url])
            .args(args)
            .arg("--to")
            .arg(to))
    };
    let ok = run_json(&["--table", "t"], &out.path().join("a"));
    ok.ok();
    let lines: Vec<serde_json::Value> = ok
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    for v in &lines {
        assert!(v["level"].is_string() && v["message"].is_string(), "{v}");
        assert!(v["fields"].is_object() && v["timestamp"].is_string(), "{v}");
    }
    assert!(
        lines.iter().any(|v| v["message"]
            .as_str()
            .unwrap()
            .starts_with("phase 4/8 read: ")),
        "{}",
        ok.stderr
    );
    let last = lines.last().unwrap();
    assert_eq!(last["message"], "sluice export finished");
    assert_eq!(last["fields"]["report"]["rows"], 20000);
    assert_eq!(
        last["fields"]["report"]["phases"].as_array().unwrap().len(),
        5,
        "no merge phase without --merge: {last}"
    );

    // The final error is a JSON line too, with its kind and exit code; the phase the run
    // stopped in is logged.
    let bad = run_json(&["--table", "missing"], &out.path().join("b"));
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    let lines: Vec<serde_json::Value> = bad
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["level"], "ERROR", "{last}");
    assert_eq!(last["fields"]["exit_code"], 2, "{last}");
    assert!(
        last["message"].as_str().unwrap().contains("missing"),
        "{last}"
    );
    assert!(
        lines.iter().any(|v| v["message"]
            .as_str()
            .unwrap()
            .starts_with("phase 2/8 plan: stopped after")),
        "{}",
        bad.stderr
    );

    // The YAML key does the same as the flag.
    let yaml = out.path().join("c.yaml");
    std::fs::write(
        &yaml,
        format!("source: {}\ntable: t\nlog_format: json\n", db.url),
    )
    .unwrap();
    let from_file = run(sluice()
        .env_remove("SLUICE_LOG")
        .args(["export", "-c"])
        .arg(&yaml)
        .arg("--to")
        .arg(out.path().join("c")));
    from_file.ok();
    for l in from_file.stderr.lines() {
        serde_json::from_str::<serde_json::Value>(l)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"));
    }
}

/// Run `sluice ARGS` on a pseudo-terminal (util-linux `script`), with `env` set, and return
/// what the terminal showed.
fn on_a_terminal(env: &str, args: &str) -> String {
    let cmd = format!("env {env} {} {args}", env!("CARGO_BIN_EXE_sluice"));
    let out = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("running script(1) from util-linux");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn colour_only_on_a_terminal_and_never_with_no_color() {
    // An invalid SLUICE_LOG is reported as a warning through the logger, which needs no server.
    let env = "SLUICE_LOG='[bad' NO_COLOR=";
    let coloured = on_a_terminal(env, "doctor");
    assert!(coloured.contains("is not a log filter"), "{coloured}");
    assert!(
        !colour_codes(&coloured).is_empty(),
        "a terminal gets colour: {coloured:?}"
    );
    let plain = on_a_terminal("SLUICE_LOG='[bad' NO_COLOR=1", "doctor");
    assert!(plain.contains("is not a log filter"), "{plain}");
    assert_eq!(colour_codes(&plain), Vec::<String>::new(), "{plain:?}");
}

/// The long flags `sluice CMD --help` lists (option lines only, not their descriptions).
fn help_flags(cmd: &str) -> Vec<String> {
    let help = run(sluice().args([cmd, "--help"]));
    help.ok();
    let line = regex::Regex::new(r"^  (?:-[A-Za-z], |    )--([a-z0-9-]+)").unwrap();
    let flags: Vec<String> = help
        .stdout
        .lines()
        .filter_map(|l| line.captures(l).map(|c| format!("--{}", &c[1])))
        .filter(|f| f != "--help")
        .collect();
    assert!(flags.len() > 10, "{}", help.stdout);
    flags
}

#[test]
fn every_flag_of_export_and_plan_help_is_in_the_readme_options_table() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let section = readme
        .split("\n## Options\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README has an Options section");
    // The first cell of every table row: where a flag is documented.
    let documented: String = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split(" | ").next())
        .collect::<Vec<_>>()
        .join(" ");
    let flag = regex::Regex::new(r"--[a-z0-9-]+").unwrap();
    let listed: Vec<&str> = flag.find_iter(&documented).map(|m| m.as_str()).collect();
    let mut missing = Vec::new();
    for cmd in ["export", "plan"] {
        for f in help_flags(cmd) {
            if !listed.contains(&f.as_str()) {
                missing.push(format!("{cmd} {f}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "flags missing from the README's options table: {missing:?}"
    );
}

#[test]
fn completions_for_each_shell_cover_the_commands() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let r = run(sluice().args(["completions", shell]));
        r.ok();
        for word in ["export", "plan", "chunk-size", "doctor"] {
            assert!(r.stdout.contains(word), "{shell}: {word} missing");
        }
    }
    let bad = run(sluice().args(["completions", "tcsh"]));
    assert_eq!(bad.code, 2, "{}", bad.stderr);
}

#[test]
fn man_pages_are_roff_generated_from_the_flags() {
    let page = run(sluice().arg("man"));
    page.ok();
    assert!(page.stdout.starts_with(".ie") || page.stdout.contains(".TH sluice 1"));
    assert!(page.stdout.contains(".TH sluice 1"), "{}", page.stdout);
    assert!(page.stdout.contains("export"), "{}", page.stdout);
    let dir = tempdir();
    run(sluice().args(["man", "--out-dir"]).arg(dir.path())).ok();
    let pages = files_under(dir.path());
    for p in [
        "sluice.1",
        "sluice-export.1",
        "sluice-plan.1",
        "sluice-doctor.1",
    ] {
        assert!(pages.contains(&p.to_string()), "{p} in {pages:?}");
    }
    let export = std::fs::read_to_string(dir.path().join("sluice-export.1")).unwrap();
    assert!(export.contains(r"\-\-chunk\-size"), "{export}");
}

/// The commit the tests were built from, when they run in a git checkout.
fn git_head() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn version_names_the_commit_and_verbose_version_the_sources() {
    let short = run(sluice().arg("--version"));
    short.ok();
    assert!(short.stdout.starts_with("sluice "), "{}", short.stdout);
    let long = run(sluice().args(["--version", "--verbose"]));
    long.ok();
    let commit = long
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("commit"))
        .map(|c| c.split_whitespace().next().unwrap_or("").to_string())
        .unwrap_or_else(|| panic!("no commit line in {}", long.stdout));
    match git_head() {
        Some(head) => {
            assert_eq!(commit, head, "{}", long.stdout);
            assert!(short.stdout.contains(&head[..12]), "{}", short.stdout);
        }
        None => assert_eq!(commit, "unknown", "{}", long.stdout),
    }
    for s in [
        "postgres://",
        "mysql://",
        "mariadb://",
        "firebird://",
        "s3://",
        "gs://",
        "az://",
        "parquet",
        "csv",
    ] {
        assert!(long.stdout.contains(s), "{s} in {}", long.stdout);
    }
    // -V and --version -v are the same flags.
    assert_eq!(run(sluice().arg("-V")).stdout, short.stdout);
    assert_eq!(run(sluice().args(["-V", "-v"])).stdout, long.stdout);
}

#[tokio::test]
async fn doctor_checks_the_source_the_output_and_the_firebird_library() {
    let db = TestDb::new().await;
    let dir = tempdir();
    let ok = run(sluice()
        .env_remove("FIREBIRD")
        .env_remove("FBCLIENT")
        .args(["doctor", "--source", &db.url, "--to"])
        .arg(dir.path().join("out")));
    ok.ok();
    assert!(ok.stdout.contains("commit"), "{}", ok.stdout);
    assert!(
        ok.stdout.contains("ok    source postgres://"),
        "{}",
        ok.stdout
    );
    assert!(ok.stdout.contains("PostgreSQL"), "{}", ok.stdout);
    assert!(ok.stdout.contains("ok    --to "), "{}", ok.stdout);
    assert!(
        !ok.stdout.contains("Firebird client library"),
        "{}",
        ok.stdout
    );

    // FIREBIRD set: the library it names is looked for (not loaded).
    let runtime = dir.path().join("fb");
    std::fs::create_dir_all(runtime.join("lib")).unwrap();
    let missing = run(sluice()
        .env_remove("FBCLIENT")
        .env("FIREBIRD", &runtime)
        .arg("doctor"));
    assert_eq!(missing.code, 2, "{}{}", missing.stdout, missing.stderr);
    assert!(
        missing.stdout.contains("FAIL  Firebird client library"),
        "{}",
        missing.stdout
    );
    std::fs::write(runtime.join("lib/libfbclient.so.2"), b"").unwrap();
    let found = run(sluice()
        .env_remove("FBCLIENT")
        .env("FIREBIRD", &runtime)
        .arg("doctor"));
    found.ok();
    assert!(
        found.stdout.contains("ok    Firebird client library"),
        "{}",
        found.stdout
    );

    // An unreachable source fails with the source exit code; the other checks still run.
    let down = run(sluice()
        .env_remove("FIREBIRD")
        .env_remove("FBCLIENT")
        .args([
            "doctor",
            "--source",
            "postgres://u:secret@127.0.0.1:1/db",
            "--to",
        ])
        .arg(dir.path().join("out2")));
    assert_eq!(down.code, 3, "{}{}", down.stdout, down.stderr);
    assert!(down.stdout.contains("FAIL  source"), "{}", down.stdout);
    assert!(down.stdout.contains("ok    --to "), "{}", down.stdout);
    assert!(!down.stdout.contains("secret"), "{}", down.stdout);
}
