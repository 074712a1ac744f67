//! openraft's `RaftLogReader` and `RaftLogStorage` for [`LogStore`]: reading entries (in
//! batches of at most [`REPLICATION_BATCH_BYTES`]), appending, truncating and purging, the vote
//! and the committed id.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, Entry, OptionalSend, RaftLogReader, StorageIOError, Vote};

use super::meta::{KEY_COMMITTED, KEY_PURGED, KEY_VOTE};
use super::vote_file::write_vote_file;
use super::{Durability, LogStore, REPLICATION_BATCH_BYTES, io_other};
use crate::base::write_trace::Mark;
use crate::raft::codec::encode_value;
use crate::raft::{LogId, NodeId, StorageError, TypeConfig};
use crate::support::metrics::observe;

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
        crate::sim_hooks::blocking::unblock(move || write_vote_file(&data_dir, &vote))
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
        crate::sim_hooks::blocking::unblock(move || {
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
            crate::sim_hooks::blocking::unblock(move || {
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
