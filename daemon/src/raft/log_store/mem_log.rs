//! The newest log entries, kept in memory up to [`MEM_LOG_BYTES`] where the log reader finds
//! them without a read, with the last log id and the purge point.

use std::collections::VecDeque;

use openraft::{Entry, EntryPayload};

use crate::raft::{LogId, TypeConfig};
use crate::state::Cmd;

/// How many bytes the newest entries kept in memory may take (the last entry is kept whatever
/// its size), counted as [`held_bytes`] does. Replication and apply read entries just appended;
/// older ones come from the segment files.
pub(super) const MEM_LOG_BYTES: u64 = 1024 * 1024;

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

#[derive(Default)]
pub(super) struct MemLog {
    /// The newest entries, consecutive, ending with `last` (when the log holds entries after
    /// the purge point); those before them are in the segments only.
    pub(super) entries: VecDeque<Entry<TypeConfig>>,
    /// The record size of each of `entries` and what it holds in memory ([`held_bytes`]).
    pub(super) sizes: VecDeque<(u64, u64)>,
    /// The sum of what `entries` hold in memory.
    pub(super) bytes: u64,
    /// The last entry of the log, when one follows the purge point.
    pub(super) last: Option<LogId>,
    pub(super) purged: Option<LogId>,
}

impl MemLog {
    /// The last entry, else the purge point (a purge clears `last` when it covers it).
    pub(super) fn last_log_id(&self) -> Option<LogId> {
        self.last.or(self.purged)
    }

    /// Adds `entries` (following the last one) with their record sizes, then lets the oldest
    /// go past [`MEM_LOG_BYTES`].
    pub(super) fn push(
        &mut self,
        entries: Vec<Entry<TypeConfig>>,
        sizes: impl Iterator<Item = u64>,
    ) {
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

    pub(super) fn pop_front(&mut self) {
        self.entries.pop_front();
        self.bytes -= self.sizes.pop_front().map_or(0, |(_, held)| held);
    }

    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.sizes.clear();
        self.bytes = 0;
        self.last = None;
    }

    pub(super) fn first_cached(&self) -> Option<u64> {
        self.entries.front().map(|e| e.log_id.index)
    }
}
