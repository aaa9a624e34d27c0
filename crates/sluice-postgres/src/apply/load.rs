//! The initial load's bulk path: each batch is one `COPY "schema"."table" (columns) FROM STDIN`,
//! committed when it ends (a `COPY` outside a transaction block is its own transaction).
//!
//! Binary format when every column of the batch has a binary encoder for its target type
//! ([`super::encode`]); otherwise text format, where every value is the input text of its type
//! ([`super::render`], the same text the apply's literals hold), which any target type reads
//! (ranges, geometric types, `inet`, `money`, a type the user changed on the target). The
//! choice is made once per table and batch schema. Rows are sent in messages of about
//! [`CHUNK`] bytes as they are encoded, so a batch never needs its whole encoding in memory.

use super::encode::{self, Enc, TargetType};
use super::failed;
use super::render::{Kind, push_copy};
use crate::sql::{quote_ident, quote_table};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::SinkExt;
use sluice_core::apply::BulkLoad;
use sluice_core::table::TableRef;
use sluice_core::{Error, Result};
use std::collections::HashMap;
use tokio_postgres::Client;

/// Bytes of encoded rows per `CopyData` message.
const CHUNK: usize = 256 * 1024;

/// The columns' types on the target, for the binary encoders: a column's type, resolved
/// through a domain to its base, with its send function, and an array's element.
const TYPES: &str = "SELECT a.attname::text, b.typsend::text, \
       CASE WHEN b.typsend = 'array_send'::regproc THEN b.typelem END, e.typsend::text \
     FROM pg_attribute a \
     JOIN pg_class c ON c.oid = a.attrelid \
     JOIN pg_namespace n ON n.oid = c.relnamespace \
     JOIN pg_type t ON t.oid = a.atttypid \
     JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END \
     LEFT JOIN pg_type e ON e.oid = b.typelem AND b.typsend = 'array_send'::regproc \
     WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped";

/// How a batch is encoded.
enum Plan {
    /// Binary, one encoder per column.
    Binary(Vec<Enc>),
    /// Text, one rendering per column.
    Text(Vec<Kind>),
}

/// One load worker's session.
pub struct PgLoader {
    client: Client,
    display: String,
    /// Plans by table, for the batch schema they were made for.
    plans: HashMap<TableRef, (SchemaRef, std::sync::Arc<Plan>)>,
}

impl PgLoader {
    /// A loader over `client` (already set up).
    pub fn new(client: Client, display: String) -> Self {
        PgLoader {
            client,
            display,
            plans: HashMap::new(),
        }
    }

    async fn plan(&mut self, table: &TableRef, schema: &SchemaRef) -> Result<std::sync::Arc<Plan>> {
        if let Some((s, p)) = self.plans.get(table)
            && s == schema
        {
            return Ok(p.clone());
        }
        let rows = self
            .client
            .query(TYPES, &[&table.schema, &table.name])
            .await
            .map_err(|e| {
                failed(
                    e,
                    &self.display,
                    &format!("reading the column types of {table}"),
                )
            })?;
        let types: HashMap<String, TargetType> = rows
            .iter()
            .map(|r| {
                let elem: Option<u32> = r.get(2);
                let elem_send: Option<String> = r.get(3);
                (
                    r.get::<_, String>(0),
                    TargetType {
                        send: r.get(1),
                        elem: elem.zip(elem_send),
                    },
                )
            })
            .collect();
        let binary: Option<Vec<Enc>> = schema
            .fields()
            .iter()
            .map(|f| encode::plan(types.get(f.name())?, f))
            .collect();
        let plan = match binary {
            Some(encs) => Plan::Binary(encs),
            None => Plan::Text(
                schema
                    .fields()
                    .iter()
                    .map(|f| {
                        Kind::of(f).map_err(|e| Error::data(format!("{table}: {}", e.message())))
                    })
                    .collect::<Result<Vec<_>>>()?,
            ),
        };
        tracing::debug!(
            "loading {table} in {} COPY format",
            if matches!(plan, Plan::Binary(_)) {
                "binary"
            } else {
                "text"
            }
        );
        let plan = std::sync::Arc::new(plan);
        self.plans
            .insert(table.clone(), (schema.clone(), plan.clone()));
        Ok(plan)
    }
}

/// Encode row `r` of `batch` after `plan` into `buf`.
fn row(
    plan: &Plan,
    batch: &RecordBatch,
    r: usize,
    scratch: &mut String,
    buf: &mut Vec<u8>,
) -> Result<()> {
    match plan {
        Plan::Binary(encs) => {
            buf.extend_from_slice(&(encs.len() as i16).to_be_bytes());
            for (c, enc) in encs.iter().enumerate() {
                encode::field(enc, batch.column(c).as_ref(), r, buf)?;
            }
        }
        Plan::Text(kinds) => {
            for (c, kind) in kinds.iter().enumerate() {
                if c > 0 {
                    buf.push(b'\t');
                }
                push_copy(kind, batch.column(c).as_ref(), r, scratch, buf)?;
            }
            buf.push(b'\n');
        }
    }
    Ok(())
}

#[async_trait]
impl BulkLoad for PgLoader {
    async fn load(&mut self, table: &TableRef, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let schema = batch.schema();
        let plan = self.plan(table, &schema).await?;
        let cols: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| quote_ident(f.name()))
            .collect();
        let binary = matches!(*plan, Plan::Binary(_));
        let sql = format!(
            "COPY {} ({}) FROM STDIN{}",
            quote_table(table),
            cols.join(", "),
            if binary { " (FORMAT binary)" } else { "" }
        );
        let what = format!("loading {table}");
        let sink = self
            .client
            .copy_in::<_, Bytes>(&sql)
            .await
            .map_err(|e| failed(e, &self.display, &what))?;
        futures_util::pin_mut!(sink);
        let mut buf: Vec<u8> = Vec::with_capacity(CHUNK + 4096);
        if binary {
            buf.extend_from_slice(encode::HEADER);
        }
        let mut scratch = String::new();
        for r in 0..batch.num_rows() {
            row(&plan, batch, r, &mut scratch, &mut buf)
                .map_err(|e| Error::data(format!("{table}: {}", e.message())))?;
            if buf.len() >= CHUNK {
                let chunk = std::mem::replace(&mut buf, Vec::with_capacity(CHUNK + 4096));
                sink.send(Bytes::from(chunk))
                    .await
                    .map_err(|e| failed(e, &self.display, &what))?;
            }
        }
        if binary {
            buf.extend_from_slice(encode::TRAILER);
        }
        if !buf.is_empty() {
            sink.send(Bytes::from(buf))
                .await
                .map_err(|e| failed(e, &self.display, &what))?;
        }
        sink.finish()
            .await
            .map_err(|e| failed(e, &self.display, &what))?;
        Ok(())
    }
}
