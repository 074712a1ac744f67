//! The canonical encoding, the state hash and snapshots.
//!
//! What always holds here: the encoding is bincode (varint integers, little endian, trailing
//! bytes rejected) of the canonical data only, and the hash is FNV-1a 64 of exactly those bytes;
//! both are the same on every node and build. A snapshot is those bytes with no header (the
//! storage layer frames them). Decoding never trusts derived data: every index is rebuilt from
//! the canonical data and every invariant is checked before the state is used.
//!
//! The encoding follows the state's cluster version (`version.rs`), so that a node of the
//! previous release reads it until the cluster version moves on:
//! - data format 7 (cluster version 1, release 0.1.0): [`Data`]'s serde layout
//! - data format 8 (cluster version 2): format 7's bytes, then [`Since8`]
//!
//! A later format appends its own fields after the earlier ones', never changing them. Decoding
//! reads whichever of these the bytes hold: the fields after format 7's are present exactly
//! when the cluster version is past 1, so a state's format is its cluster version's.

use bincode::Options;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::data::{Data, State};
use super::hash::Fnv1a;
use super::types::*;
use super::version::{self, ClusterVersion};

pub(super) fn bincode_options() -> impl Options {
    // Varint integers, little endian, trailing bytes rejected.
    bincode::DefaultOptions::new()
}

/// The fields data format 8 appends to format 7's.
#[derive(Serialize, Deserialize)]
struct Since8 {
    cluster_version: ClusterVersion,
}

/// Writes the canonical encoding of `data` in its cluster version's data format.
fn encode_into<W: std::io::Write>(mut out: W, data: &Data) -> bincode::Result<()> {
    bincode_options().serialize_into(&mut out, data)?;
    if version::data_format(data.cluster_version.0) >= 8 {
        let since8 = Since8 {
            cluster_version: data.cluster_version,
        };
        bincode_options().serialize_into(&mut out, &since8)?;
    }
    Ok(())
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
        let _ = encode_into(&mut hasher, &self.data);
        hasher.0
    }

    /// The replicated cluster version.
    pub fn cluster_version(&self) -> ClusterVersion {
        self.data.cluster_version
    }

    /// The data format the state is encoded in: its cluster version's.
    pub fn data_format(&self) -> u32 {
        version::data_format(self.data.cluster_version.0)
    }

    /// The canonical data's bytes in the state's data format, header-less: the caller frames
    /// them.
    pub fn encode_snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        let mut out = Vec::new();
        encode_into(&mut out, &self.data).map_err(|e| SnapshotError::Encode(e.to_string()))?;
        Ok(out)
    }

    /// Decodes and checks exactly what [`State::encode_snapshot`] returns (no header), in any
    /// data format this build reads; indexes are rebuilt, never trusted from the bytes.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<State, SnapshotError> {
        let decode = |e: bincode::Error| SnapshotError::Decode(e.to_string());
        let options = || bincode_options().with_limit(bytes.len() as u64);
        let mut rest = bytes;
        let mut data: Data = options().deserialize_from(&mut rest).map_err(decode)?;
        if !rest.is_empty() {
            let since8: Since8 = options().deserialize_from(&mut rest).map_err(decode)?;
            if since8.cluster_version.0 <= version::BASE {
                return Err(SnapshotError::Inconsistent(format!(
                    "data format 8 with cluster version {}, which format 7 encodes",
                    since8.cluster_version.0
                )));
            }
            data.cluster_version = since8.cluster_version;
        }
        if !rest.is_empty() {
            return Err(SnapshotError::Decode(format!(
                "{} bytes after the state",
                rest.len()
            )));
        }
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
