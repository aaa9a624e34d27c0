#![allow(clippy::unwrap_used)]
//! Row-level security: a role under a policy must not get a silently filtered export. sluice
//! reads with `row_security = off` (as pg_dump does) and refuses up front, naming the table and
//! the fix; `--enable-row-security` exports only the visible rows and says so in the manifest.

use crate::common::*;

const SECRET: &str = "rls-pw-Xq7";

#[tokio::test]
async fn a_role_under_a_policy_is_refused_unless_it_opts_in() {
    let db = TestDb::new().await;
    let role = format!("r_{}", db.name);
    db.exec(&format!(
        "CREATE ROLE {role} LOGIN PASSWORD '{SECRET}';
         CREATE TABLE secret (id int PRIMARY KEY, team text NOT NULL);
         INSERT INTO secret SELECT g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END
           FROM generate_series(1, 100) g;
         ALTER TABLE secret ENABLE ROW LEVEL SECURITY;
         CREATE POLICY team_a ON secret FOR SELECT USING (team = 'a');
         CREATE TABLE plain (id int); INSERT INTO plain VALUES (1);
         GRANT SELECT ON secret, plain TO {role};"
    ))
    .await;
    let url = db.url_as(&role, Some(SECRET));

    // Refused before anything is read.
    let out = tempdir();
    let run = export(&url, out.path(), &["--table", "secret", "--table", "plain"]);
    run.refused(
        3,
        &[
            "row-level security policies on public.secret",
            &role,
            "BYPASSRLS",
            "--enable-row-security",
        ],
    );
    assert!(!out.path().join("manifest.json").exists());
    assert!(!run.stderr.contains(SECRET));

    // A query the catalog check cannot see through fails the read instead of being filtered:
    // the sessions run with row_security = off.
    let run = export(
        &url,
        tempdir().path(),
        &["--query", "q=SELECT id FROM secret"],
    );
    run.refused(3, &["row-level security", "BYPASSRLS"]);

    // Opting in exports the visible rows, and says so.
    let out = tempdir();
    let run = export(
        &url,
        out.path(),
        &[
            "--table",
            "secret",
            "--table",
            "plain",
            "--enable-row-security",
        ],
    );
    run.ok();
    let m = files::manifest(out.path());
    assert_eq!(m["request"]["enable_row_security"], true);
    let secret = &m["datasets"][0];
    assert_eq!(secret["name"], "public.secret");
    assert_eq!(secret["rows"], 50);
    assert_eq!(secret["row_security_filtered"], true);
    assert!(m["datasets"][1].get("row_security_filtered").is_none());
    assert!(
        run.stderr
            .contains("public.secret: row-level security policies filtered its rows"),
        "{}",
        run.stderr
    );

    // The fix the message names works: with BYPASSRLS every row is exported.
    db.exec(&format!("ALTER ROLE {role} BYPASSRLS")).await;
    let out = tempdir();
    export(&url, out.path(), &["--table", "secret"]).ok();
    let m = files::manifest(out.path());
    assert_eq!(m["datasets"][0]["rows"], 100);
    assert!(m["datasets"][0].get("row_security_filtered").is_none());
}
