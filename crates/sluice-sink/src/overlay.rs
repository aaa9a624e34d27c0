//! The keys a converged export saw change (its *overlay*), within a budget of memory.
//!
//! A converged run remembers the key of every row changed from its start C until its end
//! point T — on a big, busy table, millions of keys. [`Overlay`] keeps them in memory (one
//! byte string per key, spelled as [`keytext::encode`] spells it) until its owner says they
//! take too much, then writes them sorted to a file in a temporary directory ([`Overlay::spill`])
//! and starts again empty. [`Overlay::freeze`] merges everything so far into one sorted file
//! ([`Run`]) — the set an end point hands over — which the overlay itself goes on from.
//!
//! A [`Run`] keeps in memory only a filter (parquet's split-block Bloom filter, about 1.2
//! bytes a key at 1 % false positives) and every [`INDEX_EVERY`]th key with its offset (about
//! 2 % of the keys' bytes). A part's rewrite asks the filter first for every row (no disk read
//! for the rows nobody changed, which is almost all of them), then reads one block of the file
//! for the rest; the delta read takes the keys in slices ([`Run::keys`]) as its chunks start.
//! Why by hand: no maintained crate keeps a set of byte strings on disk with this read
//! pattern; the filter is parquet's.
//!
//! Files are `[u32 length][key]`, ascending, without duplicates, and removed with the
//! directory (or the [`Run`]) when dropped.

use parquet::bloom_filter::Sbbf;
use sluice_core::keytext::{self, KeyLookup};
use sluice_core::{Error, Result};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use xxhash_rust::xxh3::Xxh3DefaultBuilder;

/// Keys between two entries of a [`Run`]'s index: a lookup the filter lets through reads at
/// most this many keys.
pub const INDEX_EVERY: u64 = 50;
/// The filter's false positives: rows that cost a block read though no key matches.
const FALSE_POSITIVES: f64 = 0.01;
/// What a key takes in memory besides its bytes: the hash set's slot and the box.
const ENTRY_BYTES: u64 = 40;
/// Spilled files kept before a spill merges them into one: a hot set of keys changed again
/// and again is written again by every spill, and each file holds a descriptor, a filter and
/// an index until the merge.
const MAX_RUNS: usize = 8;
/// The read buffer of each file a merge reads.
const MERGE_BUFFER: usize = 64 << 10;

/// A spill file's I/O failed: on the local disk, not the output's.
/// Keys in ascending order, or why the next could not be read.
type Keys<'a> = Box<dyn Iterator<Item = Result<Box<[u8]>>> + 'a>;

fn io(what: &str, e: std::io::Error) -> Error {
    Error::destination(
        sluice_core::Retry::Permanent,
        format!(
            "the converged run's changed keys could not be kept on disk ({what}: {e}); they go \
             to the temporary directory ({}): point TMPDIR at a disk with room, or raise \
             --memory so fewer spill.",
            std::env::temp_dir().display()
        ),
    )
}

/// Changed keys of one dataset: in memory, and in sorted files past the owner's budget.
pub struct Overlay {
    memory: HashSet<Box<[u8]>, Xxh3DefaultBuilder>,
    bytes: u64,
    runs: Vec<Arc<Run>>,
    dir: Arc<tempfile::TempDir>,
}

impl Overlay {
    /// An empty overlay whose files go to `dir`.
    pub fn new(dir: Arc<tempfile::TempDir>) -> Overlay {
        Overlay {
            memory: HashSet::with_hasher(Xxh3DefaultBuilder),
            bytes: 0,
            runs: Vec::new(),
            dir,
        }
    }

    /// Add a key (as [`keytext::encode`] spells it). A key already in memory is counted
    /// once; one already spilled is kept again, once more, until the next merge.
    pub fn insert(&mut self, key: Vec<u8>) {
        let size = key.len() as u64 + ENTRY_BYTES;
        if self.memory.insert(key.into_boxed_slice()) {
            self.bytes += size;
        }
    }

    /// What the keys held in memory take, about.
    pub fn memory_bytes(&self) -> u64 {
        self.bytes
    }

    /// Keys written to files so far (before their duplicates are merged away).
    pub fn spilled(&self) -> u64 {
        self.runs.iter().map(|r| r.len).sum()
    }

    /// Write the keys held in memory to a sorted file, and free their memory. Past
    /// eight files (`MAX_RUNS`), the new one is merged with them all into one.
    pub fn spill(&mut self) -> Result<()> {
        if self.memory.is_empty() {
            return Ok(());
        }
        if self.runs.len() >= MAX_RUNS {
            return self.merge_all().map(drop);
        }
        let keys = self.sorted_memory();
        let run = Run::write(self.dir.path(), keys.len() as u64, keys.iter().map(Ok));
        let run = self.kept(keys, run)?;
        self.runs.push(Arc::new(run));
        Ok(())
    }

    /// Every key added so far, as one sorted file without duplicates; the overlay goes on from
    /// it (its memory emptied), so a later freeze holds these keys too.
    pub fn freeze(&mut self) -> Result<Arc<Run>> {
        self.merge_all()
    }

