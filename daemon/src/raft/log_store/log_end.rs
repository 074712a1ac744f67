//! `<data_dir>/log-end`: the durable end of the log, kept outside the segments and compared with
//! them at open.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::fsync_dir;
use crate::state::fnv1a64;

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
pub(super) struct LogEnd {
    file: File,
    pub(super) path: PathBuf,
    /// Sequence number of the newest slot written, and the index it holds.
    last: Mutex<(u64, u64)>,
}

pub(super) const LOG_END_SLOT_BYTES: usize = 32;

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
pub(super) fn decode_log_end_slot(slot: &[u8]) -> Option<(u64, u64)> {
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
    pub(super) fn open(data_dir: &Path, current_end: u64) -> Result<(LogEnd, Option<u64>), String> {
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
    pub(super) fn write(&self, index: u64, sync: bool) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.1 == index && !sync && last.0 > 0 {
            return Ok(());
        }
        let seq = last.0.wrapping_add(1);
        let offset = (seq % 2) * LOG_END_SLOT_BYTES as u64;
        crate::sim_hooks::disk_faults::before_write(
            &self.file,
            &self.path,
            offset,
            LOG_END_SLOT_BYTES,
        );
        self.file
            .write_all_at(&encode_log_end_slot(seq, index), offset)?;
        if sync {
            self.file.sync_data()?;
            crate::sim_hooks::disk_faults::synced(&self.path);
        }
        *last = (seq, index);
        Ok(())
    }
}
