//! The change stream: binary log events → changes in the runner's column builders.
//!
//! A transaction is an event group: a GTID event (MariaDB 162, MySQL 33/34) or `BEGIN`, then
//! table maps and row events, then `XID` (or `COMMIT`); a DDL statement is a group of one
//! `QUERY` event (MariaDB flags its GTID standalone; MySQL writes no `BEGIN` after the GTID).
//! `_pos` is the offset of the group's first event, the restart position the offset after its
//! last (see `binlog.rs`). Where GTIDs are on, each restart position carries the GTID state
//! after its transaction (`gtid.rs`), updated at every group's end from the group's GTID event.
//!
//! Row images: a column a row event does not carry (`binlog_row_image=MINIMAL` or `NOBLOB`) is
//! NULL in its cell and named in `_absent`. An update's new row is its after image completed by
//! its before image (a column missing from the after image did not change); an update that
//! changes the primary key becomes a `delete` of the before image and an `insert` of the new
//! row, back to back. `TRUNCATE` of a captured table is a `truncate` change.
//!
//! Table maps and schema: a table's columns are read from the catalog when its first table map
//! arrives, and again after a DDL statement in the log names the table (a new schema version if
//! they changed). The catalog is read now, not as of the position: a table map whose column
//! count differs from the catalog's (a later `ALTER TABLE` not reached yet) stops the stream
//! with an error rather than decoding values into the wrong columns. Under
//! `binlog_row_metadata=FULL` the table map says how its values are stored (enum and set
//! members, signedness, character sets): where that differs from the catalog's, or the count
//! does, the table map's own definition is used instead (`table_map.rs`), its columns that the
//! catalog holds unchanged described as the catalog does (`table_map::reconcile`). The runner
//! is told a table's columns only once they are the table map's: a restarted stream must not
//! announce the catalog's present, which may be ahead of the position it resumes from, or the
//! schema history would gain a version the log has not reached.
//!
//! Over 500 lines: event groups, table maps and row images all read and change one stream's
//! state (the open group, the table ids, each table's decoders and runner handle); the value
//! conversions and table-map typing live apart (`values.rs`, `table_map.rs`).

use super::binlog::{
    BinPos, MARIADB_COMPRESSED, MARIADB_GTID, MariaGtid, Restart, Statement, classify, file_name,
    mysql_gtid, split_file,
};
use super::gtid::{Gtid, GtidState};
use super::rows::{Cell, Layout, read_image};
use super::values::{Codec, column_facts};
use super::xa::Xa;
use crate::catalog::{self, Resolved, ServerInfo};
use crate::connect::{MyTarget, ZeroDates};
use crate::decode::ValueDecoder;
use crate::sql::TableDdl;
use async_trait::async_trait;
use futures_util::{FutureExt, StreamExt};
use mysql_async::binlog::events::{
    Event, EventData, GtidEvent, QueryEvent, RotateEvent, RowsEventData, TableMapEvent,
    TransactionPayloadEvent,
};
use mysql_async::{BinlogStream, Conn};
use mysql_common::binlog::EventStreamReader;
use mysql_common::binlog::consts::BinlogVersion;
use mysql_common::io::ParseBuf;
use sluice_core::change::{
    BadValuePolicy, ChangeOp, ChangeRows, ChangeSink, ChangeStream, Step, TxMeta,
};
use sluice_core::table::TableRef;
use sluice_core::{ColumnDesc, Dataset, Error, ErrorKind, Result, Retry, StreamPos};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Events handled per call of `next` before the runner gets control back.
const EVENTS_PER_STEP: usize = 4096;

const QUERY_EVENT: u8 = 2;
const ROTATE_EVENT: u8 = 4;
const XID_EVENT: u8 = 16;
const TABLE_MAP_EVENT: u8 = 19;
const HEARTBEAT_EVENT: u8 = 27;
const MYSQL_GTID: u8 = 33;
const MYSQL_ANONYMOUS_GTID: u8 = 34;
const PARTIAL_UPDATE_ROWS: u8 = 39;
const XA_PREPARE_EVENT: u8 = 38;
const TRANSACTION_PAYLOAD: u8 = 40;
const LOG_EVENT_ARTIFICIAL_F: u16 = 0x20;

/// A captured table's decoding state.
struct Table {
    columns: Vec<ColumnDesc>,
    key: Vec<usize>,
    codec: Codec,
    /// The runner's handle for this stream session (after the first table map).
    handle: Option<usize>,
    /// A DDL named the table: read its columns again at its next table map.
    stale: bool,
    /// Where the log dropped the table (`DROP TABLE`): a table of that name created after it
    /// is another table, which cannot continue this one's changes.
    dropped_at: Option<String>,
    /// The data of the last table map handled for it, and its layout: an identical table map
    /// (each transaction repeats it) needs no new look.
    map: Vec<u8>,
    layout: Arc<Layout>,
}

/// The open event group.
struct Group {
    /// MySQL wrote a GTID event; a `BEGIN` follows for a transaction, else the next statement
    /// is the whole group.
    await_begin: bool,
    /// MariaDB's standalone flag: the next statement is the whole group.
    standalone: bool,
}

