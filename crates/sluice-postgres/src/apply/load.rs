//! The initial load's bulk path: each batch is one `COPY "schema"."table" (columns) FROM STDIN`
//! in text format, committed when it ends (a `COPY` outside a transaction block is its own
//! transaction).
//!
//! Text format: every value is written as the input text of its type ([`super::render`], the
//! same text the apply's literals hold), so one rendering serves every target type, including a
//! column the target created with another type than the source's. The rows are sent in
//! messages of about [`CHUNK`] bytes as they are rendered, so a batch never needs its whole
//! text in memory.

use super::failed;
use super::render::{Kind, push_copy};
use crate::sql::{quote_ident, quote_table};
use arrow_array::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::SinkExt;
use sluice_core::apply::BulkLoad;
use sluice_core::table::TableRef;
use sluice_core::{Error, Result};
use tokio_postgres::Client;

/// Bytes of rendered rows per `CopyData` message.
const CHUNK: usize = 256 * 1024;

/// One load worker's session.
pub struct PgLoader {
    client: Client,
    display: String,
}

impl PgLoader {
    /// A loader over `client` (already set up).
    pub fn new(client: Client, display: String) -> Self {
        PgLoader { client, display }
    }
}

#[async_trait]
impl BulkLoad for PgLoader {
    async fn load(&mut self, table: &TableRef, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let schema = batch.schema();
        let kinds = schema
            .fields()
            .iter()
            .map(|f| Kind::of(f).map_err(|e| Error::data(format!("{table}: {}", e.message()))))
            .collect::<Result<Vec<_>>>()?;
        let cols: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| quote_ident(f.name()))
            .collect();
        let sql = format!(
            "COPY {} ({}) FROM STDIN",
            quote_table(table),
            cols.join(", ")
        );
        let what = format!("loading {table}");
        let sink = self
            .client
            .copy_in::<_, Bytes>(&sql)
            .await
            .map_err(|e| failed(e, &self.display, &what))?;
        futures_util::pin_mut!(sink);
        let mut buf: Vec<u8> = Vec::with_capacity(CHUNK + 4096);
        let mut scratch = String::new();
        for r in 0..batch.num_rows() {
            for (c, kind) in kinds.iter().enumerate() {
                if c > 0 {
                    buf.push(b'\t');
                }
                push_copy(kind, batch.column(c).as_ref(), r, &mut scratch, &mut buf)
                    .map_err(|e| Error::data(format!("{table}: {}", e.message())))?;
            }
            buf.push(b'\n');
            if buf.len() >= CHUNK {
                let chunk = Bytes::from(std::mem::replace(
                    &mut buf,
                    Vec::with_capacity(CHUNK + 4096),
                ));
                sink.send(chunk)
                    .await
                    .map_err(|e| failed(e, &self.display, &what))?;
            }
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
