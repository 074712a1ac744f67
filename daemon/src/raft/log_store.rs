//! The Raft log and vote: entries in segment files, the vote and the log's metadata in sled.
//!
//! - `<data_dir>/wal/` holds the entries, one record per entry, in segment files (see
//!   [`super::wal`]): an append is one write and one `fdatasync`.
//! - `<data_dir>/raft/` is a sled `Db` with one tree of metadata:
//!   `m:vote`, `m:committed`, `m:purged` -> the vote, the last committed log id, the purge point;
//!   `m:format` -> the newest data format the entries and snapshots may be in, and `m:release`
//!   -> the release that wrote that marker. A new store records 0.1.0's format (7); the append
//!   of an entry that raises the cluster version records that version's format first (synced
//!   before the entry is written), so a release that cannot read the entries refuses the
//!   directory in one line before decoding anything. `open` reads every format from 0.1.0's to
//!   this build's as it is (nothing is converted in place: an older release can read the
//!   directory again until the cluster version moves on); a store with data and no marker was
//!   written by format 1, a development format before 0.1.0, and is refused.
//!   Stores written before the segment files kept the entries in sled too, under `e` + big-endian
//!   index; `open` moves them into segments once (see [`migrate_sled_entries`]).
//! - `<data_dir>/vote` and `<data_dir>/log-end`: copies of the vote and of the durable end of the
//!   log outside both, compared at open (see [`write_vote_file`], [`LogEnd`]).
//!
//! Every value is `bincode(value) ++ fnv1a64(bincode(value))` (little-endian), so a damaged value
//! is reported as an error instead of decoding into something else.
//!
//! The newest entries are also kept in memory, where the log reader finds them without a read:
//! up to [`MEM_LOG_BYTES`] of their records (always the last entry). Older entries after the
//! purge point (a lagging follower's, or the log between snapshots) are read back from the
//! segments when asked for, so memory does not grow with the log kept between snapshots.
//!
//! Invariants:
//! - `log-end` never names an index beyond the end of the log (the last entry, or the purge
//!   point when no entry follows it); `open` refuses a log that ends before it, because entries
//!   that were acknowledged are missing
//! - the entries form one run of consecutive indexes that covers the entry after the purge point
//!   (no holes); `open` checks this and refuses a log that breaks it
//! - an acknowledged append or vote is on disk
//!
//! Ordering. openraft issues every write from one task, one at a time.
//!
//! `append(entries, callback)`:
//! 1. encode every entry into ONE buffer, written into the last segment with one `pwrite`
//! 2. durability step ([`Durability::Fsync`]): ONE `fdatasync` of that segment (survives power
//!    loss). Steps 1-3 run on the calling thread, not on tokio's blocking pool: openraft's core
//!    waits for the append either way, and handing it to another thread costs two thread
//!    switches per append (W1 with one client went 14 % faster without them)
//! 3. record the new end of the log in `<data_dir>/log-end` (a write into the page cache, not
//!    synced: it may lag the log, never lead it)
//! 4. the entries become readable by every `LogStore` clone (the log reader)
//! 5. `callback.log_io_completed(Ok(()))`, then return
//!
//! One sync per call, never one per entry; openraft hands a follower up to
//! `max_payload_entries` entries per call.
//!
//! `save_vote`: sled insert, sled flush, `fdatasync` of sled's file, then the vote file; return =
//! durable (there is no callback).
//!
//! `truncate(id)` first lowers `log-end` to `id.index - 1` and syncs it, then removes
//! `[id.index, ..)` from the segments, durably (rare: conflicts only). A crash between leaves
//! `log-end` behind the log, which open accepts.
//!
//! `purge(id)` writes the purge point, then deletes the segments that hold only entries up to
//! it. When a segment goes, or the purge point passes the end of the log (a snapshot installed
//! beyond it, after which appends start at the snapshot), the purge point is made durable first
//! (a deleted segment, or entries appended after a gap, under a lost purge point would be a
//! hole); otherwise it is not flushed: losing it in a crash only brings back entries that a
//! snapshot already covers.
//!
//! `save_committed` inserts without a flush: a committed id that is lost only means less is
//! re-applied on restart, and it is never ahead of the log, whose entries were synced before.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::fs::File;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, Entry, EntryPayload, OptionalSend, RaftLogReader, StorageIOError, Vote};
use serde::de::DeserializeOwned;

use super::codec::{decode_value, encode_value};
use super::early::EarlyReplication;
use super::wal::{SEGMENT_BYTES, Wal};
use super::{LogId, NodeId, StorageError, TypeConfig};
use crate::metrics::{LogMetrics, observe};
use crate::state::{Cmd, fnv1a64, version};
use crate::write_trace::Mark;

/// How many bytes the newest entries kept in memory may take (the last entry is kept whatever
/// its size), counted as [`held_bytes`] does. Replication and apply read entries just appended;
/// older ones come from the segment files.
pub const MEM_LOG_BYTES: u64 = 1024 * 1024;

/// What an entry whose record is `record` bytes long holds in memory, about: the record's worth
/// of strings plus the entry and its decoded commands themselves. A command is a few hundred
/// bytes as a value and about a hundred as a record, so counting records alone would let the
/// entries kept take five times their budget.
fn held_bytes(entry: &Entry<TypeConfig>, record: u64) -> u64 {
    let commands = match &entry.payload {
        EntryPayload::Normal(batch) => batch.cmds.capacity() * std::mem::size_of::<Cmd>(),
        _ => 0,
    };
    let own = std::mem::size_of::<Entry<TypeConfig>>() + commands;
    record.saturating_add(u64::try_from(own).unwrap_or(u64::MAX))
}

/// How many bytes of records one AppendEntries carries at most (one entry always, whatever its
/// size). openraft asks for up to `max_payload_entries` entries per call and gives each call one
/// heartbeat interval: a follower catching up on large entries (a flood of 10 kB semaphores batches
/// into entries of hundreds of kB) would otherwise be sent tens of megabytes at once, a call that
/// cannot finish in time on a busy machine, is retried as large, and never lets it catch up.
pub const REPLICATION_BATCH_BYTES: u64 = 1024 * 1024;

/// sled's page cache size: sled holds only a few small values.
pub const CACHE_CAPACITY_BYTES: u64 = 8 * 1024 * 1024;

/// sled's background flush period. Votes and purges that delete a segment flush explicitly; this
/// only bounds how long a purge point or a committed id stays in memory.
pub const FLUSH_EVERY_MS: u64 = 1000;

const ENTRY_PREFIX: u8 = b'e';
const KEY_VOTE: &[u8] = b"m:vote";
const KEY_COMMITTED: &[u8] = b"m:committed";
const KEY_PURGED: &[u8] = b"m:purged";
const KEY_FORMAT: &[u8] = b"m:format";
const KEY_RELEASE: &[u8] = b"m:release";

/// The data formats this build reads: those of every kept release up to its own (see
/// `state/version.rs`).
const READ_FORMATS: std::ops::RangeInclusive<u32> =
    version::OLDEST_DATA_FORMAT..=version::NEWEST_DATA_FORMAT;

/// The data format an entry needs a reader to know: that of the cluster version it raises to,
/// if it raises one.
fn format_needed(entry: &Entry<TypeConfig>) -> Option<u32> {
    let EntryPayload::Normal(batch) = &entry.payload else {
        return None;
    };
    batch
        .cmds
        .iter()
        .filter_map(|cmd| match cmd.unwrapped() {
            Cmd::SetClusterVersion { version } => Some(version::data_format(*version)),
            _ => None,
        })
        .max()
}

/// How far an acknowledged write is made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// `fdatasync` of what was written: survives power loss. The default.
    Fsync,
    /// Appends are written but not synced (sled's flush still runs for the vote): survives a
    /// process crash, not necessarily power loss. For tests and benchmarks on throwaway data.
    #[allow(dead_code)]
    Flush,
}

/// Why the log store could not be opened. Each variant names the path at fault.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("create raft log directory {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("open raft log at {}: {source}", path.display())]
    Sled { path: PathBuf, source: sled::Error },
    #[error("open raft log at {}: sled panicked: {message}", path.display())]
    Panicked { path: PathBuf, message: String },
    #[error("open raft log data file {}: {source}", path.display())]
    DataFile { path: PathBuf, source: io::Error },
    #[error("raft log at {} is corrupt: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "{}: written by a development build of conch older than release 0.1.0 (data format \
         {found}); this build, conch {}, reads data formats {} to {}: it does not convert that \
         data, so start this node with an empty data directory (in a cluster, remove the node \
         and add it back empty)",
        path.display(),
        crate::release::RELEASE,
        READ_FORMATS.start(),
        READ_FORMATS.end()
    )]
    Format { path: PathBuf, found: u32 },
    #[error(
        "{}: written by conch {release} (data format {found}); this build, conch {}, reads data \
         formats {} to {}: run conch {release} or a later release on this directory",
        path.display(),
        crate::release::RELEASE,
        READ_FORMATS.start(),
        READ_FORMATS.end()
    )]
    Newer {
        path: PathBuf,
        found: u32,
        release: String,
    },
    #[error(
        "{}: in data format {found}; this node speaks cluster version {cluster_version_max} at \
         most and reads data formats {} to {reads}: run a release that speaks a newer cluster \
         version on this directory",
        path.display(),
        READ_FORMATS.start()
    )]
    Capped {
        path: PathBuf,
        found: u32,
        cluster_version_max: u32,
        reads: u32,
    },
}

impl OpenError {
    /// sled found its file locked: another process has the log open.
    pub fn is_locked(&self) -> bool {
        // sled 0.34 says so only in the message of an `io::ErrorKind::Other`.
        matches!(self, OpenError::Sled { source: sled::Error::Io(e), .. }
            if e.to_string().contains("could not acquire lock"))
    }
}

fn entry_key(index: u64) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[0] = ENTRY_PREFIX;
    key[1..].copy_from_slice(&index.to_be_bytes());
    key
}

fn index_of_key(key: &[u8]) -> Option<u64> {
    if key.len() != 9 || key[0] != ENTRY_PREFIX {
        return None;
    }
    let mut index = [0u8; 8];
    index.copy_from_slice(&key[1..]);
    Some(u64::from_be_bytes(index))
}

