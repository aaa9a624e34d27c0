//! The initial load's bulk path: multi-row `INSERT`s, each sized by bytes under the server's
//! `max_allowed_packet`, in one transaction per batch.
//!
//! Why not `LOAD DATA LOCAL INFILE`: it needs `local_infile` enabled on the server (off by
//! default on MySQL 8) and a client-side file handler, and its text format needs its own
//! escaping of every type; multi-row inserts of hex and numeric literals reach most of its
//! speed on InnoDB (the cost is the index inserts, not the parsing) and work on every server.
//! Foreign key checks are off in load sessions: tables load in parallel in any order, and the
//! snapshot they come from is consistent once all of them are loaded.

use super::fail;
use super::render::{self, Kind};
use crate::sql::{quote_ident, quote_table};
use arrow_array::RecordBatch;
use async_trait::async_trait;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use sluice_core::apply::BulkLoad;
use sluice_core::table::TableRef;
use sluice_core::{Error, Result};

/// The largest statement sent, whatever `max_allowed_packet` allows.
const MAX_STATEMENT: usize = 16 << 20;

/// One load session.
pub struct MyLoader {
    conn: Conn,
    display: String,
    /// `max_allowed_packet`: no statement may be longer.
    packet: usize,
    buf: String,
}

impl MyLoader {
    pub(super) async fn open(mut conn: Conn, display: String) -> Result<Self> {
        let packet: Option<u64> = conn
            .query_first("SELECT @@max_allowed_packet")
            .await
            .map_err(|e| fail(e, &display, "setting up a load session on"))?;
        conn.query_drop("SET SESSION foreign_key_checks = 0")
            .await
            .map_err(|e| fail(e, &display, "setting up a load session on"))?;
        Ok(MyLoader {
            conn,
            display,
            packet: packet.unwrap_or(4 << 20) as usize,
            buf: String::new(),
        })
    }

    async fn send(&mut self, table: &TableRef) -> Result<()> {
        let sql = std::mem::take(&mut self.buf);
        let r = self.conn.query_drop(sql.as_str()).await;
        self.buf = sql;
        self.buf.clear();
        r.map_err(|e| fail(e, &self.display, &format!("loading {table} into")))
    }
}

#[async_trait]
impl BulkLoad for MyLoader {
    async fn load(&mut self, table: &TableRef, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let schema = batch.schema();
        let kinds: Vec<Kind> = schema.fields().iter().map(|f| Kind::of(f)).collect();
        let names: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| quote_ident(f.name()))
            .collect();
        let head = format!(
            "INSERT INTO {} ({}) VALUES ",
            quote_table(table),
            names.join(",")
        );
        // Room for the header and `;COMMIT` under the packet limit.
        let limit = (self.packet.saturating_sub(head.len() + 1024)).min(MAX_STATEMENT);
        let mut row = String::new();
        self.buf.clear();
        self.buf.push_str("START TRANSACTION;");
        let mut rows_in_statement = 0usize;
        let result: Result<()> = async {
            for r in 0..batch.num_rows() {
                row.clear();
                row.push('(');
                for (i, kind) in kinds.iter().enumerate() {
                    if i > 0 {
                        row.push(',');
                    }
                    render::value(&mut row, *kind, batch.column(i), r, schema.field(i).name())
                        .map_err(|e| e.context(format!("loading {table}")))?;
                }
                row.push(')');
                if row.len() > limit {
                    return Err(Error::data(format!(
                        "a row of {table} takes {} bytes as SQL, more than the target's \
                         max_allowed_packet ({} bytes) allows. Raise it on the target (SET \
                         GLOBAL max_allowed_packet = 1073741824) and run again.",
                        row.len() + head.len(),
                        self.packet
                    )));
                }
                if rows_in_statement > 0 && self.buf.len() + row.len() + 1 > limit {
                    self.buf.push(';');
                    self.send(table).await?;
                    rows_in_statement = 0;
                }
                if rows_in_statement == 0 {
                    self.buf.push_str(&head);
                } else {
                    self.buf.push(',');
                }
                self.buf.push_str(&row);
                rows_in_statement += 1;
            }
            self.buf.push_str(";COMMIT");
            self.send(table).await
        }
        .await;
        if result.is_err() {
            self.buf.clear();
            // The transaction may be open on the server: nothing of the batch stays.
            let _ = self.conn.query_drop("ROLLBACK").await;
        }
        result
    }
}
