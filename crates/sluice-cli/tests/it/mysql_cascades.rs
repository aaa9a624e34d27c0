//! Foreign-key actions on MySQL/MariaDB: InnoDB deletes (or nulls) the children of a deleted
//! parent inside the storage engine and writes those rows to no binary log. `sluice stream`
//! refuses such a child table unless the loss is accepted (and then says so in the state and
//! the files' metadata); `sluice replicate` creates the key on the target with its action, so
//! the target applies the cascade itself, and refuses what the target cannot follow.

use super::replicate::{Db, Session};
use super::replicate_faults::{catch_up, drop_replication, replicate_cmd, ticker};
use crate::common::{files, run, sluice, tempdir};

async fn orders(db: &Db, action: &str) {
    db.exec(&format!(
        "CREATE TABLE orders (id int PRIMARY KEY, who varchar(20) NOT NULL) ENGINE=InnoDB;
         CREATE TABLE order_items (id int PRIMARY KEY, order_id int, qty int NOT NULL,
           CONSTRAINT items_order FOREIGN KEY (order_id) REFERENCES orders (id) {action})
           ENGINE=InnoDB;
         CREATE TABLE tick (id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO tick VALUES (1, 0);
         INSERT INTO orders VALUES (1, 'a'), (2, 'b'), (3, 'c');
         INSERT INTO order_items VALUES (10, 1, 1), (11, 1, 2), (20, 2, 1), (30, 3, 5);"
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stream_refuses_a_cascading_child_unless_the_loss_is_accepted() {
    let db = Db::new(false).await;
    orders(&db, "ON DELETE CASCADE").await;
    let name = db.name().await;
    let url = db.url().await;
    let to = tempdir();
    let stream = |extra: &[&str]| {
        let mut c = sluice();
        c.args(["stream", "--source", &url]);
        c.args(["--tables", &format!("{name}\\.(orders|order_items)")])
            .arg("--to")
            .arg(to.path())
            .args(["--until-current"])
            .args(extra);
        c
    };
    let r = run(&mut stream(&[]));
    r.refused(2, &["items_order", "--accept-missing-cascades"]);
    assert!(
        files::part_files(to.path(), "parquet").is_empty(),
        "nothing written"
    );
    run(&mut stream(&["--accept-missing-cascades"])).ok();
    db.exec("DELETE FROM orders WHERE id = 1").await;
    run(&mut stream(&["--accept-missing-cascades"])).ok();
    let state = std::fs::read_to_string(to.path().join("_sluice/stream.json")).unwrap();
    assert!(state.contains("items_order"), "{state}");
    let dir = to.path().join(format!("{name}.orders/changes"));
    let file = change_files(&dir);
    assert!(
        !file.is_empty(),
        "{:?}",
        crate::common::files_under(to.path())
    );
    // The child's files say what they miss; its parent's do not.
    db.exec("UPDATE order_items SET qty = 9 WHERE id = 30")
        .await;
    run(&mut stream(&["--accept-missing-cascades"])).ok();
    let child = change_files(&to.path().join(format!("{name}.order_items/changes")));
    assert!(!child.is_empty());
    let meta = parquet_metadata(&child[0]);
    assert!(
        meta.get("sluice.missing_changes")
            .is_some_and(|m| m.contains("ON DELETE CASCADE")),
        "{meta:?}"
    );
    assert!(!parquet_metadata(&file[0]).contains_key("sluice.missing_changes"));
}

fn change_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut f: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    f.retain(|p: &std::path::PathBuf| p.extension().is_some_and(|e| e == "parquet"));
    f.sort();
    f
}

fn parquet_metadata(path: &std::path::Path) -> std::collections::HashMap<String, String> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let r = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    r.metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .map(|k| (k.key.clone(), k.value.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

/// The target applies the cascade: the parent's delete, applied after its children's earlier
/// changes, deletes (or nulls) the children on the target as on the source, under a writer.
async fn replicate_applies_the_cascade(target_pg: bool, action: &str) {
    let source = Db::new(false).await;
    let target = Db::new(target_pg).await;
    orders(&source, action).await;
    let name = source.name().await;
    let schema = target.schema().await;
    let tables = format!("{name}\\.(orders|order_items|tick)");
    let args = [
        "--tables",
        &tables,
        "--until-current",
        "--target-schema",
        &schema,
    ];
    let r = run(&mut replicate_cmd(&source, &target, &args).await);
    r.ok();
    assert!(r.stderr.contains("items_order"), "{}", r.stderr);
    let writer = ticker(&source).await;
    let mut s = Session::open(&source).await;
    s.exec("INSERT INTO order_items VALUES (12, 1, 3)").await;
    s.exec("DELETE FROM orders WHERE id = 1").await;
    s.exec("INSERT INTO orders VALUES (4, 'd'); INSERT INTO order_items VALUES (40, 4, 1)")
        .await;
    s.exec("DELETE FROM orders WHERE id = 3").await;
    writer.stop_after(10).await;
    catch_up(
        &source,
        &target,
        &args,
        &[
            "SELECT id, order_id, qty FROM order_items ORDER BY id",
            "SELECT id, who FROM orders ORDER BY id",
            "SELECT n FROM tick",
        ],
    )
    .await;
    drop_replication(&source, &target, &args).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_to_pg_the_target_applies_on_delete_cascade() {
    replicate_applies_the_cascade(true, "ON DELETE CASCADE").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_to_mariadb_the_target_applies_on_delete_set_null() {
    replicate_applies_the_cascade(false, "ON DELETE SET NULL").await;
}

/// What the target cannot follow is refused before anything is created: a cascading child
/// whose parent is not replicated, and an ON UPDATE action.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicate_refuses_cascades_the_target_cannot_follow() {
    let source = Db::new(false).await;
    let target = Db::new(true).await;
    orders(&source, "ON DELETE CASCADE ON UPDATE CASCADE").await;
    let name = source.name().await;
    let child_only = format!("{name}.order_items");
    let both = format!("{name}\\.(orders|order_items)");
    for (args, why) in [
        (vec!["--table", child_only.as_str()], "is not replicated"),
        (vec!["--tables", both.as_str()], "ON UPDATE"),
    ] {
        let mut a = args.clone();
        a.extend(["--until-current", "--target-schema", "public"]);
        let r = run(&mut replicate_cmd(&source, &target, &a).await);
        r.refused(2, &[why]);
    }
    let tables = target
        .rows("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'")
        .await;
    assert_eq!(tables, ["0"], "nothing created on the target");
}
