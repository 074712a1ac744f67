//! The entries as stores written before the segment files kept them, in sled under `e` +
//! big-endian index, and their move into segments at open.

use std::fs::File;
use std::path::Path;

use openraft::Entry;

use crate::raft::TypeConfig;
use crate::raft::codec::decode_value;
use crate::raft::wal::{SEGMENT_BYTES, Wal};

const ENTRY_PREFIX: u8 = b'e';

pub(super) fn entry_key(index: u64) -> [u8; 9] {
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

/// Moves the entries that stores written before the segment files kept in sled into a segment,
/// once: the segment is written and synced first, then the entries leave sled in one batch,
/// flushed and synced. A crash in between leaves them in both; the next open starts over from
/// sled, replacing the segments. Returns how many entries moved.
pub(super) fn migrate_sled_entries(
    db: &sled::Db,
    data_file: &File,
    wal_dir: &Path,
) -> Result<usize, String> {
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
