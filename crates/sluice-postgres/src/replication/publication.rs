//! The publication a capture reads through: created for the selected tables (partitioned ones
//! published under their root), tables added to it while a stream runs, its tables read back,
//! and dropped with the capture.

use crate::error::{Phase, classify};
use crate::sql::{quote_ident, quote_table};
use sluice_core::table::TableRef;
use sluice_core::{Error, Result};
use tokio_postgres::Client;

/// Create the publication for `tables` unless it exists; an existing one must publish every
/// table, and publish the changes of the `partitioned` ones under their own name
/// (`publish_via_partition_root`), since their change files are written under the table, as
/// their snapshot is. Returns true when this call created it.
pub async fn ensure_publication(
    client: &Client,
    name: &str,
    tables: &[TableRef],
    partitioned: &[TableRef],
    display: &str,
) -> Result<bool> {
    let err = |e| classify(e, Phase::Catalog, display);
    let via_root: Option<bool> = client
        .query_opt(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = $1",
            &[&name],
        )
        .await
        .map_err(err)?
        .map(|r| r.get(0));
    if let Some(via_root) = via_root {
        if !via_root && !partitioned.is_empty() {
            let list: Vec<String> = partitioned.iter().map(|t| t.to_string()).collect();
            return Err(Error::config(format!(
                "publication {name} on {display} sends the changes of partitioned tables ({}) \
                 under their partitions' names (publish_via_partition_root is off), but their \
                 change files are written under the table. Turn it on (ALTER PUBLICATION {} SET \
                 (publish_via_partition_root = true)), or name another --publication for sluice \
                 to create.",
                list.join(", "),
                quote_ident(name)
            )));
        }
        let have = published(client, name, display).await?;
        let missing: Vec<String> = tables
            .iter()
            .filter(|t| !have.contains(t))
            .map(|t| t.to_string())
            .collect();
        if !missing.is_empty() {
            return Err(Error::config(format!(
                "publication {name} on {display} exists but does not publish {}. Add them \
                 (ALTER PUBLICATION {} ADD TABLE …), or name another --publication for sluice \
                 to create.",
                missing.join(", "),
                quote_ident(name)
            )));
        }
        return Ok(false);
    }
    let list: Vec<String> = tables.iter().map(quote_table).collect();
    client
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = true)",
            quote_ident(name),
            list.join(", ")
        ))
        .await
        .map_err(|e| {
            classify(e, Phase::Catalog, display).context(format!(
                "creating publication {name} (it needs CREATE on the database and ownership \
                 of the tables; a superuser can create it for you: CREATE PUBLICATION {} FOR \
                 TABLE {})",
                quote_ident(name),
                list.join(", ")
            ))
        })?;
    Ok(true)
}

/// Drop publication `name` if it exists.
pub async fn drop_publication(client: &Client, name: &str, display: &str) -> Result<()> {
    client
        .batch_execute(&format!("DROP PUBLICATION IF EXISTS {}", quote_ident(name)))
        .await
        .map_err(|e| {
            classify(e, Phase::Catalog, display).context(format!("dropping publication {name}"))
        })
}

/// The tables publication `name` publishes (partitioned ones under their root, since sluice's
/// publications publish through it).
pub async fn published(client: &Client, name: &str, display: &str) -> Result<Vec<TableRef>> {
    let rows = client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables \
             WHERE pubname = $1",
            &[&name],
        )
        .await
        .map_err(|e| classify(e, Phase::Catalog, display))?;
    Ok(rows
        .iter()
        .map(|r| TableRef {
            schema: r.get(0),
            name: r.get(1),
        })
        .collect())
}

/// How long adding tables to the publication waits for the writers in flight on them.
const ADD_LOCK_TIMEOUT: &str = "5s";

/// Publish `tables` too: added to publication `name` when sluice created it (`created`),
/// otherwise required to be in it already.
///
/// Why the SHARE lock: a transaction that wrote a table before the table joined the
/// publication and commits after it could be decoded with the publication as it was (servers
/// before the 2025 minor releases did not pass the change on to transactions in flight), and
/// its changes would be in neither the snapshot taken next nor the stream. SHARE mode waits
/// for the table's writers in flight and holds new ones off until the commit, so none spans
/// the change. The wait is bounded; past it the add fails as transient and is tried again.
pub async fn publish_more(
    client: &Client,
    name: &str,
    created: bool,
    tables: &[TableRef],
    display: &str,
) -> Result<()> {
    let have = published(client, name, display).await?;
    let missing: Vec<&TableRef> = tables.iter().filter(|t| !have.contains(t)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = missing.iter().map(|t| quote_table(t)).collect();
    let list = list.join(", ");
    if !created {
        return Err(Error::config(format!(
            "{list} on {display} matches the stream's selection but publication {name}, which \
             sluice did not create, does not publish it. Add it (ALTER PUBLICATION {} ADD \
             TABLE {list}) and run the stream again, or narrow the selection.",
            quote_ident(name)
        )));
    }
    let sql = format!(
        "BEGIN; SET LOCAL lock_timeout = '{ADD_LOCK_TIMEOUT}'; LOCK TABLE {list} IN SHARE MODE; \
         ALTER PUBLICATION {} ADD TABLE {list}; COMMIT",
        quote_ident(name)
    );
    client.batch_execute(&sql).await.map_err(|e| {
        classify(e, Phase::Catalog, display).context(format!(
            "adding {list} to publication {name} (it needs ownership of the tables; a \
             superuser can add them: ALTER PUBLICATION {} ADD TABLE {list})",
            quote_ident(name)
        ))
    })
}
