//! The Raft log's entries, in segment files: one write and one `fdatasync` per append.
//!
//! `<data_dir>/wal/<first index, 20 digits>.seg`, integers little-endian:
//!
//! ```text
//! header  "CONCHWL1" | first index u64                       16 bytes
//! record  len u32 | bincode(entry) ++ fnv1a64(bincode(entry))  one per entry, consecutive indexes
//! zeros   to the end of the file
//! ```
//!
//! A segment is created sparse, [`SEGMENT_BYTES`] long, so appends write inside the file and its
//! size never changes while it fills: the `fdatasync` after each append then has no file size to
//! record (on ext4 an append that extends the file costs about a third more to sync). A record
//! whose length is 0 ends the segment.
//!
//! Invariants:
//! - the records of a segment hold consecutive indexes from the header's first index; a
//!   segment's first index is one past the previous segment's last
//! - every segment but the last is complete: an append writes its whole batch into the last
//!   segment with one write and syncs it before returning, and a segment is only started by an
//!   append, after the previous append was synced
//! - past the last record of the last segment the file reads as zeros: `truncate` and [`Wal::repair`]
//!   cut the file there and re-extend it sparse, so stale records never follow a new one
//! - a new segment's header is synced, and its directory entry too, before a record goes in
//!
//! Recovery ([`Wal::open`]): every record is decoded and its index checked. A damaged or
//! incomplete record in the last segment is a write torn by a crash: it and everything after it
//! were never acknowledged, and [`Wal::repair`] clears them once the caller has checked that
//! nothing acknowledged was lost (the `log-end` record, see `log_store`). Damage anywhere else,
//! a hole between segments, or a record under the wrong index refuses the open.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use openraft::Entry;

use super::TypeConfig;
use super::codec::{decode_value, encode_value};

/// The size a segment is created with; an append that starts past it opens a new segment.
///
/// A purge deletes only whole segments, so the log keeps up to one segment of entries that a
/// snapshot already covers, plus the sparse rest of the last one: small segments keep the data
/// directory close to the snapshot plus the retained log. Starting a segment costs one file
/// creation and two syncs, once per 4 MiB of log (every few seconds at the highest write rates).
pub(crate) const SEGMENT_BYTES: u64 = 4 * 1024 * 1024;

const MAGIC: &[u8; 8] = b"CONCHWL1";
const HEADER_BYTES: u64 = 16;
const LEN_BYTES: usize = 4;
const SUFFIX: &str = ".seg";

fn fsync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

fn segment_name(first: u64) -> String {
    format!("{first:020}{SUFFIX}")
}

/// Cuts `file` at `at` and extends it back to `len` bytes sparse (zeros), durably.
fn clear_from(file: &File, at: u64, len: u64) -> io::Result<()> {
    file.set_len(at)?;
    file.set_len(len.max(at))?;
    file.sync_all()
}

struct Segment {
    first: u64,
    path: PathBuf,
    file: File,
    /// Byte offset of each record: record `i` holds index `first + i`.
    offsets: Vec<u64>,
    /// Byte offset just past the last record.
    end: u64,
}

impl Segment {
    fn next_index(&self) -> u64 {
        self.first + self.offsets.len() as u64
    }

    fn last(&self) -> Option<u64> {
        (!self.offsets.is_empty()).then(|| self.next_index() - 1)
    }
}

/// What [`Wal::open`] read.
pub(crate) struct Recovered {
    /// The entries after the purge point, in order.
    pub entries: Vec<Entry<TypeConfig>>,
    /// The index of the last entry in the segments (purged or not).
    pub last_index: Option<u64>,
    /// A torn write found at the end of the last segment, described for the log.
    pub torn_tail: Option<String>,
}

/// What one [`Wal::append`] did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Appended {
    /// How long the `fdatasync` took.
    pub synced: Duration,
    /// Bytes of the records written.
    pub bytes: u64,
}

/// What [`Wal::repair`] clears.
enum Torn {
    /// The last segment's bytes from this offset on.
    Clear(u64),
    /// A last segment without a single whole record (or without a whole header).
    Remove(PathBuf),
}

/// The segment files of one log. Not shared: the log store serialises access.
pub(crate) struct Wal {
    dir: PathBuf,
    segments: Vec<Segment>,
    segment_bytes: u64,
    sync: bool,
    /// A torn tail found by `open`, until `repair`.
    torn: Option<Torn>,
    /// Set when a write failed part way: the file may hold bytes past `end`, so no further
    /// append is accepted (the node stops on the storage error anyway).
    failed: bool,
}

