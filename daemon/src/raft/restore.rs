//! `conchd restore FILE --data-dir DIR --id N --initial-cluster 1=…,2=…,3=…`: seeds a new, empty
//! data directory from a backup file, so that a new cluster started from the restored
//! directories starts with the backed-up state.
//!
//! Checks, before anything is written: the file's SHA-256, its format version, its data format
//! (that of any kept release up to this build's: the state is restored in the data format it
//! was written in, so its cluster version is the backed-up cluster's), that the state decodes
//! and that its recomputed hash is the one the file states; `--id` is a member of `--initial-cluster`; the data directory is absent or empty.
//!
//! What is written (each node restored with its own `--id` and the same `--initial-cluster`),
//! with the directory locked throughout as `conchd` locks it (see `data_dir.rs`):
//! 0. `node-id`: the `--id` restored as, and `cluster-name`: the `--cluster-name`, if given;
//! 1. `cluster-id`: the new cluster's id, derived from the backup's SHA-256 and the members
//!    (as parsed: `1=addr,2=addr,…`), so every restored node gets the same id without talking
//!    to the others, and it differs from the backed-up cluster's;
//! 2. the Raft log, empty, purged up to the log id (term 0, index = the backup's applied index,
//!    at least 1): the log continues after the snapshot;
//! 3. the snapshot (through the state machine's own install path, checked again): the state,
//!    with that log id as its last and the new members as its membership.
//!
//! No vote is written. Every restored node thus starts as an initialized member of the new
//! cluster (openraft counts a node with a last log id as initialized, so nobody bootstraps),
//! with the same snapshot and no log; elections proceed normally, and a node added later
//! receives the snapshot. Written last, the snapshot marks a restore complete: a directory left
//! by an interrupted restore has a purge point without its snapshot, which `conchd` refuses to
//! start from (and a failed restore removes what it wrote).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use conch_proto::backup;
use openraft::storage::RaftStateMachine;
use openraft::{BasicNode, CommittedLeaderId, Membership};
use sha2::{Digest, Sha256};

use crate::data_dir::DataDir;
use crate::data_dir::identity::ClusterId;
use crate::raft::LogId;
use crate::raft::applied::AppliedState;
use crate::raft::log_store::LogStore;
use crate::raft::state_machine::{SnapshotMeta, StateMachine, StoredMembership, encode_envelope};
use crate::state::{State, version};

/// What `conchd restore` is given (its flags, see `conchd restore --help`).
#[derive(Clone, Debug)]
pub struct RestoreArgs {
    /// The backup file.
    pub file: PathBuf,
    /// The new node's data directory: absent or empty.
    pub data_dir: PathBuf,
    /// The new node's id (a member of --initial-cluster).
    pub id: u64,
    /// The new cluster's members, as id=host:port pairs, the same on every restored node.
    pub initial_cluster: String,
    /// The new cluster's name, recorded in the data directory (start the nodes with the same
    /// --cluster-name, or none).
    pub cluster_name: Option<String>,
}

/// Why a restore did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// Refused before anything was written: bad arguments, a non-empty directory, a damaged or
    /// foreign backup file.
    #[error("{0}")]
    Refused(String),
    /// Writing the data directory failed (what was written is removed).
    #[error("{0}")]
    Failed(String),
}

/// What was restored, for the one line printed.
#[derive(Debug)]
pub struct Restored {
    pub applied_index: u64,
    pub applied_term: u64,
    pub state_hash: u64,
    pub cluster_id: String,
}

/// The id of the cluster restored from the backup whose SHA-256 is `checksum`, with `members`.
pub(crate) fn restored_cluster_id(checksum: &[u8], members: &BTreeMap<u64, String>) -> String {
    let members: Vec<String> = members.iter().map(|(id, a)| format!("{id}={a}")).collect();
    let mut hasher = Sha256::new();
    hasher.update(b"conch restored cluster\0");
    hasher.update(checksum);
    hasher.update(members.join(",").as_bytes());
    let digest: [u8; 32] = hasher.finalize().into();
    backup::hex(&digest[..16])
}

