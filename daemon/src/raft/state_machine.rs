//! openraft's state machine over [`AppliedState`], with snapshots persisted as files.
//!
//! The state itself lives in memory; what survives a restart is the newest snapshot in
//! `<data_dir>/snapshots/` plus the Raft log (see `log_store`). On start, [`StateMachine::open`]
//! restores the snapshot into [`AppliedState`]; openraft then re-applies the log from the
//! snapshot up to the saved committed id.
//!
//! Snapshot file (also the bytes sent to followers), integers little-endian:
//!
//! ```text
//! "CONCHSNP" | format version u32 | meta_len u64 | bincode(SnapshotMeta) | state_len u64 |
//! State::encode_snapshot() | fnv1a64 of everything before, u64
//! ```
//!
//! This envelope is the file's only header: the state section is the state's bare encoding, in
//! the data format of the state's cluster version, and the format version is that data format
//! plus one (version 8 is data format 7, release 0.1.0's). A build reads the versions of every
//! data format it reads ([`READ_VERSIONS`]), so a snapshot written by the previous release, or by
//! this one before the cluster version moved on, opens as it is; anything else is refused in one
//! line. See `docs/design.md` (Snapshot format).
//!
//! Invariants:
//! - `last_applied` and `last_membership` describe exactly the entries applied to `applied`
//! - a snapshot file is complete once it has its final name: written as `snap-<seq>.tmp`,
//!   fsynced, renamed to `snap-<seq>.snap`, directory fsynced
//! - after a build or install returns, the directory holds only the newest snapshot, and no
//!   snapshot replaces one with a later `last_log_id` unless it is installed from the leader
//! - a snapshot is checked (checksum, meta, state decode) before it replaces anything

use std::fs::File;
use std::io::{self, Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError,
};

use super::{LogId, NodeId, StorageError, TypeConfig};
use crate::applied::AppliedState;
use crate::metrics::SnapshotMetrics;
use crate::state::fnv1a64;
use crate::state::{Reply, SnapshotError, State, version};

pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, BasicNode>;
pub type StoredMembership = openraft::StoredMembership<NodeId, BasicNode>;

const MAGIC: &[u8; 8] = b"CONCHSNP";
/// The envelope version of a state in `data_format`.
const fn envelope_version(data_format: u32) -> u32 {
    data_format + 1
}

/// The envelope versions this build reads: those of every data format it reads.
const READ_VERSIONS: std::ops::RangeInclusive<u32> =
    envelope_version(version::OLDEST_DATA_FORMAT)..=envelope_version(version::NEWEST_DATA_FORMAT);
/// magic + version + meta_len + state_len + checksum.
const FIXED_LEN: usize = 8 + 4 + 8 + 8 + 8;

/// Why the snapshot directory could not be opened or restored. Each variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("create snapshot directory {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("list snapshot directory {}: {source}", path.display())]
    ListDir { path: PathBuf, source: io::Error },
    #[error("read snapshot {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("snapshot {} is corrupt: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    /// A snapshot of another data format: refused, never converted.
    #[error("{}: {source}", path.display())]
    Format {
        path: PathBuf,
        source: EnvelopeError,
    },
}

/// Why snapshot bytes are not a valid snapshot envelope.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    #[error("too short ({len} bytes)")]
    TooShort { len: usize },
    #[error("not a conch snapshot (bad magic)")]
    Magic,
    #[error(
        "written by {} (snapshot version {found}); this build, conch {}, reads snapshot versions \
         {} to {}: {}",
        if *found < *READ_VERSIONS.start() { "a development build of conch older than release 0.1.0" } else { "a newer release of conch" },
        crate::release::RELEASE,
        READ_VERSIONS.start(),
        READ_VERSIONS.end(),
        if *found < *READ_VERSIONS.start() {
            "start this node with an empty data directory (in a cluster, remove the node and add \
             it back empty)"
        } else {
            "run the release that wrote it, or a later one"
        }
    )]
    Version { found: u32 },
    #[error("checksum mismatch (stored {stored:#018x}, computed {computed:#018x})")]
    Checksum { stored: u64, computed: u64 },
    #[error("section lengths do not add up: {0}")]
    Length(String),
    #[error("decode snapshot meta: {0}")]
    Meta(bincode::Error),
    #[error("encode snapshot meta: {0}")]
    EncodeMeta(bincode::Error),
}