/// Decodes the entry stored under `key`, checking that it sits under its own index.
fn decode_entry(key: &[u8], value: &[u8]) -> Result<Entry<TypeConfig>, String> {
    let Some(index) = index_of_key(key) else {
        return Err(format!("unexpected key {key:?} among log entries"));
    };
    let entry: Entry<TypeConfig> =
        decode_value(value).map_err(|e| format!("log entry {index}: {e}"))?;
    if entry.log_id.index != index {
        return Err(format!(
            "log entry under index {index} carries index {}",
            entry.log_id.index
        ));
    }
    Ok(entry)
}

fn io_other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn fsync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// `<data_dir>/vote`: a second copy of the vote, outside sled. sled recovers silently from
/// damage by dropping what follows it, which could make a node forget its vote (and vote twice
/// in a term) or its whole log; comparing with this file at open turns that into a refusal.
fn vote_file_path(data_dir: &Path) -> PathBuf {
    data_dir.join("vote")
}

fn write_vote_file(data_dir: &Path, vote: &Vote<NodeId>) -> io::Result<()> {
    let bytes = encode_value(vote).map_err(io_other)?;
    let path = vote_file_path(data_dir);
    let tmp = path.with_extension("tmp");
    {
        let mut file = File::create(&tmp)?;
        io::Write::write_all(&mut file, &bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    fsync_dir(data_dir)
}

fn read_vote_file(data_dir: &Path) -> Result<Option<Vote<NodeId>>, String> {
    let path = vote_file_path(data_dir);
    match std::fs::read(&path) {
        Ok(bytes) => decode_value(&bytes)
            .map(Some)
            .map_err(|e| format!("vote file {}: {e}", path.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("read vote file {}: {e}", path.display())),
    }
}

/// `<data_dir>/log-end`: the index of the last log entry made durable, kept outside the segments.
///
/// Opening the segments treats a damaged last record as a write torn by a crash and drops it
/// and what follows. A node that lost entries it acknowledged (while keeping its vote) could help elect a leader without them and break Raft's
/// safety; comparing the log with this record at open turns that into a refusal.
///
/// The file has two 32-byte slots, written alternately: `seq | index | 0 | fnv1a64(first 24
/// bytes)`, little-endian. A torn write damages only the slot being written; the valid slot with
/// the highest `seq` is the record. Appends update it after their own durability step without a
/// sync (it may lag the log after a power loss, which is safe); `truncate` lowers it and syncs it
/// before removing entries.
struct LogEnd {
    file: File,
    path: PathBuf,
    /// Sequence number of the newest slot written, and the index it holds.
    last: Mutex<(u64, u64)>,
}

const LOG_END_SLOT_BYTES: usize = 32;

fn log_end_path(data_dir: &Path) -> PathBuf {
    data_dir.join("log-end")
}

fn encode_log_end_slot(seq: u64, index: u64) -> [u8; LOG_END_SLOT_BYTES] {
    let mut slot = [0u8; LOG_END_SLOT_BYTES];
    slot[..8].copy_from_slice(&seq.to_le_bytes());
    slot[8..16].copy_from_slice(&index.to_le_bytes());
    let checksum = fnv1a64(&slot[..24]);
    slot[24..].copy_from_slice(&checksum.to_le_bytes());
    slot
}

/// `(seq, index)` of a valid slot.
fn decode_log_end_slot(slot: &[u8]) -> Option<(u64, u64)> {
    if slot.len() != LOG_END_SLOT_BYTES {
        return None;
    }
    let word = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&slot[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    (word(24) == fnv1a64(&slot[..24]) && word(16) == 0).then(|| (word(0), word(8)))
}

impl LogEnd {
    /// Opens the record, or creates it holding `current_end` when absent (a data directory from
    /// before the record existed, or a new one). Returns the record and the index it held.
    fn open(data_dir: &Path, current_end: u64) -> Result<(LogEnd, Option<u64>), String> {
        let path = log_end_path(data_dir);
        let existed = path.exists();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut &file, &mut bytes)
            .map_err(|e| format!("read {}: {e}", path.display()))?;
        let newest = bytes
            .chunks(LOG_END_SLOT_BYTES)
            .take(2)
            .filter_map(decode_log_end_slot)
            .max_by_key(|(seq, _)| *seq);
        let record = match newest {
            Some(found) => Some(found),
            None if existed && !bytes.is_empty() => {
                return Err(format!(
                    "{} is damaged (no valid record of the log's end)",
                    path.display()
                ));
            }
            None => None,
        };
        let log_end = LogEnd {
            file,
            path,
            last: Mutex::new(record.unwrap_or((0, 0))),
        };
        if record.is_none() {
            log_end
                .write(current_end, true)
                .map_err(|e| format!("write {}: {e}", log_end.path.display()))?;
            fsync_dir(data_dir).map_err(|e| format!("sync {}: {e}", data_dir.display()))?;
        }
        Ok((log_end, record.map(|(_, index)| index)))
    }

    /// Records `index` as the end of the log; `sync` makes it durable before returning.
    fn write(&self, index: u64, sync: bool) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.1 == index && !sync && last.0 > 0 {
            return Ok(());
        }
        let seq = last.0.wrapping_add(1);
        let offset = (seq % 2) * LOG_END_SLOT_BYTES as u64;
        crate::disk_faults::before_write(&self.file, &self.path, offset, LOG_END_SLOT_BYTES);
        self.file
            .write_all_at(&encode_log_end_slot(seq, index), offset)?;
        if sync {
            self.file.sync_data()?;
            crate::disk_faults::synced(&self.path);
        }
        *last = (seq, index);
        Ok(())
    }
}

struct Inner {
    /// The metadata (vote, committed, purge point, format).
    db: sled::Db,
    /// `<raft>`, sled's directory, for messages.
    path: PathBuf,
    /// A second handle on sled's data file `<raft>/db`, only for `fdatasync`.
    data_file: File,
    /// The data directory, which holds the vote file.
    data_dir: PathBuf,
    durability: Durability,
    /// `<data_dir>/log-end`, the durable end of the log.
    log_end: LogEnd,
    /// The segment files; only the one task openraft writes from takes this lock.
    wal: Mutex<Wal>,
    /// What readers see: the newest entries, the last log id and the purge point.
    log: RwLock<MemLog>,
    /// The data format recorded in `m:format` (written only by the one task that appends).
    data_format: std::sync::atomic::AtomicU32,
    /// The newest cluster version this node speaks (see [`LogStore::speak_at_most`]).
    cluster_version_max: std::sync::atomic::AtomicU32,
}

#[derive(Default)]
struct MemLog {
    /// The newest entries, consecutive, ending with `last` (when the log holds entries after
    /// the purge point); those before them are in the segments only.
    entries: VecDeque<Entry<TypeConfig>>,
    /// The record size of each of `entries` and what it holds in memory ([`held_bytes`]).
    sizes: VecDeque<(u64, u64)>,
    /// The sum of what `entries` hold in memory.
    bytes: u64,
    /// The last entry of the log, when one follows the purge point.
    last: Option<LogId>,
    purged: Option<LogId>,
}

impl MemLog {
    /// The last entry, else the purge point (a purge clears `last` when it covers it).
    fn last_log_id(&self) -> Option<LogId> {
        self.last.or(self.purged)
    }

    /// Adds `entries` (following the last one) with their record sizes, then lets the oldest
    /// go past [`MEM_LOG_BYTES`].
    fn push(&mut self, entries: Vec<Entry<TypeConfig>>, sizes: impl Iterator<Item = u64>) {
        if let Some(last) = entries.last() {
            self.last = Some(last.log_id);
        }
        for (entry, record) in entries.into_iter().zip(sizes) {
            let held = held_bytes(&entry, record);
            self.entries.push_back(entry);
            self.sizes.push_back((record, held));
            self.bytes += held;
        }
        while self.bytes > MEM_LOG_BYTES && self.entries.len() > 1 {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        self.entries.pop_front();
        self.bytes -= self.sizes.pop_front().map_or(0, |(_, held)| held);
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.sizes.clear();
        self.bytes = 0;
        self.last = None;
    }

    fn first_cached(&self) -> Option<u64> {
        self.entries.front().map(|e| e.log_id.index)
    }
}

/// The Raft log and vote. Cheap to clone: clones share one store (the log reader is one).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Inner>,
    metrics: LogMetrics,
    /// The leader's sends to its followers before its own sync (see [`super::early`]).
    early: Arc<EarlyReplication>,
}

impl LogStore {
    /// Reports append timings and the commit index to `metrics` from now on.
    pub fn set_metrics(&mut self, metrics: LogMetrics) {
        self.metrics = metrics;
    }

    /// Hands every append on the leader to `early` before it is synced.
    pub fn set_early_replication(&mut self, early: Arc<EarlyReplication>) {
        self.early = early;
    }

    /// Opens (creating if needed) the log under `<data_dir>`, with [`Durability::Fsync`], and
    /// checks every stored value.
    pub fn open(data_dir: &Path) -> Result<LogStore, OpenError> {
        Self::open_with_durability(data_dir, Durability::Fsync)
    }

    /// Like [`LogStore::open`], choosing how far writes are made durable.
    pub fn open_with_durability(
        data_dir: &Path,
        durability: Durability,
    ) -> Result<LogStore, OpenError> {
        Self::open_with(data_dir, durability, SEGMENT_BYTES)
    }

    fn open_with(
        data_dir: &Path,
        durability: Durability,
        segment_bytes: u64,
    ) -> Result<LogStore, OpenError> {
        let path = data_dir.join("raft");
        std::fs::create_dir_all(&path).map_err(|source| OpenError::CreateDir {
            path: path.clone(),
            source,
        })?;
        // Make the directory entries themselves durable (first start).
        for dir in [data_dir, path.as_path()] {
            fsync_dir(dir).map_err(|source| OpenError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
        }

        let config = sled::Config::new()
            .path(&path)
            .cache_capacity(CACHE_CAPACITY_BYTES)
            .flush_every_ms(Some(FLUSH_EVERY_MS));
        // sled 0.34 panics on some kinds of damage instead of returning an error.
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| config.open()));
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(source)) => return Err(OpenError::Sled { path, source }),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
                    .unwrap_or_else(|| "unknown panic".to_string());
                return Err(OpenError::Panicked { path, message });
            }
        };

        let data_format = check_data_format(&db, &path)?;
        put_back_lost_values(&db, &path)?;

        let data_path = path.join("db");
        let data_file = File::open(&data_path).map_err(|source| OpenError::DataFile {
            path: data_path.clone(),
            source,
        })?;
        let corrupt = |path: &Path, reason: String| OpenError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };

        let purged = check_meta(&db).map_err(|reason| corrupt(&path, reason))?;
        let wal_dir = data_dir.join("wal");
        let migrated = migrate_sled_entries(&db, &data_file, &wal_dir)
            .map_err(|reason| corrupt(&path, reason))?;
        let (mut wal, recovered) = Wal::open(
            &wal_dir,
            purged.map(|p| p.index),
            segment_bytes,
            durability == Durability::Fsync,
        )
        .map_err(|reason| corrupt(&wal_dir, reason))?;
        let end_index = recovered
            .last_index
            .max(purged.map(|p| p.index))
            .unwrap_or(0);
        let (log_end, recorded_end) =
            LogEnd::open(data_dir, end_index).map_err(|reason| corrupt(&wal_dir, reason))?;
        if let Some(recorded) = recorded_end
            && recorded > end_index
        {
            let torn = recovered
                .torn_tail
                .map(|t| format!(" (the last record is damaged: {t})"))
                .unwrap_or_default();
            return Err(corrupt(
                &wal_dir,
                format!(
                    "it ends at index {end_index}, but entries up to {recorded} were made durable \
                     (recorded in {}){torn}: the log lost data and this node must not serve; \
                     restore the data directory or remove the node from the cluster and add it \
                     back empty",
                    log_end.path.display()
                ),
            ));
        }
        if let Some(torn) = &recovered.torn_tail {
            tracing::warn!(
                torn = %torn,
                "raft log ends with a write torn by a crash (never acknowledged); clearing it"
            );
        }
        wal.repair()
            .map_err(|e| corrupt(&wal_dir, format!("clear the torn tail: {e}")))?;

        let mut log = MemLog {
            purged,
            ..MemLog::default()
        };
        let sizes: Vec<u64> = recovered
            .entries
            .iter()
            .map(|e| wal.record_bytes(e.log_id.index).unwrap_or(0))
            .collect();
        log.push(recovered.entries, sizes.into_iter());
        let store = LogStore {
            metrics: LogMetrics::default(),
            early: EarlyReplication::off(),
            inner: Arc::new(Inner {
                db,
                path: path.clone(),
                data_dir: data_dir.to_path_buf(),
                data_file,
                durability,
                log_end,
                wal: Mutex::new(wal),
                log: RwLock::new(log),
                data_format: std::sync::atomic::AtomicU32::new(data_format),
                cluster_version_max: std::sync::atomic::AtomicU32::new(version::NEWEST),
            }),
        };
        store
            .check_vote_file()
            .map_err(|reason| corrupt(&path, reason))?;
        let log = store.read_log();
        tracing::debug!(
            path = %wal_dir.display(),
            entries_in_memory = log.entries.len(),
            migrated_from_sled = migrated,
            first_in_memory = ?log.first_cached(),
            last_index = ?log.last.map(|l| l.index),
            size_on_disk_bytes = store.size_on_disk(),
            "raft log opened"
        );
        drop(log);
        Ok(store)
    }

    fn read_log(&self) -> std::sync::RwLockReadGuard<'_, MemLog> {
        self.inner
            .log
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_log(&self) -> std::sync::RwLockWriteGuard<'_, MemLog> {
        self.inner
            .log
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Checks that the log continues where the state machine's snapshot ends: entries up to the
    /// purge point exist only inside a snapshot, so a purge point beyond `snapshot_last_applied`
    /// means the snapshot directory was lost or replaced. Call after both are opened and before
    /// `Raft::new`.
    pub fn check_snapshot_covers_purged(
        &self,
        snapshot_last_applied: Option<LogId>,
    ) -> Result<(), OpenError> {
        let purged = self.read_log().purged;
        let purged_index = purged.map(|p| p.index);
        let applied_index = snapshot_last_applied.map(|a| a.index);
        if purged_index > applied_index {
            return Err(OpenError::Corrupt {
                path: self.inner.path.clone(),
                reason: format!(
                    "log is purged up to {} but the newest snapshot ends at {}; \
                     the snapshot directory is missing or older than the log",
                    purged.map_or("none".to_string(), |p| p.to_string()),
                    snapshot_last_applied.map_or("none".to_string(), |a| a.to_string()),
                ),
            });
        }
        Ok(())
    }

    /// Makes a new, empty log begin after `last`, as if everything up to it had been compacted
    /// into a snapshot: records `last` as the purge point and as the end of the log, durably
    /// (`conchd restore` seeds a data directory this way, then installs the snapshot).
    // StorageError is openraft's type; its size is not ours to choose.
    #[allow(clippy::result_large_err)]
    pub async fn seed_purged(&self, last: LogId) -> Result<(), StorageError> {
        let value = encode_value(&last).map_err(|e| StorageIOError::write_logs(&e))?;
        self.inner
            .put_meta(KEY_PURGED, value)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.sync_meta(Some(last.index))
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        let mut log = self.write_log();
        log.clear();
        log.purged = Some(last);
        Ok(())
    }

    /// Compares sled's vote with the vote file: a vote in the file that sled does not have
    /// (or an older one in sled) means sled lost acknowledged writes.
    fn check_vote_file(&self) -> Result<(), String> {
        let in_file = read_vote_file(&self.inner.data_dir)?;
        let in_sled: Option<Vote<NodeId>> = self.read_meta(KEY_VOTE)?;
        match (in_file, in_sled) {
            (Some(file), None) => Err(format!(
                "it holds no vote, but {} records {file}: the log lost data and this node must \
                 not serve; restore the data directory or remove the node from the cluster and \
                 add it back empty",
                vote_file_path(&self.inner.data_dir).display()
            )),
            (Some(file), Some(sled)) if sled < file => Err(format!(
                "its vote {sled} is older than {file} recorded in {}: the log lost data",
                vote_file_path(&self.inner.data_dir).display()
            )),
            (None, Some(sled)) => write_vote_file(&self.inner.data_dir, &sled)
                .map_err(|e| format!("write vote file: {e}")),
            _ => Ok(()),
        }
    }

    /// Bytes the log occupies on disk (for metrics): sled's files and the segments' records.
    pub fn size_on_disk(&self) -> u64 {
        let sled = match self.inner.db.size_on_disk() {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::debug!(error = %e, "sled size_on_disk failed");
                0
            }
        };
        sled + self.inner.lock_wal().bytes()
    }

    /// From now on the node speaks cluster versions up to `cluster_version_max` only (this
    /// build's newest unless configured lower, see `NodeConfig::cluster_version_max`): the log
    /// refuses entries that raise the cluster version past it, and a log already in a data
    /// format newer than that version's is refused, as the release that speaks no more refuses
    /// it.
    pub fn speak_at_most(&self, cluster_version_max: u32) -> Result<(), OpenError> {
        use std::sync::atomic::Ordering;
        let reads = version::data_format(cluster_version_max);
        let found = self.inner.data_format.load(Ordering::Relaxed);
        if found > reads {
            return Err(OpenError::Capped {
                path: self.inner.path.clone(),
                found,
                cluster_version_max,
                reads,
            });
        }
        self.inner
            .cluster_version_max
            .store(cluster_version_max, Ordering::Relaxed);
        Ok(())
    }

    /// Records the data format that `entries` need a reader to know, if newer than the one
    /// recorded, before they are written (durably: see the module's `m:format`). Entries that
    /// raise the cluster version past what this node speaks are refused, writing nothing.
    fn record_format_of(&self, entries: &[Entry<TypeConfig>]) -> Result<(), String> {
        use std::sync::atomic::Ordering;
        crate::raft::followable(
            entries,
            self.inner.cluster_version_max.load(Ordering::Relaxed),
        )?;
        let Some(needed) = entries.iter().filter_map(format_needed).max() else {
            return Ok(());
        };
        if needed <= self.inner.data_format.load(Ordering::Relaxed) {
            return Ok(());
        }
        write_data_format(&self.inner.db, needed)?;
        self.inner.data_format.store(needed, Ordering::Relaxed);
        tracing::info!(data_format = needed, "raft log: data format raised");
        Ok(())
    }

    /// The data format recorded for this store.
    #[cfg(test)]
    fn data_format(&self) -> u32 {
        self.inner
            .data_format
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn read_meta<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, String> {
        read_meta(&self.inner.db, key)
    }

    /// Waits as long as a sync takes on a disk made slow (only ever under simulation).
    async fn slow_disk(&self) {
        if let Some(delay) = crate::disk_faults::sync_delay(&self.inner.data_dir) {
            tokio::time::sleep(delay).await;
        }
    }

    /// sled's flush, then (with [`Durability::Fsync`]) `fdatasync` of its file, in one blocking
    /// call; then, when given, `log_end` is recorded as the end of the log.
    async fn sync_meta(&self, log_end: Option<u64>) -> io::Result<()> {
        self.slow_disk().await;
        let inner = Arc::clone(&self.inner);
        crate::blocking::unblock(move || {
            inner.sync_meta()?;
            if let Some(index) = log_end {
                inner.log_end.write(index, false)?;
            }
            Ok(())
        })
        .await
        .map_err(io_other)?
    }
}

