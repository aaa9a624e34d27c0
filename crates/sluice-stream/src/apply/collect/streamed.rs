//! A transaction larger than the streaming threshold: its unit is handed to the workers as
//! soon as it passes the threshold (with every unit closed before it, in source order), and its
//! further pieces follow through a channel of two, so memory stays bounded whatever the
//! transaction's size; the worker keeps one target transaction open for it. The unit must
//! reach the workers before the source read feeding it returns: its pieces are sent from inside
//! that read, and a unit still waiting in the collector would never be taken.

use super::super::writeset::RowKeys;
use super::{Collector, Handoff, Open, Piece, Ready, Work};
use sluice_core::apply::AppliedPosition;
use sluice_core::{Error, Result};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// What follows a streamed unit's first pieces.
#[derive(Debug)]
pub(crate) enum More {
    /// The next piece, with the keys of its rows (none for a barrier).
    Piece(Piece, RowKeys),
    /// The transaction committed at this position, after this many row changes besides the
    /// unit's first pieces' (`Work::changes`).
    End(AppliedPosition, u64),
}

impl Collector {
    /// Stop handing pieces to a streamed transaction's worker (the run is stopping): it rolls
    /// the transaction back.
    pub fn abandon(&mut self) {
        self.streaming = None;
        self.open = Open::default();
        self.in_tx = false;
    }
    /// Where a streamed transaction's unit goes the moment it is closed: its further pieces
    /// wait for a worker to take them, so the unit (and every unit closed before it) must
    /// reach the workers before the source read that is feeding it returns. Without a
    /// handoff the streamed unit waits in [`Collector::ready`] (tests that drive the
    /// collector alone).
    pub fn set_handoff(&mut self, handoff: Handoff) {
        self.handoff = Some(handoff);
    }
    /// A piece of a streamed transaction goes to its worker; otherwise it stays in the unit.
    /// The rows before it go first (a streamed transaction's rows gathered since its last
    /// piece are still in the open unit).
    pub(super) fn send_or_keep(&mut self, piece: Piece) -> Result<()> {
        if self.streaming.is_none() {
            self.open.pieces.push(piece);
            return Ok(());
        }
        self.stream_rows()?;
        match &self.streaming {
            Some(tx) => send(tx, More::Piece(piece, RowKeys::default())),
            None => Ok(()),
        }
    }
    /// The open transaction passed the threshold: hand the unit over now, stream the rest.
    /// The unit goes to the workers at once (with the units closed before it, in source
    /// order): its further pieces are sent from inside the source read, and the channel's
    /// room is what bounds memory, so a unit still waiting here would never be taken and the
    /// third piece would wait for ever.
    pub(super) fn start_streaming(&mut self) -> Result<()> {
        self.close_rows()?;
        let open = std::mem::take(&mut self.open);
        let (tx, rx) = mpsc::channel(2);
        self.streamed_changes = 0;
        self.ready.push(Ready {
            work: Arc::new(Work {
                pieces: open.pieces,
                more: Some(Mutex::new(Some(rx))),
                position: None,
                bytes: open.bytes,
                transactions: open.transactions + 1,
                changes: open.changes,
                commit_ts: self.tx.commit_ts,
                rows: open.rows,
            }),
            exclusive: true,
        });
        if let Some(handoff) = &self.handoff {
            handoff(std::mem::take(&mut self.ready));
        }
        self.streaming = Some(tx);
        Ok(())
    }
    pub(super) fn stream_rows(&mut self) -> Result<()> {
        self.close_rows()?;
        let pieces = std::mem::take(&mut self.open.pieces);
        let mut keys = std::mem::take(&mut self.open.rows);
        self.open.bytes = 0;
        if let Some(tx) = &self.streaming {
            for p in pieces {
                let k = match &p {
                    Piece::Rows(u) => keys.take_front(u.order.len()),
                    Piece::Barrier(..) => RowKeys::default(),
                };
                send(tx, More::Piece(p, k))?;
            }
        }
        Ok(())
    }
}

/// Hand a piece to the worker applying a streamed transaction, waiting while it is busy (the
/// source is read on this thread, so the wait is what bounds memory).
pub(super) fn send(tx: &mpsc::Sender<More>, m: More) -> Result<()> {
    tokio::task::block_in_place(|| tx.blocking_send(m).map_err(|_| ())).map_err(|()| {
        Error::destination(
            sluice_core::Retry::Transient,
            "the apply worker of a large transaction stopped",
        )
    })
}