/// What the stream needs to decode a table.
pub struct Setup {
    /// The source.
    pub target: MyTarget,
    /// Server facts.
    pub server: ServerInfo,
    /// A catalog session (for tables whose DDL the stream passes).
    pub catalog: Conn,
    /// The captured tables.
    pub datasets: Vec<Dataset>,
    /// Where the stream starts (a GTID start: the epoch, file 0).
    pub from: BinPos,
    /// The GTID state at `from`, where known.
    pub gtid: Option<GtidState>,
    /// MySQL: the server's uuid (kept with the GTID state).
    pub server_uuid: Option<String>,
    /// The binary log's base file name.
    pub base: String,
    /// Shared with the capture: the last position confirmed durable (for the harm figures).
    pub confirmed: Arc<Mutex<Option<BinPos>>>,
    /// Opened before the saved position to read prepared XA transactions' groups again: the
    /// saved position and the transactions (see `xa.rs`).
    pub xa: Option<(BinPos, Vec<super::xa::Pending>)>,
    /// What to do with a value that cannot be written (`--bad-values`).
    pub bad_values: BadValuePolicy,
    /// The capture's column facts as last read (see [`FactsCache`]).
    pub facts: FactsCache,
}

/// A binary log stream from one position.
pub struct MyStream {
    events: Option<BinlogStream>,
    /// The capture's column facts as last read (see [`FactsCache`]).
    facts: FactsCache,
    /// The binary log's base file name.
    base: String,
    catalog: Conn,
    server: ServerInfo,
    display: String,
    zero_dates: ZeroDates,
    tables: HashMap<TableRef, Table>,
    ids: HashMap<u64, Option<(TableRef, Arc<Layout>)>>,
    /// Reused by every rows event (the values borrow each event's data).
    scratch: (Vec<usize>, Vec<usize>),
    file_seq: u64,
    group: Option<Group>,
    /// The open group's GTID.
    pending: Option<Gtid>,
    /// The GTID state after the last group closed, where known.
    gtid: Option<GtidState>,
    server_uuid: Option<String>,
    epoch: u32,
    received: BinPos,
    confirmed: Arc<Mutex<Option<BinPos>>>,
    xa: Xa,
    bad_values: BadValuePolicy,
    /// `_pos` of the open group, for messages.
    group_pos: String,
}

fn malformed(display: &str, e: impl std::fmt::Display) -> Error {
    Error::source_permanent(format!(
        "a binary log event from {display} cannot be read: {e}"
    ))
}

fn key_of(columns: &[ColumnDesc], key: &[String]) -> Vec<usize> {
    key.iter()
        .filter_map(|k| columns.iter().position(|c| &c.name == k))
        .collect()
}

/// The binary log facts of each table's columns as this process last read them from the
/// catalog, shared by the capture's streams: a table dropped after a stream noted it (its
/// last events not yet written) is still decoded, with the columns it had, when the stream
/// is opened again in the same process.
pub type FactsCache = Arc<Mutex<HashMap<TableRef, Vec<super::values::ColumnFacts>>>>;

async fn codec_for(
    conn: &mut Conn,
    cache: &FactsCache,
    table: &TableRef,
    columns: &[ColumnDesc],
    zero_dates: ZeroDates,
    display: &str,
) -> Result<Codec> {
    super::values::check_columns(table, columns)?;
    let mut facts = column_facts(conn, table, display).await?;
    {
        let mut known = cache.lock().unwrap_or_else(|p| p.into_inner());
        match (facts.is_empty(), known.get(table)) {
            (true, Some(had)) => facts = had.clone(),
            (false, _) => {
                known.insert(table.clone(), facts.clone());
            }
            (true, None) => {}
        }
    }
    if facts.len() != columns.len() {
        return Err(Error::internal(format!(
            "{table}: the catalog lists {} columns, the export {}",
            facts.len(),
            columns.len()
        )));
    }
    let decoder = ValueDecoder::new(columns, zero_dates)
        .map_err(|e| Error::config(format!("{table}: {}", e.0)))?;
    Ok(Codec::new(facts, decoder))
}

impl MyStream {
    /// A stream over `events`, a dump opened at `setup.from`.
    pub async fn new(events: BinlogStream, mut setup: Setup) -> Result<Self> {
        let display = setup.target.display().to_string();
        let zero_dates = setup.target.zero_dates;
        let mut tables = HashMap::new();
        for d in &setup.datasets {
            let Some(t) = &d.object else { continue };
            let codec = codec_for(
                &mut setup.catalog,
                &setup.facts,
                t,
                &d.columns,
                zero_dates,
                &display,
            )
            .await?;
            tables.insert(
                t.clone(),
                Table {
                    key: key_of(&d.columns, &d.primary_key),
                    columns: d.columns.clone(),
                    codec,
                    handle: None,
                    stale: false,
                    dropped_at: None,
                    map: Vec::new(),
                    layout: Arc::default(),
                },
            );
        }
        Ok(MyStream {
            events: Some(events),
            facts: setup.facts,
            base: setup.base,
            catalog: setup.catalog,
            server: setup.server,
            display,
            zero_dates,
            tables,
            ids: HashMap::new(),
            scratch: (Vec::new(), Vec::new()),
            file_seq: setup.from.seq,
            group: None,
            pending: None,
            gtid: setup.gtid,
            server_uuid: setup.server_uuid,
            epoch: setup.from.epoch,
            received: setup.from,
            confirmed: setup.confirmed,
            xa: match &setup.xa {
                Some((saved, pending)) => Xa::resuming(*saved, pending),
                None => Xa::default(),
            },
            bad_values: setup.bad_values,
            group_pos: String::new(),
        })
    }