/// Wraps the encoded state (in `data_format`) and its meta into the snapshot file format.
pub fn encode_envelope(
    meta: &SnapshotMeta,
    state: &[u8],
    data_format: u32,
) -> Result<Vec<u8>, EnvelopeError> {
    let meta_bytes = bincode::serialize(meta).map_err(EnvelopeError::EncodeMeta)?;
    let mut out = Vec::with_capacity(FIXED_LEN + meta_bytes.len() + state.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&envelope_version(data_format).to_le_bytes());
    out.extend_from_slice(&(meta_bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(&meta_bytes);
    out.extend_from_slice(&(state.len() as u64).to_le_bytes());
    out.extend_from_slice(state);
    let checksum = fnv1a64(&out);
    out.extend_from_slice(&checksum.to_le_bytes());
    Ok(out)
}

/// Checks the envelope (magic, version, checksum, lengths) and returns the meta and the encoded
/// state, as [`State::decode_snapshot`] reads it. The state itself is not decoded here.
pub fn decode_envelope(bytes: &[u8]) -> Result<(SnapshotMeta, &[u8]), EnvelopeError> {
    if bytes.len() < FIXED_LEN {
        return Err(EnvelopeError::TooShort { len: bytes.len() });
    }
    if &bytes[..8] != MAGIC {
        return Err(EnvelopeError::Magic);
    }
    let version = u32::from_le_bytes(array(&bytes[8..12]));
    if !READ_VERSIONS.contains(&version) {
        return Err(EnvelopeError::Version { found: version });
    }
    let (body, trailer) = bytes.split_at(bytes.len() - 8);
    let stored = u64::from_le_bytes(array(trailer));
    let computed = fnv1a64(body);
    if stored != computed {
        return Err(EnvelopeError::Checksum { stored, computed });
    }

    let meta_len = u64::from_le_bytes(array(&body[12..20]));
    let meta_end = usize::try_from(meta_len)
        .ok()
        .and_then(|len| 20usize.checked_add(len))
        .filter(|end| end.checked_add(8).is_some_and(|e| e <= body.len()))
        .ok_or_else(|| EnvelopeError::Length(format!("meta_len {meta_len}")))?;
    let meta: SnapshotMeta =
        bincode::deserialize(&body[20..meta_end]).map_err(EnvelopeError::Meta)?;
    let state_len = u64::from_le_bytes(array(&body[meta_end..meta_end + 8]));
    let state_start = meta_end + 8;
    if usize::try_from(state_len).ok() != Some(body.len() - state_start) {
        return Err(EnvelopeError::Length(format!(
            "state_len {state_len}, {} bytes present",
            body.len() - state_start
        )));
    }
    Ok((meta, &body[state_start..]))
}

/// Copies an exactly-sized slice into an array (callers slice exact lengths).
fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(bytes);
    out
}

fn snapshot_id(last_log_id: Option<LogId>, seq: u64) -> String {
    match last_log_id {
        Some(id) => format!("{}-{}-{seq}", id.leader_id.term, id.index),
        None => format!("0-0-{seq}"),
    }
}

/// The failures of snapshot file operations, before they become a `StorageError`.
#[derive(Debug, thiserror::Error)]
enum SnapshotFileError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("snapshot {}: {source}", path.display())]
    Envelope {
        path: PathBuf,
        source: EnvelopeError,
    },
    #[error("received snapshot: {0}")]
    Received(EnvelopeError),
    #[error("received snapshot meta {inside} does not match the announced {announced}")]
    MetaMismatch { inside: String, announced: String },
    #[error(transparent)]
    State(#[from] SnapshotError),
    #[error("snapshot task failed: {0}")]
    Join(String),
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SnapshotFileError {
    let path = path.to_path_buf();
    move |source| SnapshotFileError::Io { op, path, source }
}

fn fsync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// `snap-<seq>.snap` -> seq.
fn parse_snapshot_name(name: &str) -> Option<u64> {
    name.strip_prefix("snap-")?
        .strip_suffix(".snap")?
        .parse()
        .ok()
}

struct Current {
    seq: u64,
    last_log_id: Option<LogId>,
}

struct Files {
    next_seq: u64,
    current: Option<Current>,
}

/// The snapshot directory; one lock orders builds (which run in their own task), installs and
/// reads.
struct SnapshotDir {
    dir: PathBuf,
    files: Mutex<Files>,
}

impl SnapshotDir {
    fn path_of(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("snap-{seq:020}.snap"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Files> {
        self.files
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Writes `bytes` as the newest snapshot and removes every other file. Blocking.
    fn persist(
        &self,
        files: &mut Files,
        bytes: &[u8],
        last_log_id: Option<LogId>,
    ) -> Result<PathBuf, SnapshotFileError> {
        let seq = files.next_seq;
        files.next_seq += 1;
        let tmp = self.dir.join(format!("snap-{seq:020}.tmp"));
        let path = self.path_of(seq);
        {
            let mut file = File::create(&tmp).map_err(io_err("create", &tmp))?;
            file.write_all(bytes).map_err(io_err("write", &tmp))?;
            file.sync_all().map_err(io_err("fsync", &tmp))?;
        }
        std::fs::rename(&tmp, &path).map_err(io_err("rename", &tmp))?;
        fsync_dir(&self.dir).map_err(io_err("fsync", &self.dir))?;
        files.current = Some(Current { seq, last_log_id });
        self.remove_all_but(seq);
        Ok(path)
    }

    /// Best effort: a leftover older file is removed on the next persist or open.
    fn remove_all_but(&self, keep: u64) {
        let listing = match std::fs::read_dir(&self.dir) {
            Ok(listing) => listing,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "list snapshot directory");
                return;
            }
        };
        for item in listing.flatten() {
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            let stale =
                name.ends_with(".tmp") || parse_snapshot_name(name).is_some_and(|s| s != keep);
            if stale && let Err(e) = std::fs::remove_file(item.path()) {
                tracing::warn!(file = %item.path().display(), error = %e, "remove old snapshot");
            }
        }
    }

    /// Reads and checks the current snapshot file. Blocking.
    fn read_current(&self) -> Result<Option<(SnapshotMeta, Vec<u8>)>, SnapshotFileError> {
        let files = self.lock();
        let Some(current) = files.current.as_ref() else {
            return Ok(None);
        };
        let path = self.path_of(current.seq);
        let bytes = std::fs::read(&path).map_err(io_err("read", &path))?;
        let (meta, _) = decode_envelope(&bytes).map_err(|source| SnapshotFileError::Envelope {
            path: path.clone(),
            source,
        })?;
        Ok(Some((meta, bytes)))
    }
}

/// Runs blocking snapshot file work off the async workers.
async fn blocking<T, F>(work: F) -> Result<T, SnapshotFileError>
where
    F: FnOnce() -> Result<T, SnapshotFileError> + Send + 'static,
    T: Send + 'static,
{
    crate::blocking::unblock(work)
        .await
        .map_err(|e| SnapshotFileError::Join(e.to_string()))?
}

/// openraft's view of the applied state. Open it with [`StateMachine::open`] before
/// `Raft::new`.
pub struct StateMachine {
    applied: Arc<AppliedState>,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    snapshots: Arc<SnapshotDir>,
    metrics: SnapshotMetrics,
}

impl StateMachine {
    /// Reports snapshots built and installed to `metrics` from now on.
    pub fn set_metrics(&mut self, metrics: SnapshotMetrics) {
        self.metrics = metrics;
    }

    /// Opens `<data_dir>/snapshots` and restores its newest snapshot into `applied`.
    ///
    /// A snapshot that fails its checksum or does not decode is an error: the node must not
    /// serve a state it cannot vouch for.
    pub fn open(data_dir: &Path, applied: Arc<AppliedState>) -> Result<StateMachine, OpenError> {
        let dir = data_dir.join("snapshots");
        std::fs::create_dir_all(&dir).map_err(|source| OpenError::CreateDir {
            path: dir.clone(),
            source,
        })?;
        for d in [data_dir, dir.as_path()] {
            fsync_dir(d).map_err(|source| OpenError::CreateDir {
                path: d.to_path_buf(),
                source,
            })?;
        }

        let list_err = |source| OpenError::ListDir {
            path: dir.clone(),
            source,
        };
        let mut found: Vec<(u64, PathBuf)> = Vec::new();
        for item in std::fs::read_dir(&dir).map_err(list_err)? {
            let item = item.map_err(list_err)?;
            let name = item.file_name();
            let Some(name) = name.to_str() else {
                tracing::warn!(file = %item.path().display(), "ignoring unexpected file in snapshot directory");
                continue;
            };
            if name.ends_with(".tmp") {
                // An interrupted write: never renamed, so never acknowledged.
                if let Err(e) = std::fs::remove_file(item.path()) {
                    tracing::warn!(file = %item.path().display(), error = %e, "remove partial snapshot");
                }
            } else if let Some(seq) = parse_snapshot_name(name) {
                found.push((seq, item.path()));
            } else {
                tracing::warn!(file = %item.path().display(), "ignoring unexpected file in snapshot directory");
            }
        }
        found.sort_by_key(|(seq, _)| *seq);

        let snapshots = Arc::new(SnapshotDir {
            dir: dir.clone(),
            files: Mutex::new(Files {
                next_seq: 1,
                current: None,
            }),
        });
        let mut sm = StateMachine {
            metrics: SnapshotMetrics::default(),
            applied,
            last_applied: None,
            last_membership: StoredMembership::default(),
            snapshots,
        };

        let Some((seq, path)) = found.pop() else {
            tracing::info!(dir = %dir.display(), "no snapshot; starting from an empty state");
            return Ok(sm);
        };
        let bytes = std::fs::read(&path).map_err(|source| OpenError::Read {
            path: path.clone(),
            source,
        })?;
        let corrupt = |reason: String| OpenError::Corrupt {
            path: path.clone(),
            reason,
        };
        let (meta, state_bytes) = decode_envelope(&bytes).map_err(|e| match e {
            EnvelopeError::Version { .. } => OpenError::Format {
                path: path.clone(),
                source: e,
            },
            e => corrupt(e.to_string()),
        })?;
        let state = State::decode_snapshot(state_bytes).map_err(|e| corrupt(e.to_string()))?;

        let index = meta.last_log_id.map_or(0, |id| id.index);
        sm.applied
            .note_term(meta.last_log_id.map_or(0, |id| id.leader_id.term));
        sm.applied.replace(state, index);
        sm.last_applied = meta.last_log_id;
        sm.last_membership = meta.last_membership.clone();
        {
            let mut files = sm.snapshots.lock();
            files.next_seq = seq + 1;
            files.current = Some(Current {
                seq,
                last_log_id: meta.last_log_id,
            });
        }
        // Older files left by a crash between rename and cleanup.
        sm.snapshots.remove_all_but(seq);
        tracing::info!(
            file = %path.display(),
            last_log_id = ?meta.last_log_id,
            membership = %meta.last_membership,
            bytes = bytes.len(),
            "snapshot restored"
        );
        Ok(sm)
    }

    /// The last log id applied (or restored from a snapshot).
    pub fn last_applied(&self) -> Option<LogId> {
        self.last_applied
    }
}

/// Builds a snapshot of the state as it was when the builder was made.
pub struct SnapshotBuilder {
    /// `State::encode_snapshot` and its data format, taken by `get_snapshot_builder` while no
    /// apply can run.
    state: Result<(Vec<u8>, u32), String>,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    snapshots: Arc<SnapshotDir>,
    metrics: SnapshotMetrics,
    /// When the builder was asked for: the state's encoding is part of the build's time.
    started: std::time::Instant,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let state = self
            .state
            .as_ref()
            .map_err(|reason| StorageIOError::read_state_machine(AnyError::error(reason)))?
            .clone();
        let last_applied = self.last_applied;
        let last_membership = self.last_membership.clone();
        let snapshots = Arc::clone(&self.snapshots);
        let (meta, bytes) = blocking(move || {
            let mut files = snapshots.lock();
            let id = snapshot_id(last_applied, files.next_seq);
            let meta = SnapshotMeta {
                last_log_id: last_applied,
                last_membership,
                snapshot_id: id,
            };
            let (state, data_format) = &state;
            let bytes = encode_envelope(&meta, state, *data_format).map_err(|source| {
                SnapshotFileError::Envelope { path: snapshots.dir.clone(), source }
            })?;
            let newer = files.current.as_ref().is_some_and(|c| c.last_log_id > last_applied);
            if newer {
                // An install raced ahead of this build; keep the installed one.
                files.next_seq += 1;
                tracing::info!(snapshot_id = %meta.snapshot_id, "built snapshot is older than the stored one; not kept");
            } else {
                let path = snapshots.persist(&mut files, &bytes, last_applied)?;
                tracing::info!(
                    snapshot_id = %meta.snapshot_id,
                    file = %path.display(),
                    bytes = bytes.len(),
                    "snapshot built"
                );
            }
            Ok((meta, bytes))
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        self.metrics.built.inc();
        crate::metrics::observe(&self.metrics.seconds, self.started.elapsed());
        self.metrics
            .last_bytes
            .set(i64::try_from(bytes.len()).unwrap_or(i64::MAX));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.last_applied, self.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<Reply>>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries = entries.into_iter();
        let mut replies = Vec::with_capacity(entries.size_hint().0);
        for entry in entries {
            let log_id = entry.log_id;
            self.applied.note_term(log_id.leader_id.term);
            match entry.payload {
                EntryPayload::Normal(batch) => {
                    replies.push(self.applied.apply(log_id.index, &batch));
                }
                EntryPayload::Blank => {
                    self.applied.mark_applied(log_id.index);
                    replies.push(Vec::new());
                }
                EntryPayload::Membership(membership) => {
                    tracing::info!(%log_id, %membership, "membership applied");
                    self.last_membership = StoredMembership::new(Some(log_id), membership);
                    self.applied.mark_applied(log_id.index);
                    replies.push(Vec::new());
                }
            }
            self.last_applied = Some(log_id);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            started: std::time::Instant::now(),
            metrics: self.metrics.clone(),
            state: self.applied.encode_snapshot().map_err(|e| e.to_string()),
            last_applied: self.last_applied,
            last_membership: self.last_membership.clone(),
            snapshots: Arc::clone(&self.snapshots),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        self.metrics
            .last_bytes
            .set(i64::try_from(bytes.len()).unwrap_or(i64::MAX));
        let announced = meta.clone();
        let snapshots = Arc::clone(&self.snapshots);
        let state = blocking(move || {
            // Check everything before touching the stored snapshot or the state.
            let (inside, state_bytes) =
                decode_envelope(&bytes).map_err(SnapshotFileError::Received)?;
            if inside != announced {
                return Err(SnapshotFileError::MetaMismatch {
                    inside: inside.to_string(),
                    announced: announced.to_string(),
                });
            }
            let state = State::decode_snapshot(state_bytes)?;
            let mut files = snapshots.lock();
            snapshots.persist(&mut files, &bytes, announced.last_log_id)?;
            Ok(state)
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;

        self.applied
            .note_term(meta.last_log_id.map_or(0, |id| id.leader_id.term));
        self.applied
            .replace(state, meta.last_log_id.map_or(0, |id| id.index));
        self.last_applied = meta.last_log_id;
        self.last_membership = meta.last_membership.clone();
        tracing::info!(snapshot_id = %meta.snapshot_id, last_log_id = ?meta.last_log_id, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let snapshots = Arc::clone(&self.snapshots);
        let current = blocking(move || snapshots.read_current())
            .await
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(current.map(|(meta, bytes)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use openraft::{CommittedLeaderId, Membership};

    use super::*;
    use crate::state::Batch;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn voters(ids: &[u64]) -> Membership<NodeId, BasicNode> {
        let set: BTreeSet<u64> = ids.iter().copied().collect();
        Membership::new(vec![set], None)
    }

    fn meta(term: u64, index: u64) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(log_id(term, index)),
            last_membership: StoredMembership::new(Some(log_id(1, 2)), voters(&[1, 2, 3])),
            snapshot_id: format!("{term}-{index}-1"),
        }
    }

    fn open(dir: &Path) -> Result<StateMachine, OpenError> {
        StateMachine::open(dir, AppliedState::new(State::new(), 0))
    }

    fn snapshot_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join("snapshots"))
            .map(|listing| {
                listing
                    .flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    #[test]
    fn envelope_round_trips_and_every_flipped_byte_is_caught() -> anyhow::Result<()> {
        let meta = meta(3, 40);
        let bytes = encode_envelope(&meta, b"opaque state bytes", 7)?;
        let (decoded, state) = decode_envelope(&bytes)?;
        assert_eq!(decoded, meta);
        assert_eq!(state, b"opaque state bytes");

        for i in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x01;
            assert!(
                decode_envelope(&damaged).is_err(),
                "flip at byte {i} went unnoticed"
            );
        }
        for len in 0..bytes.len() {
            assert!(
                decode_envelope(&bytes[..len]).is_err(),
                "truncation to {len} went unnoticed"
            );
        }
        Ok(())
    }

    /// An envelope laid out byte by byte, independent of [`encode_envelope`].
    fn raw_envelope(version: u32, meta: &SnapshotMeta, state_section: &[u8]) -> Vec<u8> {
        let meta_bytes = bincode::serialize(meta).unwrap_or_default();
        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"CONCHSNP");
        bytes.extend_from_slice(&version.to_le_bytes());
        bytes.extend_from_slice(&(meta_bytes.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&meta_bytes);
        bytes.extend_from_slice(&(state_section.len() as u64).to_le_bytes());
        bytes.extend_from_slice(state_section);
        let checksum = fnv1a64(&bytes);
        bytes.extend_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// A state with something in it, its snapshot encoding and its hash.
    fn sample_state() -> anyhow::Result<(Vec<u8>, u64)> {
        let applied = AppliedState::new(State::new(), 0);
        let replies = applied.apply(
            1,
            &Batch {
                now_ns: 1_000,
                cmds: vec![crate::state::Cmd::CreateNamespace {
                    name: "kept".into(),
                    description: "from an older build".into(),
                    metadata: Default::default(),
                }],
                wall_ns: 1_000,
            },
        );
        anyhow::ensure!(
            replies.iter().all(Result::is_ok),
            "sample command refused: {replies:?}"
        );
        Ok((applied.encode_snapshot()?.0, applied.read(State::hash)))
    }

    fn write_snapshot_file(dir: &Path, seq: u64, bytes: &[u8]) -> anyhow::Result<()> {
        let snapshots = dir.join("snapshots");
        std::fs::create_dir_all(&snapshots)?;
        std::fs::write(snapshots.join(format!("snap-{seq:020}.snap")), bytes)?;
        Ok(())
    }

    #[test]
    fn the_version_written_follows_the_data_format_and_carries_the_bare_state_encoding()
    -> anyhow::Result<()> {
        let (state, _) = sample_state()?;
        for (format, version) in [(7, 8), (8, 9)] {
            let bytes = encode_envelope(&meta(3, 40), &state, format)?;
            assert_eq!(bytes, raw_envelope(version, &meta(3, 40), &state));
            let (_, section) = decode_envelope(&bytes)?;
            assert_eq!(section, state.as_slice());
        }
        Ok(())
    }

    #[test]
    fn a_snapshot_of_0_1_0_opens_and_every_version_not_kept_is_refused_in_one_line()
    -> anyhow::Result<()> {
        let (state, hash) = sample_state()?;
        let dir = tempfile::tempdir()?;
        write_snapshot_file(dir.path(), 5, &raw_envelope(8, &meta(2, 1), &state))?;
        let opened = open(dir.path())?;
        assert_eq!(opened.applied.read(State::hash), hash);
        let this = crate::release::RELEASE;
        for (version, writer, advice) in [
            (
                6,
                "a development build of conch older than release 0.1.0",
                "start this node",
            ),
            (
                7,
                "a development build of conch older than release 0.1.0",
                "start this node",
            ),
            (
                10,
                "a newer release of conch",
                "run the release that wrote it, or a later one",
            ),
        ] {
            let dir = tempfile::tempdir()?;
            write_snapshot_file(dir.path(), 5, &raw_envelope(version, &meta(2, 1), &state))?;
            let Err(err) = open(dir.path()) else {
                anyhow::bail!("a version {version} snapshot was restored");
            };
            let message = err.to_string();
            anyhow::ensure!(
                message.starts_with(&format!(
                    "{}: written by {writer} (snapshot version {version}); this build, conch \
                     {this}, reads snapshot versions 8 to 9: {advice}",
                    dir.path()
                        .join("snapshots")
                        .join("snap-00000000000000000005.snap")
                        .display()
                )) && !message.contains('\n'),
                "{message}"
            );
        }
        Ok(())
    }

    #[test]
    fn lengths_that_lie_are_rejected_even_with_a_valid_checksum() {
        // magic, version, meta_len = u64::MAX, then a correct checksum.
        let mut bytes = Vec::new();
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&8u32.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend_from_slice(&0u64.to_le_bytes());
        let checksum = fnv1a64(&bytes);
        bytes.extend_from_slice(&checksum.to_le_bytes());
        assert!(matches!(
            decode_envelope(&bytes),
            Err(EnvelopeError::Length(_))
        ));
    }

    #[test]
    fn garbage_snapshot_file_refuses_open_and_names_the_file() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("snapshots"))?;
        let file = dir
            .path()
            .join("snapshots")
            .join("snap-00000000000000000007.snap");
        std::fs::write(&file, b"this is not a snapshot at all, just some bytes")?;

        match open(dir.path()) {
            Err(e @ OpenError::Corrupt { .. }) => {
                assert!(
                    e.to_string().contains("snap-00000000000000000007.snap"),
                    "{e}"
                );
            }
            Err(other) => anyhow::bail!("expected Corrupt, got {other}"),
            Ok(_) => anyhow::bail!("a garbage snapshot was accepted"),
        }
        Ok(())
    }

    #[test]
    fn truncated_snapshot_file_refuses_open() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("snapshots"))?;
        let bytes = encode_envelope(&meta(2, 9), &[7u8; 300], 7)?;
        let file = dir
            .path()
            .join("snapshots")
            .join("snap-00000000000000000003.snap");
        std::fs::write(&file, &bytes[..bytes.len() - 100])?;
        // A leftover partial write is dropped, not read.
        std::fs::write(
            dir.path()
                .join("snapshots")
                .join("snap-00000000000000000004.tmp"),
            b"x",
        )?;

        assert!(matches!(open(dir.path()), Err(OpenError::Corrupt { .. })));
        assert_eq!(
            snapshot_files(dir.path()),
            vec!["snap-00000000000000000003.snap"]
        );
        Ok(())
    }

    #[tokio::test]
    async fn install_rejects_damaged_or_mismatched_snapshots_and_keeps_the_state()
    -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut sm = open(dir.path())?;
        sm.apply([Entry::<TypeConfig> {
            log_id: log_id(1, 1),
            payload: EntryPayload::Membership(voters(&[1])),
        }])
        .await?;

        // Garbage.
        let garbage = Box::new(Cursor::new(b"garbage".to_vec()));
        assert!(sm.install_snapshot(&meta(2, 9), garbage).await.is_err());

        // A valid envelope announced under another meta.
        let bytes = encode_envelope(&meta(2, 9), b"state", 7)?;
        let other = meta(2, 10);
        assert!(
            sm.install_snapshot(&other, Box::new(Cursor::new(bytes)))
                .await
                .is_err()
        );

        assert_eq!(sm.applied_state().await?.0, Some(log_id(1, 1)));
        assert!(sm.get_current_snapshot().await?.is_none());
        assert!(snapshot_files(dir.path()).is_empty());
        Ok(())
    }

    #[tokio::test]
    async fn blank_and_membership_entries_reply_empty_and_advance_applied() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let applied = AppliedState::new(State::new(), 0);
        let mut sm = StateMachine::open(dir.path(), Arc::clone(&applied))?;
        let replies = sm
            .apply([
                Entry::<TypeConfig> {
                    log_id: log_id(1, 1),
                    payload: EntryPayload::Blank,
                },
                Entry::<TypeConfig> {
                    log_id: log_id(1, 2),
                    payload: EntryPayload::Membership(voters(&[1, 2])),
                },
            ])
            .await?;
        assert_eq!(replies, vec![Vec::new(), Vec::new()]);
        assert_eq!(applied.applied_index(), 2);
        let (last, membership) = sm.applied_state().await?;
        assert_eq!(last, Some(log_id(1, 2)));
        assert_eq!(
            membership,
            StoredMembership::new(Some(log_id(1, 2)), voters(&[1, 2]))
        );
        Ok(())
    }

    // Needs the state machine's apply_batch and snapshot codec.
    #[tokio::test]
    async fn built_snapshot_is_restored_on_reopen() -> anyhow::Result<()> {
        // apply       membership {1,2,3} at (1,1), empty batch at (1,2), blank at (2,3)
        // build       -> one file; build again -> still one file (the newest)
        // reopen      -> applied index 3, last_applied (2,3), membership from (1,1)
        let dir = tempfile::tempdir()?;
        let built = {
            let mut sm = open(dir.path())?;
            sm.apply([
                Entry::<TypeConfig> {
                    log_id: log_id(1, 1),
                    payload: EntryPayload::Membership(voters(&[1, 2, 3])),
                },
                Entry::<TypeConfig> {
                    log_id: log_id(1, 2),
                    payload: EntryPayload::Normal(Batch {
                        now_ns: 5,
                        cmds: vec![],
                        wall_ns: 5,
                    }),
                },
                Entry::<TypeConfig> {
                    log_id: log_id(2, 3),
                    payload: EntryPayload::Blank,
                },
            ])
            .await?;
            let first = sm.get_snapshot_builder().await.build_snapshot().await?;
            let second = sm.get_snapshot_builder().await.build_snapshot().await?;
            assert_ne!(first.meta.snapshot_id, second.meta.snapshot_id);
            assert_eq!(snapshot_files(dir.path()).len(), 1);
            let current = sm.get_current_snapshot().await?.map(|s| s.meta);
            assert_eq!(current.as_ref(), Some(&second.meta));
            second.meta
        };

        let applied = AppliedState::new(State::new(), 0);
        let mut sm = StateMachine::open(dir.path(), Arc::clone(&applied))?;
        assert_eq!(applied.applied_index(), 3);
        let (last, membership) = sm.applied_state().await?;
        assert_eq!(last, Some(log_id(2, 3)));
        assert_eq!(
            membership,
            StoredMembership::new(Some(log_id(1, 1)), voters(&[1, 2, 3]))
        );
        assert_eq!(
            sm.get_current_snapshot().await?.map(|s| s.meta),
            Some(built)
        );

        // A damaged state section (valid envelope) is refused too.
        let path = dir
            .path()
            .join("snapshots")
            .join(&snapshot_files(dir.path())[0]);
        let bytes = encode_envelope(&meta(2, 3), b"\xff\xff\xff not a state", 7)?;
        std::fs::write(&path, bytes)?;
        assert!(matches!(open(dir.path()), Err(OpenError::Corrupt { .. })));
        Ok(())
    }
}