impl Wal {
    /// Opens (creating if needed) the segments under `dir`, reading every entry. Entries up to
    /// `purged` are checked but not returned. `sync: false` skips `fdatasync` (throwaway data).
    pub(crate) fn open(
        dir: &Path,
        purged: Option<u64>,
        segment_bytes: u64,
        sync: bool,
    ) -> Result<(Wal, Recovered), String> {
        if !dir.exists() {
            fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
            for d in [Some(dir), dir.parent()].into_iter().flatten() {
                fsync_dir(d).map_err(|e| format!("sync {}: {e}", d.display()))?;
            }
        }
        let mut names = Vec::new();
        let listing = fs::read_dir(dir).map_err(|e| format!("list {}: {e}", dir.display()))?;
        for item in listing {
            let item = item.map_err(|e| format!("list {}: {e}", dir.display()))?;
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(stem) = name.strip_suffix(SUFFIX) else {
                continue;
            };
            let first = stem
                .parse::<u64>()
                .ok()
                .filter(|_| stem.len() == 20)
                .ok_or_else(|| format!("{}: not a segment name", item.path().display()))?;
            names.push(first);
        }
        names.sort_unstable();

        let mut wal = Wal {
            dir: dir.to_path_buf(),
            segments: Vec::with_capacity(names.len()),
            segment_bytes,
            sync,
            torn: None,
            failed: false,
        };
        let mut recovered = Recovered {
            entries: Vec::new(),
            last_index: None,
            torn_tail: None,
        };
        let count = names.len();
        for (position, first) in names.into_iter().enumerate() {
            let is_last = position + 1 == count;
            let path = dir.join(segment_name(first));
            let bytes = fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
            let header_ok = bytes.len() as u64 >= HEADER_BYTES
                && &bytes[..8] == MAGIC
                && bytes[8..16] == first.to_le_bytes();
            if !header_ok {
                // Only a segment created by a crashed append, before its header was synced and
                // before any record went in, may look like this.
                if is_last && bytes.iter().skip(HEADER_BYTES as usize).all(|b| *b == 0) {
                    recovered.torn_tail = Some(format!("{}: torn header", path.display()));
                    wal.torn = Some(Torn::Remove(path));
                    continue;
                }
                return Err(format!("{}: damaged segment header", path.display()));
            }
            if let Some(previous) = wal.segments.last()
                && previous.next_index() != first
            {
                return Err(format!(
                    "hole in the log: {} starts at entry {first}, the previous segment ends at \
                     entry {}",
                    path.display(),
                    previous.next_index().saturating_sub(1)
                ));
            }
            let (offsets, end, torn) = read_records(&bytes, first, purged, &mut recovered.entries)
                .map_err(|reason| format!("{}: {reason}", path.display()))?;
            if let Some(reason) = torn {
                if !is_last {
                    return Err(format!("{}: {reason}", path.display()));
                }
                recovered.torn_tail = Some(format!("{}: {reason}", path.display()));
                wal.torn = Some(Torn::Clear(end));
            }
            if offsets.is_empty() {
                if !is_last {
                    return Err(format!("{}: empty segment before the last", path.display()));
                }
                // Started by an append that crashed before its records were durable.
                wal.torn = Some(Torn::Remove(path));
                continue;
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| format!("open {}: {e}", path.display()))?;
            wal.segments.push(Segment {
                first,
                path,
                file,
                offsets,
                end,
            });
        }
        recovered.last_index = wal.segments.last().and_then(Segment::last);
        let after_purge = purged.map_or(1, |p| p + 1);
        if let Some(first) = wal.segments.first().map(|s| s.first)
            && first > after_purge
            && recovered.last_index >= Some(after_purge)
        {
            return Err(format!(
                "hole in the log: the first entry is {first}, but the log is purged only up to \
                 {}",
                after_purge - 1
            ));
        }
        Ok((wal, recovered))
    }

    /// Clears a torn tail found by `open` (the caller has checked that it held nothing
    /// acknowledged), so that no stale byte follows the next append.
    pub(crate) fn repair(&mut self) -> io::Result<()> {
        match self.torn.take() {
            None => Ok(()),
            Some(Torn::Remove(path)) => {
                fs::remove_file(&path)?;
                fsync_dir(&self.dir)
            }
            Some(Torn::Clear(at)) => match self.segments.last() {
                Some(segment) => clear_from(&segment.file, at, self.segment_bytes),
                None => Ok(()),
            },
        }
    }

    /// Index the next append must start at, when the log holds entries.
    pub(crate) fn next_index(&self) -> Option<u64> {
        self.segments.last().map(Segment::next_index)
    }

