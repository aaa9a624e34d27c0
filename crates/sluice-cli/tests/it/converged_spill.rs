#![allow(clippy::unwrap_used)]
//! `--consistency converged` whose changed keys outgrow their share of `--memory` (half): the
//! follower writes them, sorted, to files in the temporary directory and the run converges as
//! it does in memory. Mid-run (paused after the first parts), one transaction updates every
//! row of a table with a two-column text key and moves them (the updates grow the rows past
//! their pages), another deletes and inserts keys; the output must equal the table after both,
//! read by the server itself (nothing writes after them, so T follows them).

use crate::common::*;

const ROWS: i64 = 200_000;

#[tokio::test]
async fn changed_keys_past_their_memory_share_spill_to_disk_and_converge() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "CREATE TABLE acct (tenant text, id bigint, v int NOT NULL, pad text NOT NULL,
           PRIMARY KEY (tenant, id));
         CREATE INDEX ON acct (v);
         INSERT INTO acct SELECT 'tenant-of-the-lab-' || (g % 97), g, 0, md5(g::text)
           FROM generate_series(1, {ROWS}) g;
         ANALYZE acct;"
    ))
    .await;
    let tmp = tempdir();
    let dir = tmp.path().join("data");
    let fp = Failpoints::new();
    let mut cmd = sluice();
    // The spill says so at info.
    cmd.env("SLUICE_LOG", "warn,sluice_stream=info");
    cmd.args(["export", "--source", &db.url, "--table", "acct", "--to"])
        .arg(&dir)
        .args(["--consistency", "converged", "--parallel", "2"])
        .args(["--chunk-size", "8MB", "--memory", "24MB"]);
    let changes = async {
        db.exec("UPDATE acct SET v = v + 1, pad = pad || repeat('x', 40)")
            .await;
        db.exec(
            "BEGIN;
             DELETE FROM acct WHERE id % 10 = 3;
             INSERT INTO acct SELECT 'late-' || (g % 7), g, -1, 'new'
               FROM generate_series(1, 5000) g;
             UPDATE acct SET id = id + 1000000 WHERE id % 10 = 7;
             COMMIT;",
        )
        .await;
    };
    let out = fp
        .run_paused_at(&mut cmd, "export.after_receipt", changes)
        .await;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("spilled to disk"),
        "the keys did not outgrow memory: {said}"
    );
    let want = db.row_strings("SELECT tenant, id, v, pad FROM acct").await;
    let got = files::row_strings(&files::dataset_batches(&dir.join("public.acct")));
    files::assert_same_rows(&got, &want, "acct vs. the table after the changes");
    let m = files::manifest(&dir);
    let changed = m["converged"]["changed_keys"].as_u64().unwrap();
    assert!(changed >= ROWS as u64, "{changed} changed keys");
}
