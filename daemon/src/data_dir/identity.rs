//! Cluster identity: a random id created when a cluster is bootstrapped, kept in every member's
//! data directory and carried on every peer RPC, so two clusters whose addresses and node ids
//! overlap cannot exchange messages.
//!
//! Rules:
//! - The bootstrapping node creates the id (before initializing Raft) and stores it in
//!   `<data_dir>/cluster-id`.
//! - Every peer RPC (Raft, forwarded writes and reads, forwarded admin calls) carries the sender's
//!   id in the [`CLUSTER_ID_HEADER`] metadata, when the sender has one.
//! - A node with an id refuses a peer message carrying another id, or none, and logs which.
//! - A node without an id (a new member, or a data directory from before ids existed) accepts
//!   every message, and adopts the id of the first append-entries or install-snapshot request
//!   carrying one: that is the leader of the cluster it was added to.
//! - The cluster name (`--cluster-name`, recorded in the data directory, see `data_dir.rs`)
//!   travels the same way in [`CLUSTER_NAME_HEADER`]: a node with a name refuses a peer message
//!   carrying another name (one without a name, from a node that has none, passes), and a node
//!   without one adopts its leader's along with the id.
//! - What a refusal tells the caller never names this node's cluster id or name; the details
//!   are logged here.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tonic::codegen::http;
use tonic::metadata::MetadataMap;

/// The metadata keys of peer calls.
pub(crate) use conch_proto::wire::{
    CLIENT_ADDR_HEADER, CLUSTER_ID_HEADER, CLUSTER_NAME_HEADER, PEER_ID_HEADER, PEER_SECRET_HEADER,
};
/// The file in the data directory holding the cluster id.
pub(crate) const CLUSTER_ID_FILE: &str = "cluster-id";
/// A refusal is logged at most this often per foreign id.
const LOG_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} does not hold a cluster id (32 hex digits): {found:?}")]
    Invalid { path: PathBuf, found: String },
    #[error("write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no randomness for a new cluster id")]
    Random,
}

/// Why a peer message was refused.
#[derive(Debug, thiserror::Error)]
pub enum Mismatch {
    #[error("peer message from cluster {theirs}, but this node belongs to cluster {ours}")]
    Other { ours: String, theirs: String },
    #[error("peer message without a cluster id, but this node belongs to cluster {ours}")]
    Missing { ours: String },
    /// Told to the caller as is: it names neither cluster name.
    #[error("peer message from a node of another cluster (the cluster names differ)")]
    Name,
}

/// This node's cluster id, if it has one yet, and its cluster name, if it has one.
pub struct ClusterId {
    path: PathBuf,
    value: RwLock<Option<String>>,
    name: RwLock<Option<String>>,
    /// The last refusal logged: (their id, when).
    logged: Mutex<Option<(String, Instant)>>,
}

