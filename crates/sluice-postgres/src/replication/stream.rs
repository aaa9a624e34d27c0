//! The change stream: pgoutput messages → changes in the runner's column builders.
//!
//! Updates and deletes are keyed as the change files promise: a delete carries the replica
//! identity's columns (the others are listed in `_absent`) or, under REPLICA IDENTITY FULL, the
//! whole old row; an update whose key changed becomes a `delete` of the old key and an `insert`
//! of the new row, back to back. The key is the replica identity under DEFAULT and USING
//! INDEX, and the table's primary key (or unique key) under FULL, where the server flags every
//! column; a FULL table without either key writes every update as delete + insert, which a
//! replay applies exactly. An unchanged TOAST value (`u`) is NULL in its cell and named in
//! `_absent`; in the insert half of a key update such a value is the deleted row's when the
//! old row is whole (REPLICA IDENTITY FULL), else absent.

use super::conn::ReplConn;
use super::fill::{Filler, fill, fill_before, fill_from};
use super::pgoutput::{self, Copy, Message, Old, Tuple, Value};
use super::slot::{describe, table_columns};
use super::values::Codec;
use crate::catalog::load_types;
use crate::types::TypeMap;
use async_trait::async_trait;
use sluice_core::change::{BadValuePolicy, ChangeOp, ChangeSink, ChangeStream, Step, TxMeta};
use sluice_core::table::TableRef;
use sluice_core::{Error, Result, StreamPos};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// Microseconds from 1970-01-01 to 2000-01-01 (PostgreSQL's epoch).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;
/// How often a busy stream tells the server how far it is (it disconnects a silent client
/// after `wal_sender_timeout`, 60 s by default).
const STATUS_EVERY: Duration = Duration::from_secs(10);
/// Messages handled per call of `next` before the runner gets control back.
const MESSAGES_PER_STEP: usize = 4096;

/// `_pos` of an LSN: 16 upper-case hex digits, so text order is log order.
pub fn pos_text(lsn: u64) -> StreamPos {
    StreamPos::from_adapter(format!("{lsn:016X}"))
}

/// The LSN of a `_pos` text.
pub fn pos_lsn(pos: &StreamPos) -> Option<u64> {
    u64::from_str_radix(pos.order(), 16).ok()
}

struct Rel {
    handle: usize,
    table: TableRef,
    codecs: Vec<Codec>,
    /// Columns compared to tell whether an update changed the key.
    key: Vec<bool>,
    /// The replica identity's columns (what a `K` old tuple carries).
    identity: Vec<bool>,
}

/// A pgoutput stream from one slot.
pub struct PgStream {
    conn: ReplConn,
    catalog: Client,
    display: String,
    types: TypeMap,
    money_scale: i8,
    /// Primary (or unique) key columns per table, from discovery.
    keys: HashMap<TableRef, Vec<String>>,
    rels: HashMap<u32, Rel>,
    in_tx: bool,
    received: u64,
    confirmed: u64,
    last_status: Instant,
    bad_values: BadValuePolicy,
    /// `_pos` of the open transaction, for messages.
    tx_pos: StreamPos,
}

impl PgStream {
    /// A stream over `conn`, already in CopyBoth mode, confirmed up to `confirmed`.
    pub fn new(
        conn: ReplConn,
        catalog: Client,
        money_scale: i8,
        keys: HashMap<TableRef, Vec<String>>,
        confirmed: u64,
        bad_values: BadValuePolicy,
    ) -> Self {
        PgStream {
            display: conn.display().to_string(),
            conn,
            catalog,
            types: TypeMap::new(),
            money_scale,
            keys,
            rels: HashMap::new(),
            in_tx: false,
            received: confirmed,
            confirmed,
            last_status: Instant::now(),
            bad_values,
            tx_pos: StreamPos::default(),
        }
    }

    fn lost(&self, e: super::conn::ConnError) -> Error {
        e.into_error("streaming changes", &self.display)
    }

    async fn status(&mut self, reply: bool) -> Result<()> {
        let now = chrono::Utc::now().timestamp_micros() - PG_EPOCH_MICROS;
        let msg = pgoutput::status_update(self.confirmed, now, reply);
        self.last_status = Instant::now();
        let r = self.conn.send(&msg).await;
        r.map_err(|e| self.lost(e))
    }