    /// Memory and every file merged into one file, which replaces them.
    fn merge_all(&mut self) -> Result<Arc<Run>> {
        let memory = self.sorted_memory();
        let bound = memory.len() as u64 + self.spilled();
        let merged = {
            let mut sources: Vec<Keys<'_>> = vec![Box::new(memory.iter().map(|k| Ok(k.clone())))];
            for run in &self.runs {
                sources.push(Box::new(run.iter()?));
            }
            Run::write(self.dir.path(), bound, merge(sources))
        };
        let merged = Arc::new(self.kept(memory, merged)?);
        self.runs = vec![merged.clone()];
        Ok(merged)
    }

    /// The keys held in memory, sorted, their set's memory freed (capacity included).
    fn sorted_memory(&mut self) -> Vec<Box<[u8]>> {
        let mut keys: Vec<Box<[u8]>> = std::mem::take(&mut self.memory).into_iter().collect();
        self.bytes = 0;
        keys.sort_unstable();
        keys
    }

    /// `written` if it was; else the keys go back to memory (none is lost to a failed write:
    /// a caller that tries again still has them) and the error is returned.
    fn kept(&mut self, keys: Vec<Box<[u8]>>, written: Result<Run>) -> Result<Run> {
        if written.is_err() {
            for k in keys {
                self.insert(k.into_vec());
            }
        }
        written
    }
}

/// Sorted sources merged into one ascending sequence without duplicates.
fn merge(mut sources: Vec<Keys<'_>>) -> impl Iterator<Item = Result<Box<[u8]>>> + '_ {
    let mut heap = BinaryHeap::new();
    let mut failed = None;
    for (i, s) in sources.iter_mut().enumerate() {
        match s.next() {
            Some(Ok(k)) => heap.push(Reverse((k, i))),
            Some(Err(e)) => failed = Some(e),
            None => {}
        }
    }
    let mut last: Option<Box<[u8]>> = None;
    std::iter::from_fn(move || {
        if let Some(e) = failed.take() {
            return Some(Err(e));
        }
        loop {
            let Reverse((key, i)) = heap.pop()?;
            match sources[i].next() {
                Some(Ok(k)) => heap.push(Reverse((k, i))),
                Some(Err(e)) => return Some(Err(e)),
                None => {}
            }
            if last.as_ref() != Some(&key) {
                last = Some(key.clone());
                return Some(Ok(key));
            }
        }
    })
}

/// A sorted file of keys without duplicates, with its filter and index in memory.
pub struct Run {
    file: tempfile::NamedTempFile,
    /// Keys in the file.
    len: u64,
    /// Bytes of the file.
    end: u64,
    /// Every [`INDEX_EVERY`]th key, from the first, and where it starts.
    index: Vec<(Box<[u8]>, u64)>,
    filter: Sbbf,
}

impl Run {
    /// Write `keys` (ascending, no duplicates; at most `bound` of them) to a file in `dir`.
    fn write<K: AsRef<[u8]>>(
        dir: &Path,
        bound: u64,
        keys: impl Iterator<Item = Result<K>>,
    ) -> Result<Run> {
        let file = tempfile::NamedTempFile::new_in(dir).map_err(|e| io("create", e))?;
        let mut filter = Sbbf::new_with_ndv_fpp(bound.max(1), FALSE_POSITIVES)
            .map_err(|e| Error::internal(format!("the changed keys' filter: {e}")))?;
        let (mut len, mut end, mut index) = (0u64, 0u64, Vec::new());
        {
            let mut out = BufWriter::with_capacity(1 << 20, file.as_file());
            for key in keys {
                let key = key?;
                let key = key.as_ref();
                let size = u32::try_from(key.len())
                    .map_err(|_| Error::internal("a changed key of more than 4 GB"))?;
                if len % INDEX_EVERY == 0 {
                    index.push((Box::from(key), end));
                }
                filter.insert(key);
                out.write_all(&size.to_le_bytes())
                    .and_then(|()| out.write_all(key))
                    .map_err(|e| io("write", e))?;
                len += 1;
                end += 4 + u64::from(size);
            }
            out.flush().map_err(|e| io("write", e))?;
        }
        Ok(Run {
            file,
            len,
            end,
            index,
            filter,
        })
    }

    /// How many keys.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when it holds no key.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `key` (spelled as [`keytext::encode`] spells it) is in the file.
    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        if !self.filter.check(key) {
            return Ok(false);
        }
        // The last index entry at or before the key: its block holds the key if any does.
        let at = self
            .index
            .partition_point(|(first, _)| first.as_ref() <= key);
        let Some(entry) = at.checked_sub(1) else {
            return Ok(false);
        };
        let from = self.index[entry].1;
        let to = self.index.get(entry + 1).map_or(self.end, |e| e.1);
        let block = self.read(from, to)?;
        Ok(Block(&block).any(|k| k == key))
    }

    /// Keys `from..from + n` in order (fewer at the end), as texts: a delta chunk's.
    pub fn keys(&self, from: u64, n: usize) -> Result<Vec<Vec<String>>> {
        let entry = (from / INDEX_EVERY) as usize;
        let Some(&(_, start)) = self.index.get(entry) else {
            return Ok(Vec::new());
        };
        let last = (from + n as u64).div_ceil(INDEX_EVERY) as usize;
        let stop = self.index.get(last).map_or(self.end, |e| e.1);
        let block = self.read(start, stop)?;
        Block(&block)
            .skip((from % INDEX_EVERY) as usize)
            .take(n)
            .map(keytext::decode)
            .collect()
    }

    fn read(&self, from: u64, to: u64) -> Result<Vec<u8>> {
        let mut buf = vec![0; (to - from) as usize];
        self.file
            .as_file()
            .read_exact_at(&mut buf, from)
            .map_err(|e| io("read", e))?;
        Ok(buf)
    }

    /// Every key in order, read through a handle of its own.
    fn iter(&self) -> Result<impl Iterator<Item = Result<Box<[u8]>>> + 'static> {
        let file = self.file.reopen().map_err(|e| io("open", e))?;
        let mut input = BufReader::with_capacity(MERGE_BUFFER, file);
        let mut left = self.len;
        Ok(std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            left -= 1;
            let mut size = [0u8; 4];
            let read = input.read_exact(&mut size).and_then(|()| {
                let mut key = vec![0; u32::from_le_bytes(size) as usize];
                input.read_exact(&mut key).map(|()| key.into_boxed_slice())
            });
            Some(read.map_err(|e| io("read", e)))
        }))
    }
}

