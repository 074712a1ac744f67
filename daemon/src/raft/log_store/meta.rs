//! The log's metadata in sled: the keys of the vote, the committed id, the purge point and the
//! data format marker; checking them at open, and the data formats this build reads.

use std::path::Path;

use openraft::{Entry, EntryPayload, Vote};
use serde::de::DeserializeOwned;

use super::OpenError;
use crate::raft::codec::{decode_value, encode_value};
use crate::raft::{LogId, NodeId, TypeConfig};
use crate::state::{Cmd, version};

pub(super) const KEY_VOTE: &[u8] = b"m:vote";
pub(super) const KEY_COMMITTED: &[u8] = b"m:committed";
pub(super) const KEY_PURGED: &[u8] = b"m:purged";
pub(super) const KEY_FORMAT: &[u8] = b"m:format";
pub(super) const KEY_RELEASE: &[u8] = b"m:release";

/// The data formats this build reads: those of every kept release up to its own (see
/// `state/version.rs`).
pub(super) const READ_FORMATS: std::ops::RangeInclusive<u32> =
    version::OLDEST_DATA_FORMAT..=version::NEWEST_DATA_FORMAT;

/// The data format an entry needs a reader to know: that of the cluster version it raises to,
/// if it raises one.
pub(super) fn format_needed(entry: &Entry<TypeConfig>) -> Option<u32> {
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

pub(super) fn read_meta<T: DeserializeOwned>(
    db: &sled::Db,
    key: &[u8],
) -> Result<Option<T>, String> {
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
pub(super) fn put_back_lost_values(db: &sled::Db, path: &Path) -> Result<(), OpenError> {
    let lost = crate::sim_hooks::disk_faults::take_lost_values(path);
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
pub(super) fn check_meta(db: &sled::Db) -> Result<Option<LogId>, String> {
    read_meta::<Vote<NodeId>>(db, KEY_VOTE).map_err(|e| format!("vote: {e}"))?;
    read_meta::<Option<LogId>>(db, KEY_COMMITTED).map_err(|e| format!("committed log id: {e}"))?;
    read_meta::<LogId>(db, KEY_PURGED).map_err(|e| format!("purged log id: {e}"))
}

/// Writes 0.1.0's data format into a new store; refuses a store of a format this build does
/// not read (none: format 1) before anything in it is decoded. Returns the store's format.
pub(super) fn check_data_format(db: &sled::Db, path: &Path) -> Result<u32, OpenError> {
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
pub(super) fn write_data_format(db: &sled::Db, format: u32) -> Result<(), String> {
    let format = encode_value(&format).map_err(|e| e.to_string())?;
    let release =
        encode_value(&crate::support::release::RELEASE.to_string()).map_err(|e| e.to_string())?;
    db.insert(KEY_RELEASE, release)
        .and_then(|_| db.insert(KEY_FORMAT, format))
        .and_then(|_| db.flush())
        .map(|_| ())
        .map_err(|e| e.to_string())
}