    async fn relation(
        &mut self,
        oid: u32,
        schema: &str,
        name: &str,
        columns: Vec<pgoutput::RelColumn>,
        sink: &mut dyn ChangeSink,
    ) -> Result<()> {
        let table = TableRef {
            schema: schema.to_string(),
            name: name.to_string(),
        };
        let described = table_columns(
            &self.catalog,
            &table,
            &mut self.types,
            self.money_scale,
            &self.display,
        )
        .await?;
        if described.is_empty() && !columns.is_empty() {
            tracing::warn!(
                "{table} no longer exists on {} (dropped after this point of the log): its \
                 changes up to the drop are decoded from the stream's own description",
                self.display
            );
        }
        // The catalog is read now, the message describes the table as of its position: the
        // names and types must agree, else the table changed again since.
        let same = described.len() == columns.len()
            && described
                .iter()
                .zip(&columns)
                .all(|((d, oid, _), c)| d.name == c.name && *oid == c.type_oid);
        let described = if same {
            described
        } else {
            // The table changed again since: describe it from the message itself, with the
            // type texts its type modifiers give (`numeric(10,2)`, not `numeric`).
            let oids: Vec<u32> = columns.iter().map(|c| c.type_oid).collect();
            let mods: Vec<i32> = columns.iter().map(|c| c.typmod).collect();
            load_types(&self.catalog, &oids, &mut self.types, &self.display).await?;
            let texts: Vec<String> = self
                .catalog
                .query(
                    "SELECT format_type(t.oid, t.typmod) \
                     FROM unnest($1::oid[], $2::int4[]) WITH ORDINALITY AS t(oid, typmod, n) \
                     ORDER BY t.n",
                    &[&oids, &mods],
                )
                .await
                .map_err(|e| {
                    crate::error::classify(e, crate::error::Phase::Catalog, &self.display)
                })?
                .iter()
                .map(|r| r.get(0))
                .collect();
            columns
                .iter()
                .zip(texts)
                .map(|(c, text)| {
                    let mut d = describe(&self.types, &table, c, self.money_scale)?;
                    d.0.source_type = text;
                    Ok(d)
                })
                .collect::<Result<Vec<_>>>()?
        };
        let pk = self.keys.get(&table).cloned().unwrap_or_default();
        let full = columns.iter().all(|c| c.key);
        let key: Vec<bool> = columns
            .iter()
            .map(|c| if full { pk.contains(&c.name) } else { c.key })
            .collect();
        let identity = columns.iter().map(|c| c.key).collect();
        let descs: Vec<_> = described.iter().map(|(d, _, _)| d.clone()).collect();
        let handle = sink.relation(&table, &descs)?;
        let codecs = described.into_iter().map(|(_, _, c)| c).collect();
        self.rels.insert(
            oid,
            Rel {
                handle,
                table,
                codecs,
                key,
                identity,
            },
        );
        Ok(())
    }

    /// What appending needs: the relation and what to do with a value it cannot write.
    fn bad<'a>(&'a self, rel: &'a Rel) -> Filler<'a> {
        Filler {
            table: &rel.table,
            codecs: &rel.codecs,
            identity: &rel.identity,
            bad: &self.bad_values,
            pos: self.tx_pos.as_str(),
        }
    }

    fn rel(&self, oid: u32) -> Result<&Rel> {
        self.rels.get(&oid).ok_or_else(|| {
            Error::internal(format!(
                "a change of relation {oid} arrived before its Relation message"
            ))
        })
    }