/// Runs `conchd restore`.
pub fn run(args: &RestoreArgs) -> Result<Restored, RestoreError> {
    let refused = RestoreError::Refused;
    let members = crate::config::parse_initial_cluster(&args.initial_cluster)
        .map_err(|e| refused(e.to_string()))?;
    if !members.contains_key(&args.id) {
        return Err(refused(format!(
            "--initial-cluster does not include this node's --id {}",
            args.id
        )));
    }
    if let Some(name) = &args.cluster_name {
        crate::data_dir::check_cluster_name(name).map_err(refused)?;
    }
    let existed = check_empty(&args.data_dir)?;
    let file = args.file.display();
    let bytes = std::fs::read(&args.file).map_err(|e| refused(format!("read {file}: {e}")))?;
    let (verified, state_bytes) =
        backup::verify(&bytes).map_err(|e| refused(format!("{file}: {e}")))?;
    let header = &verified.header;
    let readable = version::OLDEST_DATA_FORMAT..=version::NEWEST_DATA_FORMAT;
    if !readable.contains(&header.data_format) {
        let writer = match header.release.as_str() {
            "" => "a newer release of conch".to_string(),
            release => format!("conch {release}"),
        };
        return Err(refused(format!(
            "{file}: written by {writer} (data format {}); this build, conch {}, restores data \
             formats {} to {}: restore it with the release that wrote it, or a later one",
            header.data_format,
            crate::support::release::RELEASE,
            readable.start(),
            readable.end(),
        )));
    }
    let state = State::decode_snapshot(state_bytes)
        .map_err(|e| refused(format!("{file}: the state does not decode: {e}")))?;
    if state.data_format() != header.data_format {
        return Err(refused(format!(
            "{file}: the header says data format {}, the state is in data format {}",
            header.data_format,
            state.data_format()
        )));
    }
    let hash = state.hash();
    if hash != header.state_hash {
        return Err(refused(format!(
            "{file}: state hash mismatch (the file states {:016x}, the decoded state hashes to \
             {hash:016x})",
            header.state_hash
        )));
    }
    let cluster_id = restored_cluster_id(&verified.checksum, &members);
    let last = LogId::new(CommittedLeaderId::new(0, 0), header.applied_index.max(1));
    let voters: BTreeSet<u64> = members.keys().copied().collect();
    let nodes: BTreeMap<u64, BasicNode> = members
        .iter()
        .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
        .collect();
    let meta = SnapshotMeta {
        last_log_id: Some(last),
        last_membership: StoredMembership::new(Some(last), Membership::new(vec![voters], nodes)),
        snapshot_id: format!("0-{}-restored", last.index),
    };
    let envelope = encode_envelope(&meta, state_bytes, header.data_format)
        .map_err(|e| RestoreError::Failed(format!("encode the snapshot: {e}")))?;

    if let Err(e) = write(args, &cluster_id, last, &meta, envelope) {
        remove_written(&args.data_dir, existed);
        return Err(RestoreError::Failed(e));
    }
    Ok(Restored {
        applied_index: header.applied_index,
        applied_term: header.applied_term,
        state_hash: hash,
        cluster_id,
    })
}

