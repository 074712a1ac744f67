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
use crate::raft::applied::AppliedState;
use crate::state::fnv1a64;
use crate::state::{Reply, SnapshotError, State, version};
use crate::support::metrics::SnapshotMetrics;

pub(crate) type SnapshotMeta = openraft::SnapshotMeta<NodeId, BasicNode>;
pub(crate) type StoredMembership = openraft::StoredMembership<NodeId, BasicNode>;

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
        crate::support::release::RELEASE,
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
pub(crate) fn encode_envelope(
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
pub(crate) fn decode_envelope(bytes: &[u8]) -> Result<(SnapshotMeta, &[u8]), EnvelopeError> {
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
    crate::sim_hooks::blocking::unblock(work)
        .await
        .map_err(|e| SnapshotFileError::Join(e.to_string()))?
}

/// openraft's view of the applied state. Open it with [`StateMachine::open`] before
/// `Raft::new`.
pub(crate) struct StateMachine {
    applied: Arc<AppliedState>,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    snapshots: Arc<SnapshotDir>,
    metrics: SnapshotMetrics,
}

impl StateMachine {
    /// Reports snapshots built and installed to `metrics` from now on.
    pub(crate) fn set_metrics(&mut self, metrics: SnapshotMetrics) {
        self.metrics = metrics;
    }

    /// Opens `<data_dir>/snapshots` and restores its newest snapshot into `applied`.
    ///
    /// A snapshot that fails its checksum or does not decode is an error: the node must not
    /// serve a state it cannot vouch for.
    pub(crate) fn open(
        data_dir: &Path,
        applied: Arc<AppliedState>,
    ) -> Result<StateMachine, OpenError> {
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
    pub(crate) fn last_applied(&self) -> Option<LogId> {
        self.last_applied
    }
}

/// Builds a snapshot of the state as it was when the builder was made.
pub(crate) struct SnapshotBuilder {
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
        crate::support::metrics::observe(&self.metrics.seconds, self.started.elapsed());
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
mod tests;