    /// Bytes of the record of entry `index`, if the segments hold it.
    pub(crate) fn record_bytes(&self, index: u64) -> Option<u64> {
        let segment = self.segment_of(index)?;
        let i = usize::try_from(index - segment.first).ok()?;
        let at = *segment.offsets.get(i)?;
        let next = segment.offsets.get(i + 1).copied().unwrap_or(segment.end);
        Some(next - at)
    }

    fn segment_of(&self, index: u64) -> Option<&Segment> {
        let position = self.segments.partition_point(|s| s.first <= index);
        let segment = self.segments.get(position.checked_sub(1)?)?;
        (index < segment.next_index()).then_some(segment)
    }

    /// Reads the entries `start..=end` back from the segments (one read per segment), checking
    /// each record as `open` does. Indexes the segments do not hold are left out.
    pub(crate) fn read(&self, start: u64, end: u64) -> io::Result<Vec<Entry<TypeConfig>>> {
        let mut out = Vec::new();
        for segment in &self.segments {
            let Some(last) = segment.last() else { continue };
            let (from, to) = (start.max(segment.first), end.min(last));
            if from > to {
                continue;
            }
            let first = usize::try_from(from - segment.first).map_err(io::Error::other)?;
            let after = usize::try_from(to - segment.first).map_err(io::Error::other)? + 1;
            let at = segment.offsets[first];
            let until = segment.offsets.get(after).copied().unwrap_or(segment.end);
            let mut bytes = vec![0u8; usize::try_from(until - at).map_err(io::Error::other)?];
            segment.file.read_exact_at(&mut bytes, at)?;
            let mut offset = 0usize;
            for index in from..=to {
                let damaged = || {
                    io::Error::other(format!(
                        "{}: the record of entry {index} cannot be read back",
                        segment.path.display()
                    ))
                };
                let len_bytes = bytes.get(offset..offset + LEN_BYTES).ok_or_else(damaged)?;
                let mut len = [0u8; LEN_BYTES];
                len.copy_from_slice(len_bytes);
                let len = u32::from_le_bytes(len) as usize;
                let value = bytes
                    .get(offset + LEN_BYTES..offset + LEN_BYTES + len)
                    .ok_or_else(damaged)?;
                let entry: Entry<TypeConfig> = decode_value(value).map_err(|e| {
                    io::Error::other(format!(
                        "{}: record of entry {index}: {e}",
                        segment.path.display()
                    ))
                })?;
                if entry.log_id.index != index {
                    return Err(damaged());
                }
                out.push(entry);
                offset += LEN_BYTES + len;
            }
        }
        Ok(out)
    }