/// Refuses a data directory that exists and is not empty. Returns whether it exists.
fn check_empty(dir: &Path) -> Result<bool, RestoreError> {
    let refused = |reason: String| {
        RestoreError::Refused(format!("data directory {}: {reason}", dir.display()))
    };
    match std::fs::read_dir(dir) {
        Ok(mut listing) => match listing.next() {
            None => Ok(true),
            Some(_) => Err(refused(
                "is not empty; restore only into a new, empty directory (nothing was written)"
                    .into(),
            )),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Err(refused(
            "is a file, not a directory (nothing was written)".into(),
        )),
        Err(e) => Err(refused(format!("cannot be read: {e}"))),
    }
}

/// Writes the node's identity, the cluster id, the purged log and the snapshot, in that order,
/// holding the directory's lock.
fn write(
    args: &RestoreArgs,
    cluster_id: &str,
    last: LogId,
    meta: &SnapshotMeta,
    envelope: Vec<u8>,
) -> Result<(), String> {
    let dir = args.data_dir.as_path();
    let _locked = DataDir::open(dir, args.id, args.cluster_name.as_deref(), false)
        .map_err(|e| e.to_string())?;
    ClusterId::open(dir)
        .and_then(|id| id.adopt(cluster_id))
        .map_err(|e| format!("cluster id: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("start the async runtime: {e}"))?;
    runtime.block_on(async {
        let log = LogStore::open(dir).map_err(|e| e.to_string())?;
        log.seed_purged(last)
            .await
            .map_err(|e| format!("seed the raft log: {e}"))?;
        drop(log);
        let applied = AppliedState::new(State::new(), 0);
        let mut sm = StateMachine::open(dir, Arc::clone(&applied)).map_err(|e| e.to_string())?;
        sm.install_snapshot(meta, Box::new(Cursor::new(envelope)))
            .await
            .map_err(|e| format!("write the snapshot: {e}"))?;
        Ok(())
    })
}

/// Best effort after a failed write: the directory as it was (absent, or empty).
fn remove_written(dir: &Path, existed: bool) {
    if !existed {
        let _ = std::fs::remove_dir_all(dir);
        return;
    }
    if let Ok(listing) = std::fs::read_dir(dir) {
        for item in listing.flatten() {
            let path = item.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorage;

    use super::*;
    use crate::state::{Batch, Cmd};

    const MEMBERS: &str = "1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103";

    /// A backup file of a state holding one namespace, at log position (41, 3).
    fn backup_file(dir: &Path) -> anyhow::Result<(PathBuf, u64)> {
        let applied = AppliedState::new(State::new(), 0);
        applied.note_term(3);
        let replies = applied.apply(
            41,
            &Batch {
                now_ns: 5_000,
                cmds: vec![Cmd::CreateNamespace {
                    name: "restored".into(),
                    description: String::new(),
                    metadata: Default::default(),
                }],
                wall_ns: 5_000,
            },
        );
        anyhow::ensure!(replies.iter().all(Result::is_ok), "{replies:?}");
        let (state, index, term) = applied.read_at(State::encode_snapshot);
        let state = state?;
        let header = backup::Header {
            data_format: version::OLDEST_DATA_FORMAT,
            applied_index: index,
            applied_term: term,
            state_hash: crate::state::fnv1a64(&state),
            created_at_ns: 0,
            state_len: 0,
            cluster_id: [7; 16],
            release: String::new(),
        };
        let (head, trailer) = backup::encode(header, &state);
        let path = dir.join("backup.conch");
        std::fs::write(&path, [&head[..], &state, &trailer].concat())?;
        Ok((path, applied.read(State::hash)))
    }

    fn args(file: &Path, data_dir: &Path, id: u64) -> RestoreArgs {
        RestoreArgs {
            file: file.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            id,
            initial_cluster: MEMBERS.into(),
            cluster_name: Some("restored".into()),
        }
    }

    #[test]
    fn restored_directories_share_the_state_and_a_new_cluster_id() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let (file, hash) = backup_file(tmp.path())?;
        let mut ids = Vec::new();
        for id in [1, 2] {
            let dir = tmp.path().join(format!("node{id}"));
            let restored = run(&args(&file, &dir, id))?;
            assert_eq!((restored.applied_index, restored.applied_term), (41, 3));
            assert_eq!(restored.state_hash, hash);
            ids.push(restored.cluster_id.clone());

            let cluster_id = ClusterId::open(&dir)?.get();
            assert_eq!(cluster_id.as_deref(), Some(restored.cluster_id.as_str()));
            assert_eq!(crate::data_dir::read_node_id(&dir)?, Some(id));
            assert_eq!(
                crate::data_dir::read_cluster_name(&dir)?.as_deref(),
                Some("restored")
            );
            let mut log = LogStore::open(&dir)?;
            let applied = AppliedState::new(State::new(), 0);
            let mut sm = StateMachine::open(&dir, Arc::clone(&applied))?;
            log.check_snapshot_covers_purged(sm.last_applied())?;
            let expected = LogId::new(CommittedLeaderId::new(0, 0), 41);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let state = runtime.block_on(log.get_log_state())?;
            assert_eq!(state.last_purged_log_id, Some(expected));
            assert_eq!(state.last_log_id, Some(expected));
            assert_eq!(runtime.block_on(log.read_vote())?, None);
            let (last, membership) = runtime.block_on(sm.applied_state())?;
            assert_eq!(last, Some(expected));
            let voters: Vec<u64> = membership.membership().voter_ids().collect();
            assert_eq!(voters, vec![1, 2, 3]);
            assert_eq!(applied.read(State::hash), hash);
            assert_eq!(applied.applied_index(), 41);
        }
        assert_eq!(
            ids[0], ids[1],
            "every restored node gets the same cluster id"
        );
        assert_ne!(ids[0], backup::hex(&[7; 16]));
        Ok(())
    }

    #[test]
    fn refusals_write_nothing() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let (file, _) = backup_file(tmp.path())?;

        let full = tmp.path().join("full");
        std::fs::create_dir(&full)?;
        std::fs::write(full.join("something"), b"x")?;
        let Err(RestoreError::Refused(message)) = run(&args(&file, &full, 1)) else {
            anyhow::bail!("a non-empty directory was restored into");
        };
        assert!(message.contains("is not empty"), "{message}");
        assert_eq!(std::fs::read_dir(&full)?.count(), 1);

        let mut bytes = std::fs::read(&file)?;
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
        let damaged = tmp.path().join("damaged.conch");
        std::fs::write(&damaged, &bytes)?;
        let fresh = tmp.path().join("fresh");
        let Err(RestoreError::Refused(message)) = run(&args(&damaged, &fresh, 1)) else {
            anyhow::bail!("a damaged backup was restored");
        };
        assert!(message.contains("checksum mismatch"), "{message}");
        assert!(!fresh.exists());

        let Err(RestoreError::Refused(message)) = run(&args(&file, &fresh, 4)) else {
            anyhow::bail!("a node outside --initial-cluster was restored");
        };
        assert!(message.contains("--id 4"), "{message}");
        assert!(!fresh.exists());
        Ok(())
    }
}