    /// One change: `tuple` with whether it is a key-only old tuple (see [`fill`]), and the
    /// old row the server sent with an update or a delete, for its before-image.
    fn handle_row(
        &self,
        oid: u32,
        op: ChangeOp,
        tuple: Option<(Tuple<'_>, bool)>,
        old: Option<(Old, Tuple<'_>)>,
        sink: &mut dyn ChangeSink,
    ) -> Result<()> {
        let rel = self.rel(oid)?;
        if let Some(rows) = sink.row(rel.handle, op)? {
            match (op, tuple, old) {
                // Under REPLICA IDENTITY FULL the old row carries every value: the new row's
                // unchanged out-of-line values are taken from it rather than left absent.
                (ChangeOp::Update, Some((new, false)), Some((Old::Full, o))) => {
                    fill_from(&self.bad(rel), rows, new, Some(o))?
                }
                _ => fill(&self.bad(rel), rows, tuple)?,
            }
            if matches!(op, ChangeOp::Update | ChangeOp::Delete) {
                fill_before(&self.bad(rel), rows, old)?;
            }
        }
        sink.row_done()
    }

    fn handle(&mut self, m: Message<'_>, sink: &mut dyn ChangeSink) -> Result<()> {
        match m {
            Message::Begin {
                final_lsn,
                commit_ts,
                xid,
            } => {
                self.in_tx = true;
                self.tx_pos = pos_text(final_lsn);
                sink.begin(TxMeta {
                    pos: pos_text(final_lsn),
                    xid: xid.to_string(),
                    commit_ts: Some(commit_ts.saturating_add(PG_EPOCH_MICROS)),
                })
            }
            Message::Commit { end_lsn, .. } => {
                self.in_tx = false;
                self.received = self.received.max(end_lsn);
                sink.commit(&pos_text(end_lsn))
            }
            Message::Insert { oid, new } => {
                self.handle_row(oid, ChangeOp::Insert, Some((new, false)), None, sink)
            }
            Message::Update { oid, old, new } => {
                let rel = self.rel(oid)?;
                let changed = match &old {
                    None => false,
                    Some((Old::Full, _)) if !rel.key.iter().any(|k| *k) => true,
                    Some((_, o)) => key_changed(rel, o, &new)?,
                };
                match old {
                    Some((kind, o)) if changed => {
                        let key_only = kind == Old::Key;
                        self.handle_row(oid, ChangeOp::Delete, Some((o, key_only)), old, sink)?;
                        // Under REPLICA IDENTITY FULL the old row carries every value, so the
                        // new row's unchanged out-of-line values are taken from it.
                        let fallback = (kind == Old::Full).then_some(o);
                        let rel = self.rel(oid)?;
                        if let Some(rows) = sink.row(rel.handle, ChangeOp::Insert)? {
                            fill_from(&self.bad(rel), rows, new, fallback)?;
                        }
                        sink.row_done()
                    }
                    _ => self.handle_row(oid, ChangeOp::Update, Some((new, false)), old, sink),
                }
            }
            Message::Delete {
                oid,
                old: (kind, o),
            } => {
                let key_only = kind == Old::Key;
                self.handle_row(
                    oid,
                    ChangeOp::Delete,
                    Some((o, key_only)),
                    Some((kind, o)),
                    sink,
                )
            }
            Message::Truncate { oids } => {
                for oid in oids {
                    if self.rels.contains_key(&oid) {
                        self.handle_row(oid, ChangeOp::Truncate, None, None, sink)?;
                    }
                }
                Ok(())
            }
            Message::Relation { .. } | Message::Other => Ok(()),
        }
    }
}

/// Whether the key columns of an update's old tuple differ from its new tuple.
fn key_changed(rel: &Rel, old: &Tuple<'_>, new: &Tuple<'_>) -> Result<bool> {
    for ((o, n), key) in old.values().zip(new.values()).zip(&rel.key) {
        if !key {
            continue;
        }
        let (o, n) = (o.map_err(malformed)?, n.map_err(malformed)?);
        if n != Value::Unchanged && o != n {
            return Ok(true);
        }
    }
    Ok(false)
}

pub(super) fn malformed(e: pgoutput::Malformed) -> Error {
    Error::source_permanent(format!(
        "the replication stream sent a message sluice cannot read: {}",
        e.0
    ))
}

#[async_trait]
impl ChangeStream for PgStream {
    async fn next(&mut self, sink: &mut dyn ChangeSink, wait: Duration) -> Result<Step> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut handled = 0usize;
        loop {
            if self.last_status.elapsed() >= STATUS_EVERY {
                self.status(false).await?;
            }
            let got = if self.conn.has_message() {
                self.conn.recv().await.map_err(|e| self.lost(e))?
            } else {
                match tokio::time::timeout_at(deadline, self.conn.recv()).await {
                    Ok(r) => r.map_err(|e| self.lost(e))?,
                    Err(_) if handled == 0 && !self.in_tx => {
                        // Idle: ask for a keepalive, which says how far the server has sent.
                        self.status(true).await?;
                        return Ok(Step::Idle);
                    }
                    Err(_) => return Ok(if handled > 0 { Step::Data } else { Step::Idle }),
                }
            };
            let Some(payload) = got else {
                return Err(Error::source_transient(format!(
                    "{} ended the replication stream",
                    self.display
                )));
            };
            match pgoutput::parse_copy(&payload).map_err(malformed)? {
                Copy::XLogData { data, .. } => {
                    match pgoutput::parse_message(data).map_err(malformed)? {
                        Message::Relation {
                            oid,
                            schema,
                            name,
                            columns,
                            ..
                        } => {
                            let (schema, name) = (schema.to_string(), name.to_string());
                            self.relation(oid, &schema, &name, columns, sink).await?;
                        }
                        m => self.handle(m, sink)?,
                    }
                    handled += 1;
                    if !self.in_tx || handled >= MESSAGES_PER_STEP {
                        return Ok(Step::Data);
                    }
                }
                Copy::Keepalive { end, reply } => {
                    if !self.in_tx {
                        self.received = self.received.max(end);
                    }
                    if reply {
                        self.status(false).await?;
                    }
                    if !self.in_tx {
                        return Ok(if handled > 0 { Step::Data } else { Step::Idle });
                    }
                }
            }
        }
    }

    async fn confirm(&mut self, restart: &StreamPos) -> Result<()> {
        let lsn = pos_lsn(restart)
            .ok_or_else(|| Error::internal(format!("{restart:?} is not a stream position")))?;
        if lsn > self.confirmed {
            self.confirmed = lsn;
            self.status(false).await?;
        }
        Ok(())
    }

    async fn keep_alive(&mut self) -> Result<()> {
        if self.last_status.elapsed() >= STATUS_EVERY {
            self.status(false).await?;
        }
        Ok(())
    }

    fn received_through(&self) -> Option<StreamPos> {
        (!self.in_tx).then(|| pos_text(self.received))
    }

    async fn close(&mut self) -> Result<()> {
        let _ = self.status(false).await;
        self.conn.close().await;
        Ok(())
    }
}