fn valid(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

impl ClusterId {
    /// Reads `<data_dir>/cluster-id`; a missing file means no id yet.
    pub fn open(data_dir: &Path) -> Result<ClusterId, IdentityError> {
        let path = data_dir.join(CLUSTER_ID_FILE);
        let value = match std::fs::read_to_string(&path) {
            Ok(text) => {
                let id = text.trim();
                if !valid(id) {
                    return Err(IdentityError::Invalid {
                        path,
                        found: id.chars().take(64).collect(),
                    });
                }
                Some(id.to_string())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(IdentityError::Read { path, source }),
        };
        Ok(ClusterId {
            path,
            value: RwLock::new(value),
            name: RwLock::new(None),
            logged: Mutex::new(None),
        })
    }

    /// The cluster name recorded in the data directory (see [`crate::data_dir::DataDir`]).
    pub fn with_name(self, name: Option<&str>) -> ClusterId {
        *self.name.write().unwrap_or_else(|p| p.into_inner()) = name.map(str::to_string);
        self
    }

    pub fn get(&self) -> Option<String> {
        self.value.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// This node's cluster name, if it has one.
    pub fn name(&self) -> Option<String> {
        self.name.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Creates and stores a new random id, unless this node already has one.
    pub fn create(&self) -> Result<String, IdentityError> {
        if let Some(id) = self.get() {
            return Ok(id);
        }
        let mut bytes = [0u8; 16];
        if crate::sim_hooks::entropy::is_seeded() {
            // Under simulation: from the seed, so the run replays (see `entropy.rs`).
            for chunk in bytes.chunks_mut(8) {
                let draw =
                    crate::sim_hooks::entropy::random_u64().map_err(|_| IdentityError::Random)?;
                chunk.copy_from_slice(&draw.to_le_bytes()[..chunk.len()]);
            }
        } else {
            rustls::crypto::ring::default_provider()
                .secure_random
                .fill(&mut bytes)
                .map_err(|_| IdentityError::Random)?;
        }
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        self.store(&id)?;
        Ok(id)
    }

    /// Takes `id` as this node's cluster id if it has none. Returns whether it was adopted.
    pub fn adopt(&self, id: &str) -> Result<bool, IdentityError> {
        if self.get().is_some() || !valid(id) {
            return Ok(false);
        }
        self.store(id)?;
        Ok(true)
    }

    /// Writes the id durably (a temporary file, fsync, rename), then uses it.
    fn store(&self, id: &str) -> Result<(), IdentityError> {
        let mut value = self.value.write().unwrap_or_else(|p| p.into_inner());
        if value.is_some() {
            return Ok(());
        }
        let write_err = |source| IdentityError::Write {
            path: self.path.clone(),
            source,
        };
        let tmp = self.path.with_extension("tmp");
        {
            use std::io::Write;
            let mut file = std::fs::File::create(&tmp).map_err(write_err)?;
            file.write_all(format!("{id}\n").as_bytes())
                .map_err(write_err)?;
            file.sync_all().map_err(write_err)?;
        }
        std::fs::rename(&tmp, &self.path).map_err(write_err)?;
        if let Some(dir) = self.path.parent()
            && let Ok(dir) = std::fs::File::open(dir)
        {
            let _ = dir.sync_all();
        }
        *value = Some(id.to_string());
        Ok(())
    }

    /// Checks the id a peer message carries against this node's. Refusals are logged (at most
    /// once per [`LOG_EVERY`] for the same foreign id).
    pub fn check(&self, metadata: &MetadataMap) -> Result<(), Mismatch> {
        self.check_name(metadata)?;
        let Some(ours) = self.get() else {
            return Ok(());
        };
        let theirs = metadata
            .get(CLUSTER_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mismatch = match theirs {
            Some(theirs) if theirs == ours => return Ok(()),
            Some(theirs) => Mismatch::Other { ours, theirs },
            None => Mismatch::Missing { ours },
        };
        let key = match &mismatch {
            Mismatch::Other { theirs, .. } => theirs.clone(),
            Mismatch::Missing { .. } | Mismatch::Name => String::new(),
        };
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        let due = match &*logged {
            Some((last, at)) => *last != key || at.elapsed() >= LOG_EVERY,
            None => true,
        };
        if due {
            tracing::warn!("refused: {mismatch}");
            *logged = Some((key, Instant::now()));
        }
        Err(mismatch)
    }

    /// Refuses a peer message carrying another cluster name than this node's (both named).
    fn check_name(&self, metadata: &MetadataMap) -> Result<(), Mismatch> {
        let Some(ours) = self.name() else {
            return Ok(());
        };
        let Some(theirs) = metadata
            .get(CLUSTER_NAME_HEADER)
            .map(|v| v.to_str().unwrap_or("(not text)"))
        else {
            return Ok(());
        };
        if theirs == ours {
            return Ok(());
        }
        let key = format!("name:{theirs}");
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged
            .as_ref()
            .is_none_or(|(last, at)| *last != key || at.elapsed() >= LOG_EVERY)
        {
            tracing::warn!(
                ours = %ours,
                theirs = %theirs,
                "refused: peer message from cluster {theirs:?}, but this node belongs to cluster {ours:?}"
            );
            *logged = Some((key, Instant::now()));
        }
        Err(Mismatch::Name)
    }

    /// Adopts the id (and the cluster name) a leader's message carries, if this node has none
    /// yet.
    pub fn adopt_from(&self, metadata: &MetadataMap) {
        self.adopt_name_from(metadata);
        let Some(theirs) = metadata
            .get(CLUSTER_ID_HEADER)
            .and_then(|v| v.to_str().ok())
        else {
            return;
        };
        match self.adopt(theirs) {
            Ok(true) => tracing::info!(cluster_id = theirs, "joined cluster"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "could not store the cluster id"),
        }
    }

    /// Records the leader's cluster name in the data directory, if this node has none yet.
    fn adopt_name_from(&self, metadata: &MetadataMap) {
        if self.name().is_some() {
            return;
        }
        let Some(theirs) = metadata
            .get(CLUSTER_NAME_HEADER)
            .and_then(|v| v.to_str().ok())
        else {
            return;
        };
        let Some(dir) = self.path.parent() else {
            return;
        };
        let mut name = self.name.write().unwrap_or_else(|p| p.into_inner());
        if name.is_some() {
            return;
        }
        match crate::data_dir::adopt_cluster_name(dir, theirs) {
            Ok(recorded) => {
                tracing::info!(cluster_name = %recorded, "adopted the cluster name");
                *name = Some(recorded);
            }
            Err(e) => tracing::warn!(error = %e, "could not record the cluster name"),
        }
    }
}

/// How the peer secret travels: the hex of its SHA-256 (what the configuration keeps).
pub(crate) fn secret_header(hash: &[u8; 32]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// What this node says about itself on every peer RPC: its node id, the peer secret if it has
/// one, and its client address.
#[derive(Clone, Debug)]
pub(crate) struct PeerStamp {
    headers: Vec<(&'static str, http::HeaderValue)>,
}

impl PeerStamp {
    pub(crate) fn new(node_id: u64, secret: Option<&[u8; 32]>, client_addr: &str) -> PeerStamp {
        let mut headers = Vec::new();
        let mut add = |key: &'static str, value: String| {
            if let Ok(mut value) = http::HeaderValue::from_str(&value) {
                value.set_sensitive(key == PEER_SECRET_HEADER);
                headers.push((key, value));
            }
        };
        add(PEER_ID_HEADER, node_id.to_string());
        if let Some(secret) = secret {
            add(PEER_SECRET_HEADER, secret_header(secret));
        }
        add(CLIENT_ADDR_HEADER, client_addr.to_string());
        PeerStamp { headers }
    }
}

/// A peer channel that adds this node's cluster id and [`PeerStamp`] to every request.
#[derive(Clone)]
pub(crate) struct WithClusterId<S> {
    inner: S,
    id: Arc<ClusterId>,
    stamp: Arc<PeerStamp>,
}

impl<S> WithClusterId<S> {
    pub(crate) fn new(inner: S, id: Arc<ClusterId>, stamp: Arc<PeerStamp>) -> Self {
        WithClusterId { inner, id, stamp }
    }
}

impl<S, B> tower::Service<http::Request<B>> for WithClusterId<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if let Some(id) = self.id.get()
            && let Ok(value) = http::HeaderValue::from_str(&id)
        {
            request.headers_mut().insert(CLUSTER_ID_HEADER, value);
        }
        for (key, value) in &self.stamp.headers {
            request.headers_mut().insert(*key, value.clone());
        }
        if let Some(name) = self.id.name()
            && let Ok(value) = http::HeaderValue::from_str(&name)
        {
            request.headers_mut().insert(CLUSTER_NAME_HEADER, value);
        }
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_ids_persist_and_mismatches_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let id = ClusterId::open(dir.path()).expect("open");
        assert_eq!(id.get(), None);
        assert!(id.check(&MetadataMap::new()).is_ok(), "no id: accept all");
        let created = id.create().expect("create");
        assert!(valid(&created));
        assert_eq!(id.create().expect("again"), created, "created once");
        let reopened = ClusterId::open(dir.path()).expect("reopen");
        assert_eq!(reopened.get().as_deref(), Some(created.as_str()));

        let mut same = MetadataMap::new();
        same.insert(CLUSTER_ID_HEADER, created.parse().expect("ascii"));
        assert!(reopened.check(&same).is_ok());
        let mut other = MetadataMap::new();
        other.insert(CLUSTER_ID_HEADER, "0".repeat(32).parse().expect("ascii"));
        assert!(matches!(
            reopened.check(&other),
            Err(Mismatch::Other { .. })
        ));
        assert!(matches!(
            reopened.check(&MetadataMap::new()),
            Err(Mismatch::Missing { .. })
        ));
        // An id is never replaced by adoption.
        reopened.adopt_from(&other);
        assert_eq!(reopened.get().as_deref(), Some(created.as_str()));
    }

    #[test]
    fn another_cluster_name_is_refused_without_naming_ours() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let id = ClusterId::open(dir.path())?.with_name(Some("prod-a"));
        let mut same = MetadataMap::new();
        same.insert(CLUSTER_NAME_HEADER, "prod-a".parse()?);
        assert!(id.check(&same).is_ok());
        assert!(id.check(&MetadataMap::new()).is_ok(), "no name: accepted");
        let mut other = MetadataMap::new();
        other.insert(CLUSTER_NAME_HEADER, "prod-b".parse()?);
        let refused = id.check(&other).err().map(|e| e.to_string());
        let refused = refused.unwrap_or_default();
        assert!(refused.contains("another cluster"), "{refused}");
        assert!(!refused.contains("prod-a"), "names ours: {refused}");

        // A node without a name adopts its leader's, once.
        let new = tempfile::tempdir()?;
        let joining = ClusterId::open(new.path())?;
        joining.adopt_from(&other);
        assert_eq!(joining.name().as_deref(), Some("prod-b"));
        joining.adopt_from(&same);
        assert_eq!(joining.name().as_deref(), Some("prod-b"));
        assert_eq!(
            crate::data_dir::read_cluster_name(new.path())?.as_deref(),
            Some("prod-b")
        );
        Ok(())
    }

    #[test]
    fn a_new_node_adopts_the_first_id_it_is_sent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let id = ClusterId::open(dir.path()).expect("open");
        let mut leader = MetadataMap::new();
        leader.insert(CLUSTER_ID_HEADER, "ab".repeat(16).parse().expect("ascii"));
        id.adopt_from(&leader);
        assert_eq!(id.get(), Some("ab".repeat(16)));
        assert_eq!(
            ClusterId::open(dir.path()).expect("reopen").get(),
            Some("ab".repeat(16))
        );
        std::fs::write(dir.path().join(CLUSTER_ID_FILE), "garbage").expect("write");
        assert!(matches!(
            ClusterId::open(dir.path()),
            Err(IdentityError::Invalid { .. })
        ));
    }
}