    /// Bytes of headers and records in all segments.
    pub(crate) fn bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.end).sum()
    }

    /// Appends `entries` (consecutive, following the log's last entry) with one write and, when
    /// syncing, one `fdatasync`.
    pub(crate) fn append(&mut self, entries: &[Entry<TypeConfig>]) -> io::Result<Appended> {
        let Some(head) = entries.first() else {
            return Ok(Appended::default());
        };
        if self.failed {
            return Err(io::Error::other(
                "an earlier write to the log failed; restart the node",
            ));
        }
        let first = head.log_id.index;
        if let Some(next) = self.next_index()
            && next != first
        {
            return Err(io::Error::other(format!(
                "append of entry {first} does not follow the log's last entry {}",
                next.saturating_sub(1)
            )));
        }
        let mut buf = Vec::new();
        let mut relative = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            if entry.log_id.index != first + i as u64 {
                return Err(io::Error::other(format!(
                    "append of entries that are not consecutive: {} at position {i}",
                    entry.log_id.index
                )));
            }
            let value = encode_value(entry).map_err(io::Error::other)?;
            let len = u32::try_from(value.len())
                .map_err(|_| io::Error::other(format!("entry {} too large", entry.log_id)))?;
            relative.push(buf.len() as u64);
            buf.extend_from_slice(&len.to_le_bytes());
            buf.extend_from_slice(&value);
        }
        let full = self
            .segments
            .last()
            .is_none_or(|s| s.end >= self.segment_bytes);
        if full {
            self.create_segment(first)?;
        }
        let sync = self.sync;
        let Some(segment) = self.segments.last_mut() else {
            return Err(io::Error::other("no segment to append to"));
        };
        let at = segment.end;
        let dir = &self.dir;
        crate::sim_hooks::disk_faults::before_write(&segment.file, &segment.path, at, buf.len());
        let written = segment.file.write_all_at(&buf, at).and_then(|()| {
            let started = Instant::now();
            if let Some(e) = crate::sim_hooks::disk_faults::injected(dir) {
                return Err(e);
            }
            if sync {
                segment.file.sync_data()?;
                crate::sim_hooks::disk_faults::synced(&segment.path);
            }
            Ok(started.elapsed())
        });
        let synced = match written {
            Ok(synced) => synced,
            Err(e) => {
                self.failed = true;
                return Err(e);
            }
        };
        segment.offsets.extend(relative.into_iter().map(|r| at + r));
        segment.end = at + buf.len() as u64;
        Ok(Appended {
            synced,
            bytes: buf.len() as u64,
        })
    }

    fn create_segment(&mut self, first: u64) -> io::Result<()> {
        let path = self.dir.join(segment_name(first));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let mut header = [0u8; HEADER_BYTES as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..].copy_from_slice(&first.to_le_bytes());
        file.write_all_at(&header, 0)?;
        file.set_len(self.segment_bytes.max(HEADER_BYTES))?;
        file.sync_all()?;
        fsync_dir(&self.dir)?;
        self.segments.push(Segment {
            first,
            path,
            file,
            offsets: Vec::new(),
            end: HEADER_BYTES,
        });
        Ok(())
    }

    /// Removes the entries from `index` on, durably: later segments go first (a crash between
    /// steps leaves a shorter prefix of segments, never a hole), then the tail of the segment
    /// holding `index` is cleared.
    pub(crate) fn truncate(&mut self, index: u64) -> io::Result<()> {
        let mut removed = false;
        while let Some(segment) = self.segments.last() {
            if segment.first < index {
                break;
            }
            fs::remove_file(&segment.path)?;
            self.segments.pop();
            removed = true;
        }
        if removed {
            fsync_dir(&self.dir)?;
        }
        if let Some(segment) = self.segments.last_mut()
            && index < segment.next_index()
        {
            let keep = usize::try_from(index - segment.first).unwrap_or(usize::MAX);
            let at = segment.offsets[keep];
            clear_from(&segment.file, at, self.segment_bytes)?;
            segment.offsets.truncate(keep);
            segment.end = at;
        }
        Ok(())
    }

    /// How many segments hold only entries up to `index` (what `purge(index)` deletes).
    pub(crate) fn purgeable(&self, index: u64) -> usize {
        self.segments
            .iter()
            .take_while(|s| s.last().is_some_and(|last| last <= index))
            .count()
    }

    /// Deletes the segments that hold only entries up to `index`. The caller makes the purge
    /// point durable first: a segment deleted under a lost purge point is a hole.
    pub(crate) fn purge(&mut self, index: u64) -> io::Result<()> {
        let count = self.purgeable(index);
        if count == 0 {
            return Ok(());
        }
        for segment in self.segments.drain(..count) {
            fs::remove_file(&segment.path)?;
        }
        fsync_dir(&self.dir)
    }
}

type ReadRecords = (Vec<u64>, u64, Option<String>);

/// Reads the records of one segment: their offsets, the offset past the last good one, and
/// why reading stopped early (a torn or damaged record) if it did. Entries after `purged` are
/// pushed to `out`. A record under the wrong index is an error.
fn read_records(
    bytes: &[u8],
    first: u64,
    purged: Option<u64>,
    out: &mut Vec<Entry<TypeConfig>>,
) -> Result<ReadRecords, String> {
    let mut offsets = Vec::new();
    let mut at = HEADER_BYTES as usize;
    loop {
        let expected = first + offsets.len() as u64;
        let Some(len_bytes) = bytes.get(at..at + LEN_BYTES) else {
            return Ok((offsets, at as u64, None));
        };
        let mut len = [0u8; LEN_BYTES];
        len.copy_from_slice(len_bytes);
        let len = u32::from_le_bytes(len) as usize;
        if len == 0 {
            return Ok((offsets, at as u64, None));
        }
        let Some(value) = bytes.get(at + LEN_BYTES..at + LEN_BYTES + len) else {
            let reason = format!("record of entry {expected} at offset {at} is cut short");
            return Ok((offsets, at as u64, Some(reason)));
        };
        let entry: Entry<TypeConfig> = match decode_value(value) {
            Ok(entry) => entry,
            Err(e) => {
                let reason = format!("record of entry {expected} at offset {at}: {e}");
                return Ok((offsets, at as u64, Some(reason)));
            }
        };
        if entry.log_id.index != expected {
            return Err(format!(
                "the record at offset {at} holds entry {}, expected entry {expected}",
                entry.log_id.index
            ));
        }
        if purged.is_none_or(|p| entry.log_id.index > p) {
            out.push(entry);
        }
        offsets.push(at as u64);
        at += LEN_BYTES + len;
    }
}

#[cfg(test)]
mod tests;
