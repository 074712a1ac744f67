//! The canonical encoding, the state hash and snapshots.
//!
//! What always holds here: the encoding is bincode (varint integers, little endian, trailing
//! bytes rejected) of the canonical data only, and the hash is FNV-1a 64 of exactly those bytes;
//! both are the same on every node and build. A snapshot is those bytes with no header (the
//! storage layer frames them). Decoding never trusts derived data: every index is rebuilt from
//! the canonical data and every invariant is checked before the state is used.

use bincode::Options;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::data::{Data, State};
use super::hash::Fnv1a;
use super::types::*;

pub(super) fn bincode_options() -> impl Options {
    // Varint integers, little endian, trailing bytes rejected.
    bincode::DefaultOptions::new()
}

impl Serialize for State {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.data.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for State {
    /// Deserializes the canonical data and rebuilds (and checks) every index.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let data = Data::deserialize(deserializer)?;
        State::from_data(data).map_err(serde::de::Error::custom)
    }
}

impl State {
    /// Read access to the access control store.
    pub fn auth(&self) -> &super::auth::Auth {
        &self.data.auth
    }

    /// A 64-bit hash of the whole state; equal states hash equal on every node and build.
    pub fn hash(&self) -> u64 {
        let mut hasher = Fnv1a(Fnv1a::OFFSET_BASIS);
        // Writing into the hasher cannot fail, and the data has no unserializable parts; a
        // failure would still hash deterministically (to a truncated prefix).
        let _ = bincode_options().serialize_into(&mut hasher, &self.data);
        hasher.0
    }

    /// The canonical data's bytes, header-less: the caller frames them.
    pub fn encode_snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        bincode_options()
            .serialize(&self.data)
            .map_err(|e| SnapshotError::Encode(e.to_string()))
    }

    /// Decodes and checks exactly what [`State::encode_snapshot`] returns (no header); indexes
    /// are rebuilt, never trusted from the bytes.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<State, SnapshotError> {
        let data: Data = bincode_options()
            .with_limit(bytes.len() as u64)
            .deserialize(bytes)
            .map_err(|e| SnapshotError::Decode(e.to_string()))?;
        State::from_data(data).map_err(SnapshotError::Inconsistent)
    }

    /// Builds the state from canonical data: fills every derived field and index, then checks
    /// every invariant.
    fn from_data(data: Data) -> Result<State, String> {
        let state = State::rebuild(data)?;
        state.check_invariants()?;
        Ok(state)
    }
}
