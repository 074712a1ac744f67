//! `ConchAdmin.Backup`: a consistent copy of the replicated state, streamed as a backup file
//! (`conch_proto::backup`).
//!
//! Any node answers, from its own applied state, after a read-index barrier
//! ([`Node::linearizable`], the path every linearizable read takes): the leader confirms its
//! leadership with a quorum after the call began and this node applies everything committed
//! before it, so the copy holds every write acknowledged before the call. This is chosen over
//! forwarding the call to the leader because it needs nothing new on the peer connections (no
//! stream to relay), keeps the encoding and the bytes off the leader, and gives the same
//! guarantee.
//!
//! Writes wait only while the state is encoded under the read lock (the encoding a snapshot
//! takes, with the log position of exactly that state); the state hash, the SHA-256 and the
//! stream work on that copy, sent in chunks of [`CHUNK_BYTES`].

use std::pin::Pin;
use std::sync::Arc;

use conch_proto::backup::{self as format, Header};
use conch_proto::conch::BackupChunk;
use futures::Stream;
use tonic::Status;

use super::status::ApiError;
use crate::node::Node;
use crate::state::{State, fnv1a64};

/// The largest chunk sent: well under a client's default 4 MiB message limit.
pub(crate) const CHUNK_BYTES: usize = 1024 * 1024;

pub(crate) type BackupStream = Pin<Box<dyn Stream<Item = Result<BackupChunk, Status>> + Send>>;

/// The backup file of this node's applied state, once it holds every acknowledged write.
pub(crate) async fn stream(node: &Node) -> Result<BackupStream, ApiError> {
    node.linearizable().await?;
    let (encoded, index, term) = node.applied.read_at(encode);
    let (state, data_format) =
        encoded.map_err(|e| ApiError::Internal(format!("encode the state: {e}")))?;
    let cluster_id = node.cluster_id.get().unwrap_or_default();
    let file = crate::sim_hooks::blocking::unblock(move || {
        file(state, data_format, index, term, &cluster_id)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("backup task: {e}")))?;
    tracing::info!(
        applied_index = index,
        term,
        bytes = file.len(),
        "backup taken"
    );
    let file = Arc::new(file);
    let chunks = file.len().div_ceil(CHUNK_BYTES);
    Ok(Box::pin(futures::stream::iter((0..chunks).map(move |i| {
        let end = ((i + 1) * CHUNK_BYTES).min(file.len());
        Ok(BackupChunk {
            data: file[i * CHUNK_BYTES..end].to_vec(),
        })
    }))))
}

/// The state's canonical encoding and its data format.
fn encode(state: &State) -> Result<(Vec<u8>, u32), crate::state::SnapshotError> {
    Ok((state.encode_snapshot()?, state.data_format()))
}

/// The whole backup file of `state` (the state's canonical encoding, in `data_format`) at log
/// position (`index`, `term`). A state in 0.1.0's data format is written in the backup format
/// that release reads, which does not record the release; later ones record it.
fn file(state: Vec<u8>, data_format: u32, index: u64, term: u64, cluster_id: &str) -> Vec<u8> {
    let release = match data_format {
        crate::state::version::OLDEST_DATA_FORMAT => String::new(),
        _ => crate::support::release::RELEASE.to_string(),
    };
    let header = Header {
        data_format,
        release,
        applied_index: index,
        applied_term: term,
        // The state hash is FNV-1a 64 of exactly these bytes.
        state_hash: fnv1a64(&state),
        created_at_ns: crate::support::clock::wall_ns(),
        state_len: state.len() as u64,
        cluster_id: format::cluster_id_bytes(cluster_id),
    };
    let (head, trailer) = format::encode(header, &state);
    let mut out = Vec::with_capacity(head.len() + state.len() + trailer.len());
    out.extend_from_slice(&head);
    out.extend_from_slice(&state);
    out.extend_from_slice(&trailer);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::applied::AppliedState;
    use crate::state::{Batch, Cmd};

    #[test]
    fn the_file_verifies_and_carries_the_state_hash_and_position() {
        let applied = AppliedState::new(State::new(), 0);
        applied.note_term(4);
        let replies = applied.apply(
            9,
            &Batch {
                now_ns: 1_000,
                cmds: vec![Cmd::CreateNamespace {
                    name: "kept".into(),
                    description: String::new(),
                    metadata: Default::default(),
                }],
                wall_ns: 1_000,
            },
        );
        assert!(replies.iter().all(Result::is_ok), "{replies:?}");
        let (encoded, index, term) = applied.read_at(encode);
        assert_eq!((index, term), (9, 4));
        let (state, data_format) = encoded.expect("encode");
        let bytes = file(state, data_format, index, term, &"0f".repeat(16));
        let (verified, state) = format::verify(&bytes).expect("valid file");
        assert_eq!(verified.header.applied_index, 9);
        assert_eq!(verified.header.applied_term, 4);
        // A state at the first cluster version is written as release 0.1.0 writes it.
        assert_eq!(verified.header.data_format, 7);
        assert_eq!(verified.header.release, "");
        assert_eq!(verified.header.state_hash, applied.read(State::hash));
        let decoded = State::decode_snapshot(state).expect("decodes");
        assert_eq!(decoded.hash(), verified.header.state_hash);
    }
}