impl Inner {
    fn sync_meta(&self) -> io::Result<()> {
        self.db.flush().map_err(io_other)?;
        crate::disk_faults::flushed(&self.path);
        if self.durability == Durability::Fsync {
            self.data_file.sync_data()?;
        }
        Ok(())
    }

    /// Writes one metadata value, not yet flushed.
    fn put_meta(&self, key: &[u8], value: Vec<u8>) -> sled::Result<()> {
        let before = self.db.insert(key, value)?;
        crate::disk_faults::value_written(&self.path, key, before.as_deref());
        Ok(())
    }

    fn lock_wal(&self) -> MutexGuard<'_, Wal> {
        self.wal
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn read_meta<T: DeserializeOwned>(db: &sled::Db, key: &[u8]) -> Result<Option<T>, String> {
    let bytes = db
        .get(key)
        .map_err(|e| format!("read {}: {e}", String::from_utf8_lossy(key)))?;
    match bytes {
        None => Ok(None),
        Some(bytes) => decode_value(&bytes)
            .map(Some)
            .map_err(|e| format!("decode {}: {e}", String::from_utf8_lossy(key))),
    }
}

/// Puts back the values a simulated crash took from sled (see `disk_faults`); nothing outside a
/// simulation.
fn put_back_lost_values(db: &sled::Db, path: &Path) -> Result<(), OpenError> {
    let lost = crate::disk_faults::take_lost_values(path);
    if lost.is_empty() {
        return Ok(());
    }
    for (key, value) in lost {
        let put = match value {
            Some(value) => db.insert(key, value),
            None => db.remove(key),
        };
        put.map_err(|source| OpenError::Sled {
            path: path.to_path_buf(),
            source,
        })?;
    }
    db.flush().map(drop).map_err(|source| OpenError::Sled {
        path: path.to_path_buf(),
        source,
    })
}

/// Decodes every metadata value; returns the purge point.
fn check_meta(db: &sled::Db) -> Result<Option<LogId>, String> {
    read_meta::<Vote<NodeId>>(db, KEY_VOTE).map_err(|e| format!("vote: {e}"))?;
    read_meta::<Option<LogId>>(db, KEY_COMMITTED).map_err(|e| format!("committed log id: {e}"))?;
    read_meta::<LogId>(db, KEY_PURGED).map_err(|e| format!("purged log id: {e}"))
}

/// Moves the entries that stores written before the segment files kept in sled into a segment,
/// once: the segment is written and synced first, then the entries leave sled in one batch,
/// flushed and synced. A crash in between leaves them in both; the next open starts over from
/// sled, replacing the segments. Returns how many entries moved.
fn migrate_sled_entries(db: &sled::Db, data_file: &File, wal_dir: &Path) -> Result<usize, String> {
    let mut entries = Vec::new();
    let mut keys = Vec::new();
    for item in db.range(entry_key(0)..=entry_key(u64::MAX)) {
        let (key, value) = item.map_err(|e| format!("scan log entries: {e}"))?;
        entries.push(decode_entry(&key, &value)?);
        keys.push(key);
    }
    if entries.is_empty() {
        return Ok(0);
    }
    if let Ok(listing) = std::fs::read_dir(wal_dir) {
        for item in listing {
            let item = item.map_err(|e| format!("list {}: {e}", wal_dir.display()))?;
            std::fs::remove_file(item.path())
                .map_err(|e| format!("remove {}: {e}", item.path().display()))?;
        }
    }
    let (mut wal, _) = Wal::open(wal_dir, None, SEGMENT_BYTES, true)?;
    wal.append(&entries)
        .map_err(|e| format!("move log entries to {}: {e}", wal_dir.display()))?;
    let mut batch = sled::Batch::default();
    for key in keys {
        batch.remove(key);
    }
    db.apply_batch(batch)
        .and_then(|()| db.flush().map(drop))
        .map_err(|e| format!("remove moved log entries: {e}"))?;
    data_file
        .sync_data()
        .map_err(|e| format!("sync after moving log entries: {e}"))?;
    tracing::info!(
        entries = entries.len(),
        to = %wal_dir.display(),
        "moved the raft log's entries out of sled"
    );
    Ok(entries.len())
}

/// Writes 0.1.0's data format into a new store; refuses a store of a format this build does
/// not read (none: format 1) before anything in it is decoded. Returns the store's format.
fn check_data_format(db: &sled::Db, path: &Path) -> Result<u32, OpenError> {
    let corrupt = |reason: String| OpenError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let stored = db
        .get(KEY_FORMAT)
        .map_err(|e| corrupt(format!("read data format: {e}")))?;
    let found = match stored {
        Some(bytes) => {
            decode_value::<u32>(&bytes).map_err(|e| corrupt(format!("data format: {e}")))?
        }
        None if db.is_empty() => {
            write_data_format(db, version::OLDEST_DATA_FORMAT)
                .map_err(|e| corrupt(format!("write data format: {e}")))?;
            version::OLDEST_DATA_FORMAT
        }
        None => 1,
    };
    if found > *READ_FORMATS.end() {
        let release = read_meta::<String>(db, KEY_RELEASE)
            .ok()
            .flatten()
            .unwrap_or_else(|| "a newer release".to_string());
        return Err(OpenError::Newer {
            path: path.to_path_buf(),
            found,
            release,
        });
    }
    if found < *READ_FORMATS.start() {
        return Err(OpenError::Format {
            path: path.to_path_buf(),
            found,
        });
    }
    Ok(found)
}

/// Records `format` as the store's data format, written by this release, durably.
fn write_data_format(db: &sled::Db, format: u32) -> Result<(), String> {
    let format = encode_value(&format).map_err(|e| e.to_string())?;
    let release = encode_value(&crate::release::RELEASE.to_string()).map_err(|e| e.to_string())?;
    db.insert(KEY_RELEASE, release)
        .and_then(|_| db.insert(KEY_FORMAT, format))
        .and_then(|_| db.flush())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Maps a `RangeBounds<u64>` onto inclusive index bounds; `None` when the range is empty.
fn inclusive_bounds(range: &impl RangeBounds<u64>) -> Option<(u64, u64)> {
    let start = match range.start_bound() {
        Bound::Included(s) => *s,
        Bound::Excluded(s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(e) => *e,
        Bound::Excluded(e) => e.checked_sub(1)?,
        Bound::Unbounded => u64::MAX,
    };
    (start <= end).then_some((start, end))
}

impl LogStore {
    /// The last index of `start..=end` such that the records from `start` to it take at most
    /// `budget` bytes, `start` itself whatever its size. Sizes come from the entries in memory,
    /// else from the segments; an index neither holds counts as nothing (the read leaves it out).
    fn batch_end(&self, start: u64, end: u64, budget: u64) -> u64 {
        let log = self.read_log();
        let first_cached = log.first_cached().unwrap_or(u64::MAX);
        // The same lock order as `try_get_log_entries`: the log, then the segments.
        let wal = (start < first_cached).then(|| self.inner.lock_wal());
        let size = |index: u64| match &wal {
            Some(wal) if index < first_cached => wal.record_bytes(index).unwrap_or(0),
            _ => usize::try_from(index.saturating_sub(first_cached))
                .ok()
                .and_then(|i| log.sizes.get(i).map(|(record, _)| *record))
                .unwrap_or(0),
        };
        let mut total = size(start);
        let mut last = start;
        while last < end {
            total = total.saturating_add(size(last + 1));
            if total > budget {
                break;
            }
            last += 1;
        }
        last
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    /// At most [`REPLICATION_BATCH_BYTES`] of records from `start` on (at least one entry).
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        if start >= end {
            return Ok(Vec::new());
        }
        // A start the purge point covers is read from just after it, as `try_get_log_entries`
        // does; the budget counts from there.
        let purged = self.read_log().purged.map_or(0, |p| p.index + 1);
        let from = start.max(purged);
        if from >= end {
            return self.try_get_log_entries(start..end).await;
        }
        let last = self.batch_end(from, end - 1, REPLICATION_BATCH_BYTES);
        self.try_get_log_entries(start..=last).await
    }

    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let Some((start, end)) = inclusive_bounds(&range) else {
            return Ok(Vec::new());
        };
        let log = self.read_log();
        let Some(last) = log.last_log_id().map(|l| l.index) else {
            return Ok(Vec::new());
        };
        let start = start.max(log.purged.map_or(0, |p| p.index + 1));
        let end = end.min(last);
        if start > end {
            return Ok(Vec::new());
        }
        let first = log.first_cached().unwrap_or(last + 1);
        // Entries before the ones in memory, from the segments (under the log's read lock, so
        // no purge or truncate changes them meanwhile).
        let mut out = if start < first {
            self.inner
                .lock_wal()
                .read(start, end.min(first - 1))
                .map_err(|e| StorageIOError::read_logs(&e))?
        } else {
            Vec::new()
        };
        if end >= first {
            let from = usize::try_from(start.saturating_sub(first)).unwrap_or(usize::MAX);
            let to = usize::try_from(end - first)
                .unwrap_or(usize::MAX)
                .saturating_add(1)
                .min(log.entries.len());
            out.extend(log.entries.range(from.min(to)..to).cloned());
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let log = self.read_log();
        Ok(LogState {
            last_purged_log_id: log.purged,
            last_log_id: log.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let value = encode_value(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        self.inner
            .put_meta(KEY_VOTE, value)
            .map_err(|e| StorageIOError::write_vote(&e))?;
        self.sync_meta(None)
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?;
        // Then the copy outside sled (see `vote_file_path`). Written second: a crash between
        // leaves the file older than sled, which open accepts.
        let data_dir = self.inner.data_dir.clone();
        let vote = *vote;
        crate::blocking::unblock(move || write_vote_file(&data_dir, &vote))
            .await
            .map_err(|e| StorageIOError::write_vote(&io_other(e)))?
            .map_err(|e| StorageIOError::write_vote(&e))?;
        self.early.vote_saved(vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        let vote: Option<Vote<NodeId>> = self
            .read_meta(KEY_VOTE)
            .map_err(|reason| StorageIOError::read_vote(AnyError::error(reason)))?;
        let vote = vote.map(|vote| self.early.vote_at_start(vote));
        if let Some(vote) = vote {
            self.early.vote_saved(vote);
        }
        Ok(vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        if let Some(id) = committed {
            self.metrics.trace.committed(id.index);
            self.metrics
                .committed_index
                .set(i64::try_from(id.index).unwrap_or(i64::MAX));
        }
        let value = encode_value(&committed).map_err(|e| StorageIOError::write(&e))?;
        self.inner
            .put_meta(KEY_COMMITTED, value)
            .map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let committed: Option<Option<LogId>> = self
            .read_meta(KEY_COMMITTED)
            .map_err(|reason| StorageIOError::read(AnyError::error(reason)))?;
        Ok(committed.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        if let (Some(first), Some(last)) = (entries.first(), entries.last().map(|e| e.log_id)) {
            let started = std::time::Instant::now();
            let first = first.log_id.index;
            self.metrics
                .trace
                .stamp_range(first, last.index, Mark::AppendStart);
            let count = entries.len();
            self.slow_disk().await;
            // Step 0: an entry that raises the cluster version records its data format first.
            self.record_format_of(&entries)
                .map_err(|e| StorageIOError::write_logs(&io_other(e)))?;
            // On the leader, the followers get the entries now, and sync them while this node
            // does (see `super::early`).
            let prev = self.read_log().last_log_id();
            if prev.map_or(0, |p| p.index + 1) == first {
                self.early.appending(prev, &entries);
            }
            // Steps 1-3, on this thread.
            let (appended, sizes) = {
                let mut wal = self.inner.lock_wal();
                let appended = wal
                    .append(&entries)
                    .map_err(|e| StorageIOError::write_logs(&e))?;
                let sizes: Vec<u64> = entries
                    .iter()
                    .map(|e| wal.record_bytes(e.log_id.index).unwrap_or(0))
                    .collect();
                (appended, sizes)
            };
            if self.inner.durability == Durability::Fsync {
                observe(&self.metrics.fsync_seconds, appended.synced);
            }
            self.metrics.appended_bytes.inc_by(appended.bytes);
            self.inner
                .log_end
                .write(last.index, false)
                .map_err(|e| StorageIOError::write_logs(&e))?;
            // Step 4.
            self.write_log().push(entries, sizes.into_iter());
            observe(&self.metrics.append_seconds, started.elapsed());
            self.metrics.appended_entries.inc_by(count as u64);
            self.metrics
                .trace
                .stamp_range(first, last.index, Mark::AppendDone);
        }
        // Step 5.
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(since = %log_id, "truncate raft log");
        // Lower the recorded end first (durably): the log must never end before it.
        let inner = Arc::clone(&self.inner);
        let new_end = log_id.index.saturating_sub(1);
        crate::blocking::unblock(move || {
            inner.log_end.write(new_end, true)?;
            inner.lock_wal().truncate(log_id.index)
        })
        .await
        .map_err(|e| StorageIOError::write_logs(&io_other(e)))?
        .map_err(|e| StorageIOError::write_logs(&e))?;
        let mut log = self.write_log();
        while log
            .entries
            .back()
            .is_some_and(|e| e.log_id.index >= log_id.index)
        {
            log.entries.pop_back();
            log.bytes -= log.sizes.pop_back().map_or(0, |(_, held)| held);
        }
        // The new last entry: in memory, or read back from the segments.
        log.last = match log.entries.back() {
            Some(entry) => Some(entry.log_id),
            None => {
                let before = log_id.index.checked_sub(1);
                match before.filter(|b| log.purged.is_none_or(|p| *b > p.index)) {
                    Some(b) => self
                        .inner
                        .lock_wal()
                        .read(b, b)
                        .map_err(|e| StorageIOError::read_logs(&e))?
                        .last()
                        .map(|e| e.log_id),
                    None => None,
                }
            }
        };
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(upto = %log_id, "purge raft log");
        let value = encode_value(&log_id).map_err(|e| StorageIOError::write_logs(&e))?;
        self.inner
            .put_meta(KEY_PURGED, value)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // A purge past the end of the log (a snapshot installed beyond it) is followed by
        // appends from the snapshot on: under a lost purge point they would begin after a hole.
        let past_the_end = {
            let mut log = self.write_log();
            let past_the_end = log.last.is_none_or(|last| last.index < log_id.index);
            log.purged = Some(log_id);
            while log
                .entries
                .front()
                .is_some_and(|e| e.log_id.index <= log_id.index)
            {
                log.pop_front();
            }
            if log.last.is_some_and(|last| last.index <= log_id.index) {
                log.last = None;
            }
            past_the_end
        };
        if past_the_end || self.inner.lock_wal().purgeable(log_id.index) > 0 {
            let inner = Arc::clone(&self.inner);
            crate::blocking::unblock(move || {
                inner.sync_meta()?;
                inner.lock_wal().purge(log_id.index)
            })
            .await
            .map_err(|e| StorageIOError::write_logs(&io_other(e)))?
            .map_err(|e| StorageIOError::write_logs(&e))?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("path", &self.inner.path)
            .field("durability", &self.inner.durability)
            .finish()
    }
}

#[cfg(test)]
mod tests {

    #[tokio::test]
    async fn a_log_that_lost_its_vote_refuses_to_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut store = LogStore::open(dir.path()).expect("open");
            store.save_vote(&Vote::new(3, 1)).await.expect("save vote");
        }
        // Reopening an intact directory works and keeps the vote.
        let mut store = LogStore::open(dir.path()).expect("reopen");
        assert_eq!(
            store.read_vote().await.expect("read vote"),
            Some(Vote::new(3, 1))
        );
        drop(store);
        // sled's directory gone (or emptied by its recovery): refuse.
        std::fs::remove_dir_all(dir.path().join("raft")).expect("remove sled dir");
        let Err(err) = LogStore::open(dir.path()) else {
            panic!("a log that lost its vote must not open")
        };
        assert!(err.to_string().contains("lost data"), "{err}");
    }

    #[test]
    fn a_log_open_elsewhere_is_recognised_as_locked() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let first = LogStore::open(dir.path())?;
        let Err(second) = LogStore::open(dir.path()) else {
            anyhow::bail!("sled opened twice");
        };
        assert!(second.is_locked(), "{second}");
        drop(first);
        drop(LogStore::open(dir.path())?);
        Ok(())
    }

    #[test]
    fn every_kept_format_opens_and_any_other_is_refused_in_one_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = LogStore::open(dir.path()).expect("open");
            // A new store records 0.1.0's format, which that release reads.
            assert_eq!(store.read_meta::<u32>(KEY_FORMAT), Ok(Some(7)));
            assert_eq!(store.data_format(), 7);
        }
        drop(LogStore::open(dir.path()).expect("reopen"));
        let raft = dir.path().join("raft");
        let rewrite = |format: Option<u32>, release: Option<&str>| {
            let db = sled::open(&raft).expect("open sled");
            match format {
                Some(format) => db.insert(KEY_FORMAT, encode_value(&format).expect("encode")),
                None => db.remove(KEY_FORMAT),
            }
            .expect("write");
            match release {
                Some(r) => db.insert(KEY_RELEASE, encode_value(&r.to_string()).expect("encode")),
                None => db.remove(KEY_RELEASE),
            }
            .expect("write");
            db.insert(KEY_VOTE, b"old vote".to_vec()).expect("write");
            db.flush().expect("flush");
        };
        for format in READ_FORMATS {
            rewrite(Some(format), None);
            let store = LogStore::open(dir.path());
            // The vote is garbage on purpose: getting past the format check is what counts.
            let message = store.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                !message.contains("data format"),
                "format {format}: {message}"
            );
        }
        let this = crate::release::RELEASE;
        for (format, release, start) in [
            (
                None,
                None,
                format!(
                    "{}: written by a development build of conch older than release 0.1.0 \
                     (data format 1); this build, conch {this}, reads data formats 7 to 8: ",
                    raft.display()
                ),
            ),
            (
                Some(6),
                None,
                format!(
                    "{}: written by a development build of conch older than release 0.1.0 \
                     (data format 6)",
                    raft.display()
                ),
            ),
            (
                Some(9),
                Some("0.9.0"),
                format!(
                    "{}: written by conch 0.9.0 (data format 9); this build, conch {this}, reads \
                     data formats 7 to 8: run conch 0.9.0 or a later release on this directory",
                    raft.display()
                ),
            ),
        ] {
            rewrite(format, release);
            let Err(err) = LogStore::open(dir.path()) else {
                panic!("a store of format {format:?} must not open")
            };
            let message = err.to_string();
            assert!(message.starts_with(&start), "{message}");
            assert!(!message.contains('\n'), "one line: {message}");
        }
    }

    #[test]
    fn an_entry_that_raises_the_cluster_version_records_its_format_before_it_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LogStore::open(dir.path()).expect("open");
        let raise = |index: u64, version: u32| Entry::<TypeConfig> {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(crate::state::Batch {
                cmds: vec![Cmd::SetClusterVersion { version }],
                ..Default::default()
            }),
        };
        store.record_format_of(&[raise(1, 1)]).expect("record");
        assert_eq!(store.data_format(), 7, "version 1 needs nothing new");
        store.record_format_of(&[raise(2, 2)]).expect("record");
        assert_eq!(store.data_format(), 8);
        assert_eq!(store.read_meta::<u32>(KEY_FORMAT), Ok(Some(8)));
        assert_eq!(
            store.read_meta::<String>(KEY_RELEASE),
            Ok(Some(crate::release::RELEASE.to_string()))
        );
        drop(store);
        assert_eq!(LogStore::open(dir.path()).expect("reopen").data_format(), 8);
    }

    #[test]
    fn a_node_that_speaks_less_refuses_a_raise_past_it_and_a_log_in_a_newer_format() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LogStore::open(dir.path()).expect("open");
        store
            .speak_at_most(1)
            .expect("a new log is in 0.1.0's format");
        let raise = |index: u64, version: u32| Entry::<TypeConfig> {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(crate::state::Batch {
                cmds: vec![Cmd::SetClusterVersion { version }],
                ..Default::default()
            }),
        };
        store.record_format_of(&[raise(1, 1)]).expect("version 1");
        let refused = store
            .record_format_of(&[raise(2, 1), raise(3, 2)])
            .expect_err("a raise past what the node speaks");
        assert!(
            refused.contains("log entry 3 raises the cluster version to 2")
                && refused.contains("speaks cluster version 1 at most"),
            "{refused}"
        );
        assert_eq!(store.data_format(), 7, "nothing recorded");
        assert_eq!(store.read_meta::<u32>(KEY_FORMAT), Ok(Some(7)));

        // A log a node of the newest version raised: refused as the previous release refuses it.
        store.speak_at_most(version::NEWEST).expect("the newest");
        store.record_format_of(&[raise(3, 2)]).expect("raise");
        drop(store);
        let store = LogStore::open(dir.path()).expect("reopen");
        let Err(err) = store.speak_at_most(1) else {
            panic!("a log in data format 8 must be refused by a node that speaks version 1")
        };
        let message = err.to_string();
        assert!(
            message.contains(
                "in data format 8; this node speaks cluster version 1 at most and \
                 reads data formats 7 to 7"
            ),
            "{message}"
        );
    }

    use std::collections::BTreeSet;
    use std::time::{Duration, Instant};

    use openraft::storage::RaftLogStorageExt;
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::{CommittedLeaderId, EntryPayload, Membership};
    use tempfile::TempDir;

    use super::*;
    use crate::applied::AppliedState;
    use crate::raft::codec::CodecError;
    use crate::raft::state_machine::StateMachine;
    use crate::state::{Batch, Cmd, State};

    /// A fresh log store and state machine in their own temp dir (the guard keeps it alive).
    struct SledBuilder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for SledBuilder {
        async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
            let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
            let log = LogStore::open(dir.path()).map_err(|e| StorageIOError::write(&e))?;
            let applied = AppliedState::new(State::new(), 0);
            let sm =
                StateMachine::open(dir.path(), applied).map_err(|e| StorageIOError::write(&e))?;
            Ok((dir, log, sm))
        }
    }

    #[test]
    #[allow(clippy::result_large_err)] // openraft's StorageError
    fn openraft_suite_passes_on_sled() -> Result<(), StorageError> {
        Suite::test_all(SledBuilder)
    }

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Blank,
        }
    }

    fn batch(term: u64, index: u64) -> Entry<TypeConfig> {
        let batch = Batch {
            now_ns: 1_000 + index as i64,
            cmds: vec![Cmd::RefreshLease {
                ns: "conch".to_string(),
                kind: crate::state::LeaseKind::Semaphore,
                lease: format!("lease-{index}"),
                ttl_s: 10,
            }],
            wall_ns: 1_000 + index as i64,
        };
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Normal(batch),
        }
    }

    fn membership(term: u64, index: u64, voters: &[u64]) -> Entry<TypeConfig> {
        let voters: BTreeSet<u64> = voters.iter().copied().collect();
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Membership(Membership::new(vec![voters], None)),
        }
    }

    fn ids(entries: &[Entry<TypeConfig>]) -> Vec<LogId> {
        entries.iter().map(|e| e.log_id).collect()
    }

    #[tokio::test]
    async fn reopened_store_has_the_same_log_vote_and_committed() -> anyhow::Result<()> {
        // open           empty dir
        // append         [blank 1, membership 2, batch 3, batch 4, batch 5] in one call
        // vote           term 2, node 1, committed
        // committed      (1, 4)
        // purge          up to 1
        // drop, reopen   -> same log state, entries 2..=5, vote and committed
        let dir = tempfile::tempdir()?;
        let written = vec![
            blank(1, 1),
            membership(1, 2, &[1, 2, 3]),
            batch(1, 3),
            batch(1, 4),
            batch(2, 5),
        ];
        let vote = Vote::new_committed(2, 1);
        {
            let mut store = LogStore::open(dir.path())?;
            store.blocking_append(written.clone()).await?;
            store.save_vote(&vote).await?;
            store.save_committed(Some(log_id(1, 4))).await?;
            store.purge(log_id(1, 1)).await?;
        }

        let mut store = LogStore::open(dir.path())?;
        let state = store.get_log_state().await?;
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 1)));
        assert_eq!(state.last_log_id, Some(log_id(2, 5)));
        assert_eq!(store.read_vote().await?, Some(vote));
        assert_eq!(store.read_committed().await?, Some(log_id(1, 4)));
        let entries = store.try_get_log_entries(..).await?;
        assert_eq!(entries, written[1..].to_vec());

        // The log keeps working after the reopen: truncate the tail, append a new term.
        store.truncate(log_id(2, 5)).await?;
        store.blocking_append([blank(3, 5)]).await?;
        let mut reader = store.get_log_reader().await;
        assert_eq!(
            ids(&reader.try_get_log_entries(4..).await?),
            vec![log_id(1, 4), log_id(3, 5)]
        );
        Ok(())
    }

    #[tokio::test]
    async fn empty_log_reports_the_purge_point_as_last() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let mut store = LogStore::open(dir.path())?;
            store.blocking_append([blank(1, 1), blank(1, 2)]).await?;
            store.purge(log_id(1, 7)).await?;
            store.blocking_append([blank(2, 8)]).await?;
            store.purge(log_id(2, 8)).await?;
            // Purges are not flushed by themselves; dropping sled flushes.
        }
        let mut store = LogStore::open(dir.path())?;
        let state = store.get_log_state().await?;
        assert_eq!(state.last_purged_log_id, Some(log_id(2, 8)));
        assert_eq!(state.last_log_id, Some(log_id(2, 8)));
        assert!(store.try_get_log_entries(..).await?.is_empty());
        Ok(())
    }

    #[tokio::test]
    async fn a_purge_past_the_end_of_the_log_survives_a_crash_that_loses_unflushed_values()
    -> anyhow::Result<()> {
        // A snapshot installed on an empty log (a node added empty): purge to 7, then appends
        // from 8. A crash that loses every unflushed sled value must not leave the entries
        // from 8 after a hole.
        let dir = tempfile::tempdir()?;
        // The journal is this thread's: the store's blocking work must run on it too.
        crate::blocking::run_inline_on_this_thread(true);
        crate::disk_faults::track_unsynced_under(dir.path());
        {
            let mut store = LogStore::open(dir.path())?;
            store.purge(log_id(1, 7)).await?;
            store.blocking_append([blank(2, 8), blank(2, 9)]).await?;
            // Within the log: losing this purge point only brings entry 8 back.
            store.purge(log_id(2, 8)).await?;
        }
        let lost = crate::disk_faults::lose_on_crash(dir.path(), &mut |_| 0);
        assert_eq!(lost.values, 1, "the purge point 8 was never flushed");
        let opened = LogStore::open(dir.path());
        crate::disk_faults::stop_tracking();
        crate::blocking::run_inline_on_this_thread(false);
        let mut store = opened?;
        let state = store.get_log_state().await?;
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 7)));
        assert_eq!(
            ids(&store.try_get_log_entries(..).await?),
            [log_id(2, 8), log_id(2, 9)]
        );
        Ok(())
    }

    /// Writes `value` under `key`, bypassing the store (simulates damage on disk).
    fn poke(dir: &Path, key: &[u8], value: &[u8]) -> anyhow::Result<()> {
        let store = LogStore::open_with_durability(dir, Durability::Flush)?;
        store.inner.db.insert(key, value)?;
        store.inner.db.flush()?;
        Ok(())
    }

    async fn store_with_five_entries(dir: &Path) -> anyhow::Result<()> {
        let mut store = LogStore::open(dir)?;
        store
            .blocking_append([
                blank(1, 1),
                batch(1, 2),
                batch(1, 3),
                batch(1, 4),
                batch(1, 5),
            ])
            .await?;
        store.save_vote(&Vote::new(1, 1)).await?;
        Ok(())
    }

    fn assert_corrupt(result: Result<LogStore, OpenError>, needle: &str) {
        match result {
            Err(e @ OpenError::Corrupt { .. }) => {
                let message = e.to_string();
                assert!(
                    message.contains(needle),
                    "{message:?} should mention {needle:?}"
                );
                assert!(
                    message.contains("raft") || message.contains("wal"),
                    "{message:?} should name the path"
                );
            }
            Err(other) => panic!("expected Corrupt, got {other}"),
            Ok(_) => panic!("expected Corrupt, the store opened"),
        }
    }

    /// The segment file holding entry `index`, and the offset of its record.
    fn record_of(dir: &Path, index: u64) -> anyhow::Result<(PathBuf, u64)> {
        let wal = dir.join("wal");
        let mut firsts: Vec<u64> = std::fs::read_dir(&wal)?
            .filter_map(|e| {
                e.ok()?
                    .file_name()
                    .to_str()?
                    .strip_suffix(".seg")?
                    .parse()
                    .ok()
            })
            .collect();
        firsts.sort_unstable();
        let first = firsts
            .into_iter()
            .rev()
            .find(|f| *f <= index)
            .ok_or_else(|| anyhow::anyhow!("no segment holds {index}"))?;
        let path = wal.join(format!("{first:020}.seg"));
        let bytes = std::fs::read(&path)?;
        let mut at = 16usize;
        for _ in first..index {
            let mut len = [0u8; 4];
            len.copy_from_slice(&bytes[at..at + 4]);
            at += 4 + u32::from_le_bytes(len) as usize;
        }
        Ok((path, at as u64))
    }

    fn write_at(path: &Path, at: u64, bytes: &[u8]) -> anyhow::Result<()> {
        use std::os::unix::fs::FileExt;
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)?
            .write_all_at(bytes, at)?;
        Ok(())
    }

    /// Flips a byte inside the record of entry `index`.
    fn damage_entry(dir: &Path, index: u64) -> anyhow::Result<()> {
        let (path, at) = record_of(dir, index)?;
        let mut byte = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&File::open(&path)?, &mut byte, at + 9)?;
        write_at(&path, at + 9, &[byte[0] ^ 0x5a])
    }

    /// Cuts the log's files before the record of entry `index`, as a lost tail would.
    fn cut_log(dir: &Path, index: u64) -> anyhow::Result<()> {
        let (path, at) = record_of(dir, index)?;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)?
            .set_len(at)?;
        Ok(())
    }

    /// Entries 1..=`count`, one append each, in segments of `segment_bytes`.
    async fn store_with_entries(dir: &Path, count: u64, segment_bytes: u64) -> anyhow::Result<()> {
        let mut store = LogStore::open_with(dir, Durability::Fsync, segment_bytes)?;
        store.save_vote(&Vote::new(1, 1)).await?;
        for index in 1..=count {
            store.blocking_append([batch(1, index)]).await?;
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_damaged_entry_before_the_last_refuses_open() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        // Segments of about two records each: entry 3 is not in the last one.
        store_with_entries(dir.path(), 8, 256).await?;
        damage_entry(dir.path(), 3)?;
        assert_corrupt(LogStore::open(dir.path()), "entry 3");
        Ok(())
    }

    #[tokio::test]
    async fn a_damaged_last_entry_that_was_acknowledged_refuses_open() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        store_with_five_entries(dir.path()).await?;
        damage_entry(dir.path(), 5)?;
        let Err(err) = LogStore::open(dir.path()) else {
            panic!("a log whose acknowledged last entry is damaged must not open")
        };
        let message = err.to_string();
        assert!(message.contains("ends at index 4"), "{message}");
        assert!(message.contains("entry 5"), "{message}");
        assert!(message.contains("lost data"), "{message}");
        Ok(())
    }

    #[tokio::test]
    async fn a_torn_write_that_was_never_acknowledged_is_cleared() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        store_with_five_entries(dir.path()).await?;
        // A crash mid-append: entry 6's record is on disk, damaged, and the end record still
        // says 5 (it is written after the sync).
        let (path, at) = record_of(dir.path(), 5)?;
        let good = encode_value(&batch(1, 5))?;
        let torn = encode_value(&batch(1, 6))?;
        let mut record = (torn.len() as u32).to_le_bytes().to_vec();
        record.extend_from_slice(&torn[..torn.len() / 2]);
        write_at(&path, at + 4 + good.len() as u64, &record)?;
        {
            let mut store = LogStore::open(dir.path())?;
            assert_eq!(store.get_log_state().await?.last_log_id, Some(log_id(1, 5)));
            store.blocking_append([blank(2, 6)]).await?;
        }
        let mut store = LogStore::open(dir.path())?;
        assert_eq!(store.get_log_state().await?.last_log_id, Some(log_id(2, 6)));
        Ok(())
    }

    #[tokio::test]
    async fn entry_under_the_wrong_index_is_rejected() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        store_with_five_entries(dir.path()).await?;
        // Entry 3's record (the same size) written where entry 4's belongs.
        let (path, at) = record_of(dir.path(), 4)?;
        let value = encode_value(&batch(1, 3))?;
        let mut record = (value.len() as u32).to_le_bytes().to_vec();
        record.extend_from_slice(&value);
        write_at(&path, at, &record)?;
        assert_corrupt(
            LogStore::open(dir.path()),
            "holds entry 3, expected entry 4",
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_log_that_lost_its_tail_refuses_to_open() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        store_with_five_entries(dir.path()).await?;
        // The vote is intact; only the last two acknowledged entries are gone.
        cut_log(dir.path(), 4)?;
        let Err(err) = LogStore::open(dir.path()) else {
            panic!("a log that lost its tail must not open")
        };
        let message = err.to_string();
        assert!(message.contains("ends at index 3"), "{message}");
        assert!(message.contains("up to 5"), "{message}");
        assert!(message.contains("log-end"), "{message}");
        assert!(message.contains("lost data"), "{message}");
        Ok(())
    }

    /// The log's files cut short at any point: the store either opens with every entry and the
    /// vote, or refuses to open. It never opens having forgotten an acknowledged entry.
    #[tokio::test]
    async fn a_log_cut_short_never_opens_short() -> anyhow::Result<()> {
        let template = tempfile::tempdir()?;
        store_with_entries(template.path(), 40, 1024).await?;
        let (last_segment, end) = record_of(template.path(), 40)?;
        let relative = |path: &Path| path.strip_prefix(template.path()).map(Path::to_path_buf);
        let files = [
            (relative(&last_segment)?, end + 1),
            (relative(&record_of(template.path(), 1)?.0)?, 1024),
            (
                PathBuf::from("raft/db"),
                std::fs::metadata(template.path().join("raft/db"))?.len(),
            ),
        ];
        let mut refused = 0;
        for (file, len) in files {
            for cut in (0..len).step_by(usize::try_from(len / 16).unwrap_or(1).max(1)) {
                let dir = tempfile::tempdir()?;
                copy_dir(template.path(), dir.path())?;
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.path().join(&file))?
                    .set_len(cut)?;
                match LogStore::open(dir.path()) {
                    Ok(mut store) => {
                        let state = store.get_log_state().await?;
                        let what = format!("{} cut at {cut}", file.display());
                        assert_eq!(state.last_log_id, Some(log_id(1, 40)), "{what}");
                        assert_eq!(store.read_vote().await?, Some(Vote::new(1, 1)), "{what}");
                    }
                    Err(_) => refused += 1,
                }
            }
        }
        assert!(refused > 0, "no cut of the log's files was detected");
        Ok(())
    }

    /// An entry whose record is about `bytes` long.
    fn large(term: u64, index: u64, bytes: usize) -> Entry<TypeConfig> {
        let mut entry = batch(term, index);
        if let EntryPayload::Normal(batch) = &mut entry.payload
            && let Some(Cmd::RefreshLease { lease, .. }) = batch.cmds.first_mut()
        {
            // Padded by hand: a formatting width stops at 65 535.
            let digits = index.to_string();
            *lease = "0".repeat(bytes.saturating_sub(digits.len())) + &digits;
        }
        entry
    }

    fn wal_bytes(dir: &Path) -> anyhow::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        let mut total = 0;
        for item in std::fs::read_dir(dir.join("wal"))? {
            total += item?.metadata()?.blocks() * 512;
        }
        Ok(total)
    }

    /// Entries of many small commands: what they hold decoded, not their records, is what the
    /// memory budget counts, so the entries kept stay within it.
    #[tokio::test]
    async fn entries_kept_in_memory_are_counted_as_decoded() -> anyhow::Result<()> {
        const COMMANDS: usize = 100;
        let dir = tempfile::tempdir()?;
        let mut store = LogStore::open_with(dir.path(), Durability::Flush, 4 * 1024 * 1024)?;
        for index in 1..=400 {
            let mut entry = batch(1, index);
            if let EntryPayload::Normal(batch) = &mut entry.payload {
                let cmd = batch.cmds[0].clone();
                batch.cmds = vec![cmd; COMMANDS];
            }
            store.blocking_append([entry]).await?;
        }
        {
            let log = store.read_log();
            let decoded = log.entries.len() * COMMANDS * std::mem::size_of::<Cmd>();
            assert!(
                decoded as u64 <= MEM_LOG_BYTES,
                "{} entries of {COMMANDS} commands kept: {decoded} bytes decoded",
                log.entries.len()
            );
            let records: u64 = log.sizes.iter().map(|(record, _)| record).sum();
            assert!(
                log.bytes > records,
                "{} held, {records} of records",
                log.bytes
            );
            assert!(log.entries.len() > 1, "the newest entries are kept");
        }
        // The entries that left memory are read back from the segments.
        assert_eq!(store.try_get_log_entries(..).await?.len(), 400);
        Ok(())
    }

    #[tokio::test]
    async fn replication_reads_stop_at_the_batch_byte_budget() -> anyhow::Result<()> {
        // 120 entries of ~100 kB: memory keeps about 10 of the newest, the rest are read back
        // from the segments. A budget of 1 MiB takes about 10 of them per call.
        const RECORD: usize = 100_000;
        let dir = tempfile::tempdir()?;
        let written: Vec<_> = (1..=120).map(|i| large(1, i, RECORD)).collect();
        let mut store = LogStore::open_with(dir.path(), Durability::Flush, 4 * 1024 * 1024)?;
        for entry in &written {
            store.blocking_append([entry.clone()]).await?;
        }
        let per_call = (REPLICATION_BATCH_BYTES as usize / RECORD) - 1
            ..=REPLICATION_BATCH_BYTES as usize / RECORD;
        // From the segments, then across into memory, then from memory only.
        for start in [1, 105, 112] {
            let got = store.limited_get_log_entries(start, 121).await?;
            let expected_len = got.len();
            assert!(
                per_call.contains(&expected_len) || start + expected_len as u64 == 121,
                "{expected_len} entries from {start}"
            );
            let from = usize::try_from(start - 1)?;
            assert_eq!(got, written[from..from + expected_len], "from {start}");
        }
        // Reading to the end in calls covers every entry once, in order.
        let mut next = 1;
        let mut read = Vec::new();
        while next <= 120 {
            let got = store.limited_get_log_entries(next, 121).await?;
            assert!(!got.is_empty(), "nothing from {next}");
            next += got.len() as u64;
            read.extend(got);
        }
        assert_eq!(read, written);
        // One entry larger than the budget is still sent alone; small entries all at once.
        store
            .blocking_append([large(1, 121, 2 * 1024 * 1024)])
            .await?;
        assert_eq!(store.limited_get_log_entries(121, 122).await?.len(), 1);
        assert_eq!(store.limited_get_log_entries(120, 122).await?.len(), 1);
        for i in 122..=400 {
            store.blocking_append([batch(1, i)]).await?;
        }
        assert_eq!(store.limited_get_log_entries(122, 401).await?.len(), 279);
        // A start the purge point covers is read from after it.
        store.purge(log_id(1, 130)).await?;
        let got = store.limited_get_log_entries(125, 401).await?;
        assert_eq!(got.first().map(|e| e.log_id.index), Some(131));
        assert_eq!(got.len(), 270);
        Ok(())
    }

    #[tokio::test]
    async fn entries_past_memory_are_read_back_and_purged_entries_leave_the_disk()
    -> anyhow::Result<()> {
        // 200 entries of ~20 kB (4 MB): memory keeps about 1 MB of the newest; segments of
        // 256 kB hold about 12 entries each.
        const RECORD: usize = 20_000;
        let dir = tempfile::tempdir()?;
        let written: Vec<_> = (1..=200).map(|i| large(1, i, RECORD)).collect();
        {
            let mut store = LogStore::open_with(dir.path(), Durability::Flush, 256 * 1024)?;
            for entry in &written {
                store.blocking_append([entry.clone()]).await?;
            }
            let in_memory = store.read_log().entries.len();
            assert!(in_memory < 60, "{in_memory} entries kept in memory");
            assert_eq!(store.try_get_log_entries(..).await?, written);
            assert_eq!(store.try_get_log_entries(10..=12).await?, written[9..12]);
            let full = wal_bytes(dir.path())?;
            assert!(full >= 200 * RECORD as u64, "{full} bytes on disk");

            // A truncate below the entries in memory finds the new last entry on disk.
            store.truncate(log_id(1, 120)).await?;
            assert_eq!(
                store.get_log_state().await?.last_log_id,
                Some(log_id(1, 119))
            );
            assert_eq!(store.try_get_log_entries(..).await?, written[..119]);
            store.blocking_append([blank(2, 120)]).await?;

            // A purge removes the segments it covers from the disk: what stays is the entries
            // after the purge point plus at most one segment and the last one's free space.
            store.purge(log_id(1, 100)).await?;
            let kept = wal_bytes(dir.path())?;
            assert!(
                kept <= 20 * RECORD as u64 + 2 * 256 * 1024,
                "{kept} bytes on disk after purging 100 of 120 entries"
            );
            assert!(store.try_get_log_entries(..=100).await?.is_empty());
        }
        let mut store = LogStore::open_with(dir.path(), Durability::Flush, 256 * 1024)?;
        let mut expected = written[100..119].to_vec();
        expected.push(blank(2, 120));
        assert_eq!(store.try_get_log_entries(..).await?, expected);
        let state = store.get_log_state().await?;
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 100)));
        assert_eq!(state.last_log_id, Some(log_id(2, 120)));
        Ok(())
    }

    #[tokio::test]
    async fn purges_delete_whole_segments_and_the_log_reopens() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        store_with_entries(dir.path(), 12, 256).await?;
        let segments =
            || -> anyhow::Result<usize> { Ok(std::fs::read_dir(dir.path().join("wal"))?.count()) };
        let before = segments()?;
        {
            let mut store = LogStore::open_with(dir.path(), Durability::Fsync, 256)?;
            store.purge(log_id(1, 9)).await?;
            assert!(segments()? < before, "no segment deleted");
            assert_eq!(
                ids(&store.try_get_log_entries(..).await?),
                (10..=12).map(|i| log_id(1, i)).collect::<Vec<_>>()
            );
        }
        let mut store = LogStore::open_with(dir.path(), Durability::Fsync, 256)?;
        let state = store.get_log_state().await?;
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 9)));
        assert_eq!(
            ids(&store.try_get_log_entries(..).await?),
            (10..=12).map(|i| log_id(1, i)).collect::<Vec<_>>()
        );
        Ok(())
    }

    #[tokio::test]
    async fn entries_kept_in_sled_by_an_earlier_build_move_into_segments() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let written = vec![blank(1, 3), batch(1, 4), membership(2, 5, &[1, 2, 3])];
        {
            // A store as earlier builds wrote it: entries in sled under `e` + index.
            let db = sled::open(dir.path().join("raft"))?;
            db.insert(KEY_FORMAT, encode_value(&version::OLDEST_DATA_FORMAT)?)?;
            db.insert(KEY_PURGED, encode_value(&log_id(1, 2))?)?;
            db.insert(KEY_VOTE, encode_value(&Vote::<NodeId>::new(2, 1))?)?;
            for entry in &written {
                db.insert(entry_key(entry.log_id.index), encode_value(entry)?)?;
            }
            db.flush()?;
        }
        for _ in 0..2 {
            let mut store = LogStore::open(dir.path())?;
            assert_eq!(store.try_get_log_entries(..).await?, written);
            assert_eq!(store.read_vote().await?, Some(Vote::new(2, 1)));
            assert_eq!(
                store.get_log_state().await?.last_purged_log_id,
                Some(log_id(1, 2))
            );
            let in_sled = store
                .inner
                .db
                .range(entry_key(0)..=entry_key(u64::MAX))
                .count();
            assert_eq!(in_sled, 0, "entries left in sled");
        }
        Ok(())
    }

    fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
        for item in std::fs::read_dir(from)? {
            let item = item?;
            let target = to.join(item.file_name());
            if item.file_type()?.is_dir() {
                std::fs::create_dir_all(&target)?;
                copy_dir(&item.path(), &target)?;
            } else {
                std::fs::copy(item.path(), &target)?;
            }
        }
        Ok(())
    }

    #[tokio::test]
    async fn truncation_lowers_the_recorded_end() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        store_with_five_entries(dir.path()).await?;
        {
            let mut store = LogStore::open(dir.path())?;
            store.truncate(log_id(1, 4)).await?;
        }
        // Entries 4 and 5 were removed by Raft, not lost: the log opens and ends at 3.
        let mut store = LogStore::open(dir.path())?;
        assert_eq!(store.get_log_state().await?.last_log_id, Some(log_id(1, 3)));
        store.blocking_append([blank(2, 4)]).await?;
        drop(store);
        LogStore::open(dir.path())?;
        // Losing the re-appended entry is detected again.
        cut_log(dir.path(), 4)?;
        assert_corrupt(LogStore::open(dir.path()), "lost data");
        Ok(())
    }

    #[tokio::test]
    async fn a_purge_past_the_last_entry_counts_as_the_end() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        store_with_five_entries(dir.path()).await?;
        {
            // A snapshot installed beyond the log purges everything up to its end.
            let mut store = LogStore::open(dir.path())?;
            store.purge(log_id(1, 9)).await?;
            store.inner.db.flush()?;
        }
        let mut store = LogStore::open(dir.path())?;
        assert_eq!(store.get_log_state().await?.last_log_id, Some(log_id(1, 9)));
        Ok(())
    }

    #[tokio::test]
    async fn the_log_end_record_survives_a_torn_slot_but_not_total_damage() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        store_with_five_entries(dir.path()).await?;
        let path = dir.path().join("log-end");
        let mut bytes = std::fs::read(&path)?;
        assert_eq!(bytes.len(), 2 * LOG_END_SLOT_BYTES);
        let newest = bytes
            .chunks(LOG_END_SLOT_BYTES)
            .enumerate()
            .filter_map(|(slot, b)| decode_log_end_slot(b).map(|(seq, _)| (seq, slot)))
            .max()
            .map(|(_, slot)| slot)
            .ok_or_else(|| anyhow::anyhow!("no valid slot"))?;
        // A write torn in the newest slot: the other slot (an older, lower end) is used.
        bytes[newest * LOG_END_SLOT_BYTES] ^= 0xff;
        std::fs::write(&path, &bytes)?;
        LogStore::open(dir.path())?;
        // Both slots damaged: refused, naming the file.
        std::fs::write(&path, vec![0x5a; 2 * LOG_END_SLOT_BYTES])?;
        assert_corrupt(LogStore::open(dir.path()), "log-end");
        Ok(())
    }

    #[tokio::test]
    async fn a_data_directory_without_the_record_gets_one() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        store_with_five_entries(dir.path()).await?;
        std::fs::remove_file(dir.path().join("log-end"))?;
        LogStore::open(dir.path())?;
        cut_log(dir.path(), 5)?;
        assert_corrupt(LogStore::open(dir.path()), "lost data");
        Ok(())
    }

    #[tokio::test]
    async fn hole_in_the_log_refuses_open() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        store_with_entries(dir.path(), 8, 256).await?;
        let (middle, _) = record_of(dir.path(), 4)?;
        let (last, _) = record_of(dir.path(), 8)?;
        assert_ne!(middle, last);
        std::fs::remove_file(middle)?;
        assert_corrupt(LogStore::open(dir.path()), "hole");
        Ok(())
    }

    #[tokio::test]
    async fn corrupt_vote_is_a_storage_error_and_refuses_open() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        store_with_five_entries(dir.path()).await?;
        let mut good = encode_value(&Vote::<NodeId>::new(7, 1))?;
        good[0] ^= 0x40;
        poke(dir.path(), KEY_VOTE, &good)?;
        assert_corrupt(LogStore::open(dir.path()), "vote");
        Ok(())
    }

    #[test]
    fn garbage_with_a_valid_checksum_still_fails_to_decode() {
        for garbage in [
            &b""[..],
            b"\x01",
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        ] {
            let mut bytes = garbage.to_vec();
            bytes.extend_from_slice(&fnv1a64(garbage).to_le_bytes());
            assert!(
                decode_value::<Entry<TypeConfig>>(&bytes).is_err(),
                "{garbage:?}"
            );
            assert!(decode_value::<Vote<NodeId>>(&bytes).is_err(), "{garbage:?}");
        }
        for short in [&b""[..], b"1234567"] {
            assert!(matches!(
                decode_value::<Vote<NodeId>>(short),
                Err(CodecError::TooShort { .. })
            ));
        }
    }

    #[tokio::test]
    async fn purged_log_without_its_snapshot_is_refused() -> anyhow::Result<()> {
        // t0: entries 1..=5, purge up to 3 (as after a snapshot at 3)
        // the snapshot dir is lost -> refused; a snapshot at 3 or later -> accepted
        let dir = tempfile::tempdir()?;
        store_with_five_entries(dir.path()).await?;
        let mut store = LogStore::open(dir.path())?;
        assert!(
            store.check_snapshot_covers_purged(None).is_ok(),
            "nothing purged yet"
        );
        store.purge(log_id(1, 3)).await?;

        match store.check_snapshot_covers_purged(None) {
            Err(e @ OpenError::Corrupt { .. }) => {
                assert!(e.to_string().contains("snapshot directory"), "{e}")
            }
            other => anyhow::bail!("expected Corrupt, got {other:?}"),
        }
        assert!(
            store
                .check_snapshot_covers_purged(Some(log_id(1, 2)))
                .is_err()
        );
        store.check_snapshot_covers_purged(Some(log_id(1, 3)))?;
        store.check_snapshot_covers_purged(Some(log_id(1, 5)))?;
        Ok(())
    }

    #[test]
    fn unreadable_data_dir_names_the_path() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"x")?;
        let message = match LogStore::open(&file) {
            Err(e) => e.to_string(),
            Ok(_) => anyhow::bail!("opened a log under a regular file"),
        };
        assert!(message.contains("not-a-dir"), "{message}");
        Ok(())
    }

    /// Prints the cost of one append (1 and 100 entries) with and without the fdatasync step.
    /// Not a benchmark harness; run by hand:
    /// `cargo test -p conchd --lib append_cost -- --ignored --nocapture`
    /// (`CONCH_BENCH_DIR` chooses the file system; default: the temp dir).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore]
    async fn append_cost() -> anyhow::Result<()> {
        let base =
            std::env::var_os("CONCH_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
        println!("dir: {}", base.display());
        println!(
            "{:<8} {:>8} {:>7} {:>10} {:>10} {:>10} {:>12}",
            "mode", "entries", "rounds", "mean_us", "p50_us", "p99_us", "us/entry"
        );
        for durability in [Durability::Flush, Durability::Fsync] {
            for per_append in [1u64, 100] {
                let dir = tempfile::tempdir_in(&base)?;
                let mut store = LogStore::open_with_durability(dir.path(), durability)?;
                let rounds: u64 = if per_append == 1 { 500 } else { 100 };
                let mut next = 1u64;
                // Warm up: file growth and sled's first segments.
                for _ in 0..20 {
                    store
                        .blocking_append((next..next + per_append).map(|i| batch(1, i)))
                        .await?;
                    next += per_append;
                }
                let mut samples = Vec::with_capacity(rounds as usize);
                for _ in 0..rounds {
                    let entries: Vec<_> = (next..next + per_append).map(|i| batch(1, i)).collect();
                    next += per_append;
                    let t = Instant::now();
                    store.blocking_append(entries).await?;
                    samples.push(t.elapsed());
                }
                samples.sort();
                let mean = samples.iter().sum::<Duration>() / rounds as u32;
                let p = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize];
                println!(
                    "{:<8} {:>8} {:>7} {:>10.1} {:>10.1} {:>10.1} {:>12.2}",
                    format!("{durability:?}"),
                    per_append,
                    rounds,
                    mean.as_secs_f64() * 1e6,
                    p(0.5).as_secs_f64() * 1e6,
                    p(0.99).as_secs_f64() * 1e6,
                    mean.as_secs_f64() * 1e6 / per_append as f64,
                );
            }
        }
        Ok(())
    }
}