    fn lost(&self, e: mysql_async::Error) -> Error {
        let at = match (&self.gtid, self.received.seq) {
            // A dump by GTID that has not reached a file yet.
            (Some(g), 0) => format!("after GTID {}", g.text()),
            _ => self.received.text(),
        };
        super::conn::dump_error(e, 0, &at, &self.display)
    }

    /// A restart position's text: the coordinate and the GTID state after the closed groups.
    fn restart(&self, p: BinPos) -> StreamPos {
        StreamPos::from_adapter(
            Restart {
                pos: p,
                gtid: self.gtid.as_ref().map(GtidState::text),
                server: self.server_uuid.clone(),
                xa: self.xa.pending(),
            }
            .text(),
        )
    }

    /// The open group ends: its GTID joins the state.
    fn end_group(&mut self) -> bool {
        if let (Some(g), Some(s)) = (self.pending.take(), self.gtid.as_mut()) {
            s.add(&g);
        }
        self.group.take().is_some()
    }

    fn at(&self, offset: u64) -> BinPos {
        BinPos {
            epoch: self.epoch,
            seq: self.file_seq,
            offset,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn open_group(
        &mut self,
        sink: &mut dyn ChangeSink,
        at: BinPos,
        xid: String,
        gtid: Option<Gtid>,
        commit_ts: i64,
        group: Group,
    ) -> Result<()> {
        if self.group.is_some() {
            // Groups are written to the binary log whole, one after another: a group that
            // starts means the previous one ended here, even when its last event was not one
            // that says so (a statement logged without the standalone flag and without a
            // COMMIT).
            tracing::debug!(
                "a group starts at {} while one was open: closing that one",
                at.text()
            );
            self.end_group();
            sink.commit(&self.restart(at))?;
        }
        self.pending = gtid;
        self.group = Some(group);
        self.group_pos = at.text();
        sink.begin(TxMeta {
            pos: StreamPos::from_adapter(at.text()),
            xid,
            commit_ts: Some(commit_ts),
        })
    }

    fn close_group(&mut self, sink: &mut dyn ChangeSink, after: BinPos) -> Result<()> {
        if self.end_group() {
            sink.commit(&self.restart(after))?;
        }
        Ok(())
    }

    /// The file sequence number a rotate event names. The server's first (artificial) rotate
    /// precedes the format description, so its checksum is not cut off by the parser and
    /// trails the name: the name is matched against the files it can be (this one, the next)
    /// before it is parsed.
    fn rotated_to(&self, name: &[u8]) -> Result<u64> {
        for seq in [self.file_seq, self.file_seq + 1] {
            let want = file_name(&self.base, seq);
            if name == want.as_bytes()
                || (name.len() == want.len() + 4 && name.starts_with(want.as_bytes()))
            {
                return Ok(seq);
            }
        }
        let text = String::from_utf8_lossy(name);
        let digits: String = text
            .rsplit_once('.')
            .map(|(_, d)| d.chars().take_while(char::is_ascii_digit).collect())
            .unwrap_or_default();
        split_file(&format!("x.{digits}")).map(|(_, seq)| seq)
    }

    /// Handle one event; false for a heartbeat.
    async fn handle(&mut self, e: Event, sink: &mut dyn ChangeSink) -> Result<bool> {
        let h = e.header();
        let kind = h.event_type_raw();
        let end = h.log_pos() as u64;
        let ts = h.timestamp() as i64 * 1_000_000;
        if kind == ROTATE_EVENT {
            let r: RotateEvent<'_> = e.read_event().map_err(|x| malformed(&self.display, x))?;
            let seq = self.rotated_to(r.name_raw())?;
            self.file_seq = seq;
            if self.group.is_none() {
                self.received = self.at(r.position());
            }
            return Ok(true);
        }
        if kind == HEARTBEAT_EVENT {
            // Only liveness: the position it carries is not used (every event up to the end
            // of the log is read anyway, and the received position must never pass an event
            // not handled yet).
            return Ok(false);
        }
        if end == 0 || h.flags_raw() & LOG_EVENT_ARTIFICIAL_F != 0 {
            return Ok(true);
        }
        let at = self.at(end.saturating_sub(h.event_size() as u64));
        let after = self.at(end);
        let counts = if kind == TRANSACTION_PAYLOAD {
            // A transaction compressed by MySQL (`binlog_transaction_compression`): its events,
            // whose own positions are 0, all stand at the payload event's position.
            let p: TransactionPayloadEvent<'_> =
                e.read_event().map_err(|x| malformed(&self.display, x))?;
            let mut payload = p.decompressed().map_err(|x| malformed(&self.display, x))?;
            let mut reader = EventStreamReader::new(BinlogVersion::Version4);
            let mut counts = true;
            while let Some(inner) = reader
                .read_decompressed(&mut payload)
                .map_err(|x| malformed(&self.display, x))?
            {
                let h = inner.header();
                let (kind, ts) = (h.event_type_raw(), h.timestamp() as i64 * 1_000_000);
                counts = self.event(inner, kind, (at, after), ts, sink).await?;
            }
            counts
        } else {
            self.event(e, kind, (at, after), ts, sink).await?
        };
        if counts && self.group.is_none() {
            self.received = after;
        }
        Ok(true)
    }

    /// One event standing at `at` and ending at `after` (the events of a compressed
    /// transaction all stand at its payload's position). False when the received position
    /// does not move past it: an event read again for prepared XA transactions only, or one
    /// kept inside a prepare group.
    async fn event(
        &mut self,
        e: Event,
        kind: u8,
        (at, after): (BinPos, BinPos),
        ts: i64,
        sink: &mut dyn ChangeSink,
    ) -> Result<bool> {
        let h = e.header();
        if self.xa.recovering(at) {
            self.recover(&e, kind)?;
            return Ok(false);
        }
        if self.xa.capturing() {
            match kind {
                TABLE_MAP_EVENT | 23..=25 | 30..=32 => {
                    self.xa.keep(&e, &self.display)?;
                    return Ok(false);
                }
                XA_PREPARE_EVENT => {
                    // The position after the prepare carries the transaction as pending, so
                    // the stream has received through it (an idle log after a prepare must
                    // not keep `--until-current` waiting).
                    self.xa.prepared();
                    self.close_group(sink, after)?;
                    return Ok(true);
                }
                _ => {}
            }
        }
        match kind {
            MARIADB_GTID => {
                let g = MariaGtid::parse(e.data())?;
                let group = Group {
                    await_begin: false,
                    standalone: g.standalone(),
                };
                let gtid = Gtid::Mariadb {
                    domain: g.domain,
                    server: h.server_id(),
                    seq: g.seq_no,
                };
                self.open_group(sink, at, g.text(h.server_id()), Some(gtid), ts, group)?;
                if g.prepared_xa() {
                    self.xa.start(at);
                }
            }
            MYSQL_GTID | MYSQL_ANONYMOUS_GTID => {
                let g: GtidEvent = e.read_event().map_err(|x| malformed(&self.display, x))?;
                let (xid, gtid) = if kind == MYSQL_GTID {
                    let text = mysql_gtid(g.sid(), g.gno());
                    let uuid = text.split(':').next().unwrap_or_default().to_string();
                    let gtid = Gtid::Mysql { uuid, gno: g.gno() };
                    (text, Some(gtid))
                } else {
                    (String::new(), None)
                };
                let commit = match g.original_commit_timestamp() {
                    0 => ts,
                    us => us as i64,
                };
                let group = Group {
                    await_begin: true,
                    standalone: false,
                };
                self.open_group(sink, at, xid, gtid, commit, group)?;
            }
            QUERY_EVENT => {
                let q: QueryEvent<'_> = e.read_event().map_err(|x| malformed(&self.display, x))?;
                let sql = q.query().into_owned();
                let schema = q.schema().into_owned();
                self.statement(sink, &sql, &schema, at, after, ts).await?;
            }
            XID_EVENT => self.close_group(sink, after)?,
            TABLE_MAP_EVENT => self.table_map(&e, sink).await?,
            PARTIAL_UPDATE_ROWS => {
                return Err(Error::config(format!(
                    "{} logs JSON updates as diffs (binlog_row_value_options=PARTIAL_JSON), \
                     which do not carry the new value. Set binlog_row_value_options=''.",
                    self.display
                )));
            }
            k if MARIADB_COMPRESSED.contains(&k) => {
                return Err(Error::config(format!(
                    "{} compresses its binary log (log_bin_compress=ON), whose events sluice \
                     stream does not read. Set log_bin_compress=OFF.",
                    self.display
                )));
            }
            23..=25 | 30..=32 => self.rows(&e, sink)?,
            _ => {}
        }
        Ok(true)
    }

    async fn statement(
        &mut self,
        sink: &mut dyn ChangeSink,
        sql: &str,
        schema: &str,
        at: BinPos,
        after: BinPos,
        ts: i64,
    ) -> Result<()> {
        let kind = classify(sql);
        match kind {
            Statement::Begin => {
                match self.group.as_mut() {
                    Some(g) => g.await_begin = false,
                    None => {
                        let group = Group {
                            await_begin: false,
                            standalone: false,
                        };
                        self.open_group(sink, at, String::new(), None, ts, group)?;
                    }
                }
                return Ok(());
            }
            Statement::Commit | Statement::Rollback => return self.close_group(sink, after),
            // The group-end rules below apply to it as to any statement.
            Statement::Xa => self.xa_statement(sink, sql, at).await?,
            _ => {}
        }
        if self.group.is_none() {
            let group = Group {
                await_begin: false,
                standalone: true,
            };
            self.open_group(sink, at, String::new(), None, ts, group)?;
        }
        let named: Vec<TableRef> = self
            .tables
            .keys()
            .filter(|t| crate::sql::names_table(sql, schema, t))
            .cloned()
            .collect();
        for t in named {
            match kind {
                Statement::Dml => {
                    return Err(Error::config(format!(
                        "the binary log of {} holds a statement-based change of {t} at {} \
                         (binlog_format STATEMENT or MIXED in the session that wrote it): its \
                         rows are not in the log. Set binlog_format=ROW globally and reconnect \
                         the writers; the stream cannot continue past this change (start over \
                         with a new snapshot: sluice stream --drop, then a new output).",
                        self.display,
                        at.text()
                    )));
                }
                Statement::Truncate => {
                    self.truncate(&t, sink).await?;
                }
                Statement::Other if super::binlog::unlogged_rows(sql).is_some() => {
                    return Err(Error::config(format!(
                        "the binary log of {} holds `{}` of captured table {t} at {}: the rows \
                         it removes or brings in are not in the log, so the change files or \
                         the target would differ from the table from here on. Take a new \
                         snapshot of the table (sluice stream or replicate --drop, then start \
                         again).",
                        self.display,
                        super::binlog::unlogged_rows(sql).unwrap_or_default(),
                        at.text()
                    )));
                }
                Statement::Other
                    if crate::sql::first_keyword(sql) == "DROP"
                        || sql.to_ascii_uppercase().contains("RENAME") =>
                {
                    tracing::warn!(
                        "the binary log of {} renames or drops captured table {t} at {}: its \
                         changes after that, under another name, are not captured (select the \
                         table by its new name and take a new snapshot of it)",
                        self.display,
                        at.text()
                    );
                }
                _ => {}
            }
            let ddl = crate::sql::table_ddl(sql);
            if let Some(tab) = self.tables.get_mut(&t) {
                tab.stale = true;
                let dropped = tab.dropped_at.clone();
                match (ddl, dropped) {
                    (TableDdl::Drop, _) => tab.dropped_at = Some(at.text()),
                    (TableDdl::Create, Some(dropped)) => {
                        return Err(self.created_again(&t, &dropped, &at.text()));
                    }
                    (TableDdl::Replace, _) => {
                        return Err(self.created_again(&t, &at.text(), &at.text()));
                    }
                    _ => {}
                }
            }
        }
        let ends = self
            .group
            .as_ref()
            .is_some_and(|g| g.standalone || g.await_begin);
        if ends {
            self.close_group(sink, after)?;
        }
        Ok(())
    }

    /// An XA statement: `XA START` (MySQL) opens a prepare group, `XA END` names it, `XA
    /// COMMIT` decodes its kept events into this group, `XA ROLLBACK` drops them.
    async fn xa_statement(
        &mut self,
        sink: &mut dyn ChangeSink,
        sql: &str,
        at: BinPos,
    ) -> Result<()> {
        let Some((verb, id)) = super::xa::id_of(sql) else {
            return Ok(());
        };
        match verb.as_str() {
            "START" | "BEGIN" => {
                // MySQL: the transaction's statements follow, as after a BEGIN.
                if let Some(g) = self.group.as_mut() {
                    g.await_begin = false;
                }
                self.xa.start(at);
            }
            "END" => self.xa.named(&id),
            "COMMIT" => {
                for e in self.xa.commit(&id, at, &self.display)? {
                    match e.header().event_type_raw() {
                        TABLE_MAP_EVENT => self.table_map(&e, sink).await?,
                        23..=25 | 30..=32 => self.rows(&e, sink)?,
                        _ => {}
                    }
                }
            }
            "ROLLBACK" => self.xa.rollback(&id),
            _ => {}
        }
        Ok(())
    }

    /// An event before the position the stream was opened at, read again for prepared XA
    /// groups only: nothing reaches the change sink.
    fn recover(&mut self, e: &Event, kind: u8) -> Result<()> {
        match kind {
            MARIADB_GTID if MariaGtid::parse(e.data())?.prepared_xa() => {
                let h = e.header();
                let start = h.log_pos().saturating_sub(h.event_size()) as u64;
                self.xa.start(self.at(start));
            }
            QUERY_EVENT => {
                let q: QueryEvent<'_> = e.read_event().map_err(|x| malformed(&self.display, x))?;
                let sql = q.query();
                if let Some((verb, id)) = super::xa::id_of(&sql) {
                    let h = e.header();
                    let start = h.log_pos().saturating_sub(h.event_size()) as u64;
                    match verb.as_str() {
                        "START" | "BEGIN" => self.xa.start(self.at(start)),
                        "END" => self.xa.named(&id),
                        "COMMIT" | "ROLLBACK" => self.xa.rollback(&id),
                        _ => {}
                    }
                }
            }
            TABLE_MAP_EVENT | 23..=25 | 30..=32 if self.xa.capturing() => {
                self.xa.keep(e, &self.display)?;
            }
            XA_PREPARE_EVENT => self.xa.prepared(),
            _ => {}
        }
        Ok(())
    }

    async fn truncate(&mut self, t: &TableRef, sink: &mut dyn ChangeSink) -> Result<()> {
        let handle = self.relation(t, sink).await?;
        let n = self.tables.get(t).map_or(0, |x| x.columns.len());
        if let Some(rows) = sink.row(handle, ChangeOp::Truncate)? {
            for i in 0..n {
                rows.columns()[i].push_null();
                rows.absent(i)?;
            }
        }
        sink.row_done()
    }

    /// The runner's handle for `t`, its columns read again first if a DDL named it.
    async fn relation(&mut self, t: &TableRef, sink: &mut dyn ChangeSink) -> Result<usize> {
        self.refresh(t).await?;
        let tab = self
            .tables
            .get_mut(t)
            .ok_or_else(|| Error::internal(format!("{t} is not captured")))?;
        match tab.handle {
            Some(h) => Ok(h),
            None => {
                let h = sink.relation(t, &tab.columns)?;
                tab.handle = Some(h);
                Ok(h)
            }
        }
    }

    /// Read `t`'s columns from the catalog again if a DDL named it (or its table map did not
    /// fit them); they are announced to the runner only once they are the ones decoded with.
    async fn refresh(&mut self, t: &TableRef) -> Result<()> {
        let display = self.display.clone();
        let Some(tab) = self.tables.get_mut(t) else {
            return Err(Error::internal(format!("{t} is not captured")));
        };
        if tab.stale {
            let described = catalog::describe(
                &mut self.catalog,
                &Resolved {
                    table: t.clone(),
                    view: false,
                },
                &self.server,
                &display,
            )
            .await?;
            let d = described.dataset;
            tab.codec = codec_for(
                &mut self.catalog,
                &self.facts,
                t,
                &d.columns,
                self.zero_dates,
                &display,
            )
            .await?;
            tab.key = key_of(&d.columns, &d.primary_key);
            if tab.key.is_empty() {
                return Err(Error::config(format!(
                    "{t} no longer has a primary key (a DDL in the binary log), so its updates \
                     and deletes cannot be keyed. Add the key back, or stream without the table."
                )));
            }
            tab.columns = d.columns;
            tab.stale = false;
            tab.handle = None;
        }
        Ok(())
    }

    /// The stop of a captured table the log dropped (or replaced) at `dropped` and created
    /// again at `created`: the old table's rows left without a delete event each, so the new
    /// table's rows cannot continue its change files or target table.
    fn created_again(&self, t: &TableRef, dropped: &str, created: &str) -> Error {
        Error::config(format!(
            "the binary log of {} drops captured table {t} at {dropped} and creates a table of \
             that name again at {created}: the dropped table's rows left it without a delete \
             event each, so the new table's rows cannot continue its changes (whoever applies \
             them would keep the old rows). Start over with a new snapshot: sluice stream \
             --drop (or sluice replicate --drop), then start again; or leave the table out of \
             the selection.",
            self.display
        ))
    }

    async fn table_map(&mut self, e: &Event, sink: &mut dyn ChangeSink) -> Result<()> {
        let tme: TableMapEvent<'_> = e.read_event().map_err(|x| malformed(&self.display, x))?;
        let t = TableRef {
            schema: tme.database_name().into_owned(),
            name: tme.table_name().into_owned(),
        };
        let id = tme.table_id();
        let count = tme.columns_count() as usize;
        let Some(tab) = self.tables.get(&t) else {
            self.ids.insert(id, None);
            return Ok(());
        };
        if let Some(dropped) = &tab.dropped_at {
            // Rows of a table of the dropped one's name: it was created again.
            let at = self.at(e.header().log_pos() as u64).text();
            return Err(self.created_again(&t, dropped, &at));
        }
        if !tab.stale && tab.handle.is_some() && tab.map == e.data() {
            let layout = tab.layout.clone();
            self.ids.insert(id, Some((t, layout)));
            return Ok(());
        }
        // Not announced yet: the catalog is the table now, which may be ahead of this event
        // (a column added while the stream was stopped); the runner is told the columns only
        // once they are known to be this table map's, or its schema history would gain a
        // version the log has not reached.
        self.refresh(&t).await?;
        let from_map = super::table_map::columns(&t, &tme)?;
        // The definition decoded with must be the one the event was written with: same
        // columns, and (under full row metadata, which says) the same binary log facts —
        // enum and set members in order, signedness, character set — or old events would
        // decode into wrong values without an error.
        let fits = |tab: &Table| {
            tab.columns.len() == count
                && from_map.as_ref().is_none_or(|m| {
                    m.columns
                        .iter()
                        .map(|c| &c.name)
                        .eq(tab.columns.iter().map(|c| &c.name))
                        && m.facts
                            .iter()
                            .map(|f| &f.fix)
                            .eq(tab.codec.facts.iter().map(|f| &f.fix))
                })
        };
        if !self.tables.get(&t).is_some_and(fits) {
            // The definition differs from the one decoded with: the catalog now, else the
            // table map's own description (full row metadata), else stop.
            if let Some(tab) = self.tables.get_mut(&t) {
                tab.stale = true;
            }
            self.refresh(&t).await?;
            if !self.tables.get(&t).is_some_and(fits) {
                let Some(mut m) = from_map else {
                    let have = self.tables.get(&t).map_or(0, |x| x.columns.len());
                    return Err(Error::new(
                        ErrorKind::Source,
                        Retry::Permanent,
                        format!(
                            "{t} has {count} columns in the binary log at {} but {have} in the \
                             catalog now: its definition changed after this point, and without \
                             full row metadata the binary log does not say what it was. Set \
                             binlog_row_metadata=FULL on the server (MySQL 8, MariaDB 10.5+) so \
                             the stream can decode older rows, or start over (sluice stream \
                             --drop, new output).",
                            self.received.text()
                        ),
                    ));
                };
                let tab = self
                    .tables
                    .get_mut(&t)
                    .ok_or_else(|| Error::internal(format!("{t} is not captured")))?;
                super::table_map::reconcile(&mut m, &tab.columns, &tab.codec.facts);
                let decoder = ValueDecoder::new(&m.columns, self.zero_dates)
                    .map_err(|e| Error::config(format!("{t}: {}", e.0)))?;
                if !m.key.is_empty() {
                    tab.key = key_of(&m.columns, &m.key);
                } else {
                    let names: Vec<String> = tab
                        .key
                        .iter()
                        .map(|k| tab.columns[*k].name.clone())
                        .collect();
                    tab.key = key_of(&m.columns, &names);
                }
                tab.codec = Codec::new(m.facts, decoder);
                tab.columns = m.columns;
                // Read the catalog again at the next DDL or mismatch.
                tab.stale = false;
                tab.handle = None;
            }
        }
        self.relation(&t, sink).await?;
        let layout = Arc::new(Layout::of(&tme).map_err(|x| malformed(&self.display, x))?);
        let tab = self
            .tables
            .get_mut(&t)
            .ok_or_else(|| Error::internal(format!("{t} is not captured")))?;
        tab.map = e.data().to_vec();
        tab.layout = layout.clone();
        self.ids.insert(id, Some((t, layout)));
        Ok(())
    }

    fn rows(&mut self, e: &Event, sink: &mut dyn ChangeSink) -> Result<()> {
        let data = e.read_data().map_err(|x| malformed(&self.display, x))?;
        let Some(EventData::RowsEvent(r)) = data else {
            return Ok(());
        };
        let Some(Some((t, layout))) = self.ids.get(&r.table_id()) else {
            return Ok(());
        };
        let (t, layout) = (t.clone(), layout.clone());
        let op = match &r {
            RowsEventData::WriteRowsEventV1(_) | RowsEventData::WriteRowsEvent(_) => {
                ChangeOp::Insert
            }
            RowsEventData::DeleteRowsEventV1(_) | RowsEventData::DeleteRowsEvent(_) => {
                ChangeOp::Delete
            }
            _ => ChangeOp::Update,
        };
        let columns = r.num_columns() as usize;
        if columns != layout.columns() {
            return Err(malformed(
                &self.display,
                format!(
                    "a rows event of {t} has {columns} columns, its table map {}",
                    layout.columns()
                ),
            ));
        }
        let (before_cols, after_cols) = &mut self.scratch;
        before_cols.clear();
        after_cols.clear();
        if let Some(b) = r.columns_before_image() {
            before_cols.extend(b.iter_ones().take_while(|i| *i < columns));
        }
        if let Some(a) = r.columns_after_image() {
            after_cols.extend(a.iter_ones().take_while(|i| *i < columns));
        }
        let tab = self
            .tables
            .get_mut(&t)
            .ok_or_else(|| Error::internal(format!("{t} is not captured")))?;
        let handle = tab
            .handle
            .ok_or_else(|| Error::internal(format!("{t} has no handle")))?;
        let n = tab.columns.len();
        let (has_before, has_after) = (
            r.columns_before_image().is_some(),
            r.columns_after_image().is_some(),
        );
        let mut buf = ParseBuf(r.rows_data());
        let (mut b, mut a) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let display = &self.display;
        let bad = (&self.bad_values, self.group_pos.as_str());
        while !buf.is_empty() {
            if has_before {
                read_image(&mut buf, &layout, before_cols, n, &mut b)
                    .map_err(|x| malformed(display, x))?;
            }
            if has_after {
                read_image(&mut buf, &layout, after_cols, n, &mut a)
                    .map_err(|x| malformed(display, x))?;
            }
            let moved = op == ChangeOp::Update
                && tab
                    .key
                    .iter()
                    .any(|k| matches!((&a[*k], &b[*k]), (Some(x), Some(y)) if x != y));
            if op == ChangeOp::Update {
                for (x, y) in a.iter_mut().zip(b.iter()) {
                    if x.is_none() {
                        x.clone_from(y);
                    }
                }
            }
            let mut put = |op, values: &mut Vec<_>, updated: Option<&Vec<_>>| {
                let updated = updated.map(Vec::as_slice);
                emit(tab, handle, &t, op, values, updated, sink, bad)
            };
            match op {
                ChangeOp::Insert => put(ChangeOp::Insert, &mut a, None)?,
                ChangeOp::Delete => put(ChangeOp::Delete, &mut b, None)?,
                _ if moved => {
                    put(ChangeOp::Delete, &mut b, None)?;
                    put(ChangeOp::Insert, &mut a, None)?;
                }
                _ => put(ChangeOp::Update, &mut a, Some(&b))?,
            }
        }
        Ok(())
    }
}

/// One change into the runner's builders: values present are decoded, the others absent; a
/// value that cannot be written goes by the bad-value policy (`bad`, with the group's `_pos`).
/// With before-images the old row is appended first — a delete's own values, an update's
/// before image `updated` — and must be whole: a session logging `binlog_row_image=MINIMAL`
/// or `NOBLOB` stops the stream, naming the fix.
#[allow(clippy::too_many_arguments)]
fn emit(
    tab: &mut Table,
    handle: usize,
    t: &TableRef,
    op: ChangeOp,
    values: &mut [Option<Cell<'_>>],
    updated: Option<&[Option<Cell<'_>>]>,
    sink: &mut dyn ChangeSink,
    (bad, pos): (&BadValuePolicy, &str),
) -> Result<()> {
    if let Some(rows) = sink.row(handle, op)? {
        if rows.before_images() {
            let old = match op {
                ChangeOp::Delete => Some(&*values),
                _ => updated,
            };
            if let Some(old) = old {
                emit_before(tab, t, rows, old, (bad, pos))?;
            }
        }
        for (i, v) in values.iter_mut().enumerate() {
            match v.take() {
                // Left out by --columns: not decoded, never written.
                _ if !rows.kept(i) => rows.columns()[i].push_null(),
                Some(v) => {
                    if let Err(e) = tab.codec.push_cell(i, &mut rows.columns()[i], v) {
                        bad.handle(&format!("{t}.{}", tab.columns[i].name), pos, &e.0)?;
                        rows.columns()[i].push_null();
                    }
                }
                None => {
                    rows.columns()[i].push_null();
                    rows.absent(i)?;
                }
            }
        }
    }
    sink.row_done()
}

/// Append `old`, the whole before image of an update or a delete, as its `_before` row.
fn emit_before(
    tab: &mut Table,
    t: &TableRef,
    rows: &mut ChangeRows,
    old: &[Option<Cell<'_>>],
    (bad, pos): (&BadValuePolicy, &str),
) -> Result<()> {
    if let Some(i) = (0..old.len()).find(|i| rows.kept(*i) && old[*i].is_none()) {
        return Err(Error::data(format!(
            "{t}: a change at position {pos} was logged without the old value of {} \
             (its session wrote binlog_row_image=MINIMAL or NOBLOB), and --before-images \
             writes whole old rows. Set binlog_row_image=FULL globally (and in the server's \
             configuration) and reconnect the writers, then restart the stream; or stream \
             without --before-images.",
            tab.columns[i].name
        )));
    }
    for (i, v) in old.iter().enumerate() {
        let kept = rows.kept(i);
        let out = rows
            .before()
            .ok_or_else(|| Error::internal("before-images without their builders"))?;
        match v {
            Some(v) if kept => {
                if let Err(e) = tab.codec.push_cell(i, &mut out[i], v.clone()) {
                    bad.handle(&format!("{t}.{}", tab.columns[i].name), pos, &e.0)?;
                    out[i].push_null();
                }
            }
            // Left out by --columns: not decoded, never written.
            _ => out[i].push_null(),
        }
    }
    Ok(())
}

#[async_trait]
impl ChangeStream for MyStream {
    async fn next(&mut self, sink: &mut dyn ChangeSink, wait: Duration) -> Result<Step> {
        let first = {
            let events = self
                .events
                .as_mut()
                .ok_or_else(|| Error::internal("the binary log stream is closed"))?;
            match tokio::time::timeout(wait, events.next()).await {
                Err(_) => return Ok(Step::Idle),
                Ok(x) => x,
            }
        };
        let mut data = false;
        let mut next = first;
        for n in 1..=EVENTS_PER_STEP {
            match next {
                None => {
                    return Err(Error::new(
                        ErrorKind::Source,
                        Retry::Transient,
                        format!("{} ended the binary log stream", self.display),
                    ));
                }
                Some(Err(e)) => return Err(self.lost(e)),
                Some(Ok(e)) => data |= self.handle(e, sink).await?,
            }
            if n == EVENTS_PER_STEP {
                // Read no event that this call would not handle.
                break;
            }
            let events = self
                .events
                .as_mut()
                .ok_or_else(|| Error::internal("the binary log stream is closed"))?;
            match events.next().now_or_never() {
                Some(x) => next = x,
                None => break,
            }
        }
        Ok(if data { Step::Data } else { Step::Idle })
    }

    async fn confirm(&mut self, restart: &StreamPos) -> Result<()> {
        // The binary log has no feedback to a replica: the position is only remembered for
        // the harm figures (what the server must keep for this stream).
        let p = BinPos::parse(restart.as_str())?;
        if let Ok(mut g) = self.confirmed.lock() {
            *g = Some(p);
        }
        Ok(())
    }

    fn received_through(&self) -> Option<StreamPos> {
        self.group.is_none().then(|| self.restart(self.received))
    }

    async fn close(&mut self) -> Result<()> {
        if let Some(s) = self.events.take() {
            let _ = s.close().await;
        }
        Ok(())
    }
}