impl KeyLookup for Run {
    fn rows_in(&self, batch: &arrow_array::RecordBatch, columns: &[usize]) -> Result<Vec<bool>> {
        if self.is_empty() {
            return Ok(vec![false; batch.num_rows()]);
        }
        keytext::rows_matching(batch, columns, |key| self.contains(key))
    }
}

/// The keys of a block read from a run file.
struct Block<'a>(&'a [u8]);

impl<'a> Iterator for Block<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let (size, rest) = self.0.split_at_checked(4)?;
        let size = u32::from_le_bytes(size.try_into().ok()?) as usize;
        let (key, rest) = rest.split_at_checked(size)?;
        self.0 = rest;
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int64Array, RecordBatch};

    fn key(i: u64) -> Vec<String> {
        vec![format!("k{i}"), (i % 7).to_string()]
    }

    fn dir() -> Arc<tempfile::TempDir> {
        Arc::new(tempfile::tempdir().unwrap())
    }

    #[test]
    fn spilled_and_frozen_keys_are_found_once_each() {
        let mut o = Overlay::new(dir());
        for i in 0..1000 {
            o.insert(keytext::encode(&key(i)));
            if i % 30 == 29 {
                o.spill().unwrap();
                assert_eq!(o.memory_bytes(), 0);
            }
        }
        // Spills past the limit merge their files into one.
        assert!(o.runs.len() <= MAX_RUNS, "{} files", o.runs.len());
        // Keys seen again, some already on disk.
        for i in 500..1200 {
            o.insert(keytext::encode(&key(i)));
        }
        let run = o.freeze().unwrap();
        assert_eq!(run.len(), 1200);
        for i in 0..1200 {
            assert!(run.contains(&keytext::encode(&key(i))).unwrap(), "{i}");
        }
        for i in 1200..3000 {
            assert!(!run.contains(&keytext::encode(&key(i))).unwrap(), "{i}");
        }
        // Slices in order, every key once, across index entries.
        let mut all = Vec::new();
        let mut from = 0;
        while from < run.len() {
            let slice = run.keys(from, 77).unwrap();
            assert!(!slice.is_empty());
            from += slice.len() as u64;
            all.extend(slice);
        }
        let mut want: Vec<Vec<String>> = (0..1200).map(key).collect();
        want.sort_by_key(|k| keytext::encode(k));
        assert_eq!(all, want);
        // The overlay goes on from what it froze.
        o.insert(keytext::encode(&key(5000)));
        let again = o.freeze().unwrap();
        assert_eq!(again.len(), 1201);
        assert!(run.len() == 1200, "the first frozen set is unchanged");
    }

    #[test]
    fn rows_of_a_batch_are_looked_up() {
        let mut o = Overlay::new(dir());
        for i in [3i64, 9, 12] {
            o.insert(keytext::encode(&[i.to_string()]));
        }
        let empty = Overlay::new(dir()).freeze().unwrap();
        let run = o.freeze().unwrap();
        let batch = RecordBatch::try_from_iter([(
            "id",
            Arc::new(Int64Array::from(vec![1, 3, 12, 13])) as ArrayRef,
        )])
        .unwrap();
        assert_eq!(
            run.rows_in(&batch, &[0]).unwrap(),
            [false, true, true, false]
        );
        assert_eq!(empty.rows_in(&batch, &[0]).unwrap(), [false; 4]);
        assert!(empty.keys(0, 10).unwrap().is_empty());
    }
}
