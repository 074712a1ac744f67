//! How the log store and the segment files store a value: `bincode(value) ++
//! fnv1a64(bincode(value))` (little-endian), so a damaged value is found when read, never
//! trusted. A leaf of `raft/`.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::state::fnv1a64;

/// Why a stored value could not be decoded.
#[derive(Debug, thiserror::Error)]
pub(super) enum CodecError {
    #[error("value too short for its checksum ({len} bytes)")]
    TooShort { len: usize },
    #[error("checksum mismatch (stored {stored:#018x}, computed {computed:#018x})")]
    Checksum { stored: u64, computed: u64 },
    #[error("decode: {0}")]
    Decode(bincode::Error),
    #[error("encode: {0}")]
    Encode(bincode::Error),
}

pub(super) fn encode_value<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut bytes = bincode::serialize(value).map_err(CodecError::Encode)?;
    let checksum = fnv1a64(&bytes);
    bytes.extend_from_slice(&checksum.to_le_bytes());
    Ok(bytes)
}

pub(super) fn decode_value<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let Some(split) = bytes.len().checked_sub(8) else {
        return Err(CodecError::TooShort { len: bytes.len() });
    };
    let (payload, trailer) = bytes.split_at(split);
    let mut stored = [0u8; 8];
    stored.copy_from_slice(trailer);
    let stored = u64::from_le_bytes(stored);
    let computed = fnv1a64(payload);
    if stored != computed {
        return Err(CodecError::Checksum { stored, computed });
    }
    bincode::deserialize(payload).map_err(CodecError::Decode)
}
