//! Compression of a text part's whole stream (CSV, JSON Lines): gzip or zstd between the
//! format's buffer and the destination.
//!
//! The format hands over blocks of about 1 MB; the encoder compresses each into a buffer of
//! its own, which is then written to the destination, so the part holds one block and the
//! encoder's window, never the file, and an aborted part leaves the encoder nothing to write
//! (its trailer goes to the buffer, which is dropped). Finishing writes the gzip trailer or
//! the end of the zstd frame.

use crate::destination::{CountingWriter, io_error};
use crate::format::{PartStats, PartWriter, TextCompression};
use arrow_array::RecordBatch;
use flate2::write::GzEncoder;
use sluice_core::{Error, Result};
use std::io::Write;

enum Encoder {
    Gzip(GzEncoder<Vec<u8>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

/// A destination writer, compressed or not.
pub(crate) struct Compressed {
    out: CountingWriter,
    encoder: Option<Encoder>,
    path: String,
}

impl Compressed {
    /// Start writing `out` (which writes `path`) with `compression`.
    pub(crate) fn new(
        out: CountingWriter,
        compression: TextCompression,
        path: &str,
    ) -> Result<Self> {
        let encoder = match compression {
            TextCompression::None => None,
            TextCompression::Gzip => Some(Encoder::Gzip(GzEncoder::new(
                Vec::new(),
                flate2::Compression::default(),
            ))),
            TextCompression::Zstd(level) => {
                if !(1..=22).contains(&level) {
                    return Err(Error::config(format!(
                        "zstd level {level} is out of range: use 1 (fastest) to 22 (smallest)."
                    )));
                }
                Some(Encoder::Zstd(
                    zstd::stream::write::Encoder::new(Vec::new(), level)
                        .map_err(|e| Error::internal(format!("cannot start zstd: {e}")))?,
                ))
            }
        };
        Ok(Compressed {
            out,
            encoder,
            path: path.to_string(),
        })
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|e| {
            self.out
                .errors()
                .take()
                .unwrap_or_else(|| io_error(&e, "write", &self.path))
        })
    }

    /// Write a block of the format's text.
    pub(crate) fn write_block(&mut self, block: &[u8]) -> Result<()> {
        let compressed = match self.encoder.as_mut() {
            None => return self.put(block),
            Some(Encoder::Gzip(e)) => e.write_all(block).map(|()| std::mem::take(e.get_mut())),
            Some(Encoder::Zstd(e)) => e.write_all(block).map(|()| std::mem::take(e.get_mut())),
        }
        .map_err(|e| Error::internal(format!("cannot compress {}: {e}", self.path)))?;
        self.put(&compressed)
    }

    /// End the compressed stream and hand the destination's writer back, to be committed.
    pub(crate) fn finish(mut self) -> Result<CountingWriter> {
        let tail = match self.encoder.take() {
            None => Vec::new(),
            Some(Encoder::Gzip(e)) => e
                .finish()
                .map_err(|e| Error::internal(format!("cannot compress {}: {e}", self.path)))?,
            Some(Encoder::Zstd(e)) => e
                .finish()
                .map_err(|e| Error::internal(format!("cannot compress {}: {e}", self.path)))?,
        };
        self.put(&tail)?;
        Ok(self.out)
    }

    /// Discard the file.
    pub(crate) fn abort(self) {
        self.out.abort();
    }
}

/// How much text a part buffers before it hands a block to the destination.
const FLUSH_AT: usize = 1 << 20;

/// A text part's buffer and where it goes (CSV, JSON Lines): the format appends a row's text
/// to `buf` and calls [`TextPart::row_done`]; blocks of about 1 MB go on, compressed or not.
pub(crate) struct TextPart {
    out: Option<Compressed>,
    /// The text not handed on yet.
    pub buf: Vec<u8>,
    rows: u64,
}

impl TextPart {
    /// Start writing `out` (which writes `path`) with `compression`.
    pub(crate) fn new(
        out: CountingWriter,
        compression: TextCompression,
        path: &str,
    ) -> Result<Self> {
        Ok(TextPart {
            out: Some(Compressed::new(out, compression, path)?),
            buf: Vec::with_capacity(FLUSH_AT + 4096),
            rows: 0,
        })
    }

    /// A row's text is in `buf`: hand a full block on.
    pub(crate) fn row_done(&mut self) -> Result<()> {
        if self.buf.len() >= FLUSH_AT {
            self.flush()?;
        }
        Ok(())
    }

    /// `n` more rows written (for the part's statistics).
    pub(crate) fn rows_done(&mut self, n: usize) {
        self.rows += n as u64;
    }

    fn flush(&mut self) -> Result<()> {
        let out = self
            .out
            .as_mut()
            .ok_or_else(|| Error::internal("write after finish"))?;
        out.write_block(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    /// Hand the rest on, end the stream and commit the part.
    pub(crate) fn finish(&mut self) -> Result<PartStats> {
        self.flush()?;
        let out = self
            .out
            .take()
            .ok_or_else(|| Error::internal("finish twice"))?;
        out.finish()?.commit(self.rows)
    }

    /// Drop the part unwritten.
    pub(crate) fn abort(&mut self) {
        if let Some(out) = self.out.take() {
            out.abort();
        }
    }
}

/// What a text format (CSV, JSON Lines) writes of a batch.
pub(crate) trait TextRows: Send {
    /// Append the rows of `batch` to `text.buf`, calling [`TextPart::row_done`] after each.
    fn rows(&mut self, batch: &RecordBatch, text: &mut TextPart) -> Result<()>;
}

/// A text part file being written: the format's state and the part's buffer. Writing,
/// finishing and dropping a part are the same for every text format.
pub(crate) struct TextWriter<F> {
    pub(crate) text: TextPart,
    pub(crate) format: F,
}

impl<F: TextRows> PartWriter for TextWriter<F> {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.format.rows(batch, &mut self.text)?;
        self.text.rows_done(batch.num_rows());
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<PartStats> {
        self.text.finish()
    }

    fn abort(mut self: Box<Self>) {
        self.text.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn roundtrip(c: TextCompression, blocks: &[&[u8]]) -> Vec<u8> {
        let mut e = match c {
            TextCompression::Gzip => {
                Encoder::Gzip(GzEncoder::new(Vec::new(), flate2::Compression::default()))
            }
            _ => Encoder::Zstd(zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap()),
        };
        let mut file = Vec::new();
        for b in blocks {
            match &mut e {
                Encoder::Gzip(g) => {
                    g.write_all(b).unwrap();
                    file.append(g.get_mut());
                }
                Encoder::Zstd(z) => {
                    z.write_all(b).unwrap();
                    file.append(z.get_mut());
                }
            }
        }
        file.extend(match e {
            Encoder::Gzip(g) => g.finish().unwrap(),
            Encoder::Zstd(z) => z.finish().unwrap(),
        });
        let mut text = Vec::new();
        match c {
            TextCompression::Gzip => {
                flate2::read::MultiGzDecoder::new(&file[..])
                    .read_to_end(&mut text)
                    .unwrap();
            }
            _ => {
                zstd::stream::read::Decoder::new(&file[..])
                    .unwrap()
                    .read_to_end(&mut text)
                    .unwrap();
            }
        }
        text
    }

    #[test]
    fn blocks_drained_as_they_come_make_one_stream() {
        for c in [TextCompression::Gzip, TextCompression::Zstd(3)] {
            let blocks: [&[u8]; 3] = [b"a,b\n", &[b'x'; 100_000], b"last\n"];
            assert_eq!(roundtrip(c, &blocks), blocks.concat());
        }
    }
}
