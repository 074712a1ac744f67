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
//! up to [`mem_log::MEM_LOG_BYTES`] of their records (always the last entry). Older entries
//! after the purge point (a lagging follower's, or the log between snapshots) are read back from
//! the segments when asked for, so memory does not grow with the log kept between snapshots.
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

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use openraft::{Entry, StorageIOError, Vote};
use serde::de::DeserializeOwned;

use super::codec::encode_value;
use super::early::EarlyReplication;
use super::wal::{SEGMENT_BYTES, Wal};
use super::{LogId, NodeId, StorageError, TypeConfig};
use crate::state::version;
use crate::support::metrics::LogMetrics;

mod log_end;
mod mem_log;
mod meta;
mod raft_storage;
mod sled_entries;
#[cfg(test)]
mod tests;
mod vote_file;

use log_end::LogEnd;
use mem_log::MemLog;
use meta::{
    KEY_PURGED, KEY_VOTE, READ_FORMATS, check_data_format, check_meta, format_needed,
    put_back_lost_values, read_meta, write_data_format,
};
use sled_entries::migrate_sled_entries;
use vote_file::{read_vote_file, vote_file_path, write_vote_file};

/// How many bytes of records one AppendEntries carries at most (one entry always, whatever its
/// size). openraft asks for up to `max_payload_entries` entries per call and gives each call one
/// heartbeat interval: a follower catching up on large entries (a flood of 10 kB semaphores batches
/// into entries of hundreds of kB) would otherwise be sent tens of megabytes at once, a call that
/// cannot finish in time on a busy machine, is retried as large, and never lets it catch up.
pub(crate) const REPLICATION_BATCH_BYTES: u64 = 1024 * 1024;

/// sled's page cache size: sled holds only a few small values.
pub(crate) const CACHE_CAPACITY_BYTES: u64 = 8 * 1024 * 1024;

/// sled's background flush period. Votes and purges that delete a segment flush explicitly; this
/// only bounds how long a purge point or a committed id stays in memory.
pub(crate) const FLUSH_EVERY_MS: u64 = 1000;

/// How far an acknowledged write is made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Durability {
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
        crate::support::release::RELEASE,
        READ_FORMATS.start(),
        READ_FORMATS.end()
    )]
    Format { path: PathBuf, found: u32 },
    #[error(
        "{}: written by conch {release} (data format {found}); this build, conch {}, reads data \
         formats {} to {}: run conch {release} or a later release on this directory",
        path.display(),
        crate::support::release::RELEASE,
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
    pub(crate) fn is_locked(&self) -> bool {
        // sled 0.34 says so only in the message of an `io::ErrorKind::Other`.
        matches!(self, OpenError::Sled { source: sled::Error::Io(e), .. }
            if e.to_string().contains("could not acquire lock"))
    }
}

fn io_other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn fsync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
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

/// The Raft log and vote. Cheap to clone: clones share one store (the log reader is one).
#[derive(Clone)]
pub(crate) struct LogStore {
    inner: Arc<Inner>,
    metrics: LogMetrics,
    /// The leader's sends to its followers before its own sync (see [`super::early`]).
    early: Arc<EarlyReplication>,
}

impl LogStore {
    /// Reports append timings and the commit index to `metrics` from now on.
    pub(crate) fn set_metrics(&mut self, metrics: LogMetrics) {
        self.metrics = metrics;
    }

    /// Hands every append on the leader to `early` before it is synced.
    pub(crate) fn set_early_replication(&mut self, early: Arc<EarlyReplication>) {
        self.early = early;
    }

    /// Opens (creating if needed) the log under `<data_dir>`, with [`Durability::Fsync`], and
    /// checks every stored value.
    pub(crate) fn open(data_dir: &Path) -> Result<LogStore, OpenError> {
        Self::open_with_durability(data_dir, Durability::Fsync)
    }

    /// Like [`LogStore::open`], choosing how far writes are made durable.
    pub(crate) fn open_with_durability(
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
    pub(crate) fn check_snapshot_covers_purged(
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
    pub(crate) async fn seed_purged(&self, last: LogId) -> Result<(), StorageError> {
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
    pub(crate) fn size_on_disk(&self) -> u64 {
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
    pub(crate) fn speak_at_most(&self, cluster_version_max: u32) -> Result<(), OpenError> {
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
        if let Some(delay) = crate::sim_hooks::disk_faults::sync_delay(&self.inner.data_dir) {
            tokio::time::sleep(delay).await;
        }
    }

    /// sled's flush, then (with [`Durability::Fsync`]) `fdatasync` of its file, in one blocking
    /// call; then, when given, `log_end` is recorded as the end of the log.
    async fn sync_meta(&self, log_end: Option<u64>) -> io::Result<()> {
        self.slow_disk().await;
        let inner = Arc::clone(&self.inner);
        crate::sim_hooks::blocking::unblock(move || {
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
        crate::sim_hooks::disk_faults::flushed(&self.path);
        if self.durability == Durability::Fsync {
            self.data_file.sync_data()?;
        }
        Ok(())
    }

    /// Writes one metadata value, not yet flushed.
    fn put_meta(&self, key: &[u8], value: Vec<u8>) -> sled::Result<()> {
        let before = self.db.insert(key, value)?;
        crate::sim_hooks::disk_faults::value_written(&self.path, key, before.as_deref());
        Ok(())
    }

    fn lock_wal(&self) -> MutexGuard<'_, Wal> {
        self.wal
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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
