//! A MySQL/MariaDB stream stopped, the table's column types changed, the stream restarted: the
//! events written before the change must decode with the definition they were written with,
//! which the binary log's table maps carry under `binlog_row_metadata=FULL` (the test kit's
//! server). Enum members reordered and a column moved from latin1 to utf8mb4 keep their
//! values; decoded with today's catalog, `'b'` came out as `'a'` without an error.

use crate::common::{run, sluice, tempdir};
use sluice_testkit::changes::replay;
use sluice_testkit::mysql::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_before_a_type_change_decode_with_their_own_definition() {
    let mut db = TestDb::new().await;
    db.exec(
        "CREATE TABLE d (id int PRIMARY KEY, e ENUM('a','b') NOT NULL,
                         s varchar(20) CHARACTER SET latin1 NOT NULL);
         INSERT INTO d VALUES (1, 'a', 'é');",
    )
    .await;
    let to = tempdir();
    let table = format!("{}.d", db.name);
    let url = db.url.clone();
    let stream = || {
        let mut c = sluice();
        c.args([
            "stream",
            "--source",
            &url,
            "--table",
            &table,
            "--until-current",
        ])
        .arg("--to")
        .arg(to.path());
        c
    };
    run(&mut stream()).ok();
    // Written with the old definition, while the stream is stopped.
    db.exec("INSERT INTO d VALUES (2, 'b', 'ü'); UPDATE d SET e = 'b', s = 'ñ' WHERE id = 1;")
        .await;
    db.exec(
        "ALTER TABLE d MODIFY e ENUM('z','a','b') NOT NULL,
                       MODIFY s varchar(20) CHARACTER SET utf8mb4 NOT NULL",
    )
    .await;
    // And with the new one.
    db.exec("INSERT INTO d VALUES (3, 'z', 'ö'); UPDATE d SET e = 'a' WHERE id = 2;")
        .await;
    run(&mut stream()).ok();
    let r = replay(&to.path().join(&table), &["id"]);
    let want = db
        .row_strings("SELECT id, CAST(e AS CHAR), s FROM d ORDER BY id")
        .await;
    assert_eq!(r.rows, want);
    let e_of_2: Vec<&str> = r
        .changes
        .iter()
        .filter(|c| c.cells[0] == "2")
        .map(|c| c.cells[1].as_str())
        .collect();
    assert_eq!(e_of_2, ["b", "a"], "each event with its own definition");
}
