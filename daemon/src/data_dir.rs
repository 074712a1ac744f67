//! Whose a data directory is, and that one conchd at a time uses it; beside it, the cluster's
//! id and how peers check it (`identity`). Layer 4 of docs/design.md ("Module graph").
//!
//! Next to the Raft log and snapshots (see `raft/`), the top of a data directory holds:
//! - `LOCK`: locked exclusively (`flock`) for as long as a node has the directory open, and
//!   holding that process's pid (decimal, one line) for the message a second process prints.
//!   A file left by a stopped node is harmless: the lock goes with the process.
//! - `node-id`: the id of the node the directory belongs to (decimal, one line).
//! - `created-by`: the id of the node that first opened the directory empty (decimal, one
//!   line), written with `node-id` then; absent from directories written before it existed and
//!   from adopted ones.
//! - `cluster-name`: the `--cluster-name` given when the node bootstrapped, joined or was
//!   restored (one line); absent while none was given. A node without one adopts the name its
//!   leader's messages carry (see `identity.rs`).
//! - `cluster-id`: the cluster's id (see `identity.rs`).
//! - `removed`: written when the node learns it was removed from its cluster (see
//!   `removal.rs`); it holds the membership that left the node out.
//! - `new-cluster-version`: written by the node that bootstraps a new cluster, before it does,
//!   holding the cluster version the new cluster is to run at; removed once the node raised it
//!   (or found a member that does not speak it). See `upgrade.rs`.
//!
//! Invariants:
//! - [`DataDir::open`] takes the lock before it reads or writes anything else in the
//!   directory, and the lock is released only when the [`DataDir`] is dropped
//! - `node-id` and `cluster-name` are written durably (temporary file, fsync, rename, fsync of
//!   the directory), only when absent, and never replaced
//! - a start refused for another `--id`, another `--cluster-name` or a removed node changes
//!   nothing in the directory but `LOCK` (all checks come before the first write)
//! - a directory that holds Raft state but no `node-id` is refused: every release records it
//!   (0.1.0 did too), so its absence means the record was lost or removed, and a copy of another
//!   node's directory must not join as a new node with that node's log and vote. With
//!   `--adopt-data-dir` it takes the id it is started with, for the operator who knows whose
//!   it is
//! - a directory whose Raft state records a membership (the latest in its log, else its
//!   snapshot's) that names this node neither as a voter nor as a learner is refused too
//!   ([`DataDir::check_members`], once the log and snapshot are open): a copy of another
//!   node's directory whose `node-id` was edited. Not when the directory's own `created-by` is
//!   this node: it then holds only what this node received through Raft, and a node catching up
//!   legitimately holds a membership without itself for a while (a learner given the log
//!   before the entry that added it, or a snapshot taken before; a node wiped and added back
//!   whose replay of the log stops at its own earlier removal). `--adopt-data-dir` starts it
//!   anyway, with a warning. This refusal comes after the log store and snapshots were opened
//!   (it needs them), so what opening them writes stays; nothing else is written. A directory
//!   without `created-by` (written before it existed) is checked: one of a learner interrupted
//!   while catching up then needs `--adopt-data-dir` until it has caught up

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use openraft::{BasicNode, Membership};

pub(crate) mod identity;

/// The lock file, holding the pid of the process that has the directory open.
pub(crate) const LOCK_FILE: &str = "LOCK";
/// The id of the node the directory belongs to.
pub(crate) const NODE_ID_FILE: &str = "node-id";
/// The id of the node that first opened the directory empty.
pub(crate) const CREATED_BY_FILE: &str = "created-by";
/// The cluster name the directory was created or joined with.
pub(crate) const CLUSTER_NAME_FILE: &str = "cluster-name";
/// Present once the node was removed from its cluster.
pub(crate) const REMOVED_FILE: &str = "removed";
/// Present while the new cluster this node bootstrapped is still to be raised to its cluster
/// version.
pub(crate) const NEW_CLUSTER_FILE: &str = "new-cluster-version";
/// Longest `--cluster-name`.
pub(crate) const CLUSTER_NAME_MAX_CHARS: usize = 64;

/// Entries that only a data directory in use holds: their presence without `node-id` marks a
/// directory written before the record existed.
const STATE_ENTRIES: [&str; 5] = ["raft", "wal", "snapshots", "cluster-id", "vote"];

/// Why a data directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// It cannot be created, read or written.
    #[error("data directory {}: {reason}", path.display())]
    Unusable { path: PathBuf, reason: String },
    /// Another process has it open.
    #[error("data directory {} is in use by {}", path.display(), holder(*pid))]
    InUse { path: PathBuf, pid: Option<u32> },
    /// It belongs to another node.
    #[error(
        "data directory {} belongs to node {recorded}, not --id {id} (start node {recorded} on \
         it, or give node {id} its own --data-dir)",
        path.display()
    )]
    OtherNode {
        path: PathBuf,
        recorded: u64,
        id: u64,
    },
    /// It belongs to a cluster of another name.
    #[error(
        "data directory {} belongs to cluster {recorded:?} (node {node}), not --cluster-name \
         {given:?}",
        path.display()
    )]
    OtherCluster {
        path: PathBuf,
        recorded: String,
        node: u64,
        given: String,
    },
    /// It holds a node's state but no record of whose.
    #[error(
        "data directory {} holds a node's state but no node-id file, so whose it is cannot be \
         checked (a copy of another node's directory must not join as node {id}); if it is node \
         {id}'s own, start once with --adopt-data-dir",
        path.display()
    )]
    Unclaimed { path: PathBuf, id: u64 },
    /// Its Raft state records a membership without this node, and this node did not create it.
    #[error(
        "data directory {} holds the log of a cluster whose members are {members}: node {id} is \
         not one of them (a copy of another node's directory?); start with --adopt-data-dir to \
         use it anyway",
        path.display()
    )]
    NotAMember {
        path: PathBuf,
        id: u64,
        members: String,
    },
    /// Its node was removed from the cluster.
    #[error(
        "data directory {} belongs to node {node}, which was removed from its cluster \
         (membership then {membership}); wipe the directory and add the node again",
        path.display()
    )]
    Removed {
        path: PathBuf,
        node: u64,
        membership: String,
    },
}

impl DataDirError {
    /// A refusal that only the operator can resolve (another `--id`, `--cluster-name` or
    /// `--data-dir`, or stopping the other process): conchd exits 64 on it.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            DataDirError::InUse { .. }
                | DataDirError::OtherNode { .. }
                | DataDirError::OtherCluster { .. }
                | DataDirError::Unclaimed { .. }
                | DataDirError::NotAMember { .. }
        )
    }
}

fn holder(pid: Option<u32>) -> String {
    match pid {
        Some(pid) => format!("another conchd (pid {pid})"),
        None => "another process".into(),
    }
}

/// Checks a cluster name: 1 to [`CLUSTER_NAME_MAX_CHARS`] characters of `[-_.0-9a-zA-Z]`.
pub(crate) fn check_cluster_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.chars().count() > CLUSTER_NAME_MAX_CHARS {
        return Err(format!(
            "--cluster-name {name:?}: 1 to {CLUSTER_NAME_MAX_CHARS} characters"
        ));
    }
    if let Some(c) = name.chars().find(|c| !allowed(*c)) {
        return Err(format!(
            "--cluster-name {name:?}: {c:?} is not allowed (letters, digits, '-', '_', '.')"
        ));
    }
    Ok(())
}

/// An open data directory: locked for this process, and known to belong to this node.
#[derive(Debug)]
pub(crate) struct DataDir {
    path: PathBuf,
    id: u64,
    adopt: bool,
    /// `created-by` names this node: the directory holds only what it received through Raft.
    created_here: bool,
    cluster_name: Option<String>,
    /// Holds the lock; closing it releases the lock.
    _lock: File,
}

impl DataDir {
    /// Creates the directory if needed, locks it, and checks (or, the first time, records) that
    /// it belongs to node `id` and, when `cluster_name` is given, to that cluster. A directory
    /// holding state without `node-id` is refused unless `adopt` (`--adopt-data-dir`).
    pub(crate) fn open(
        path: &Path,
        id: u64,
        cluster_name: Option<&str>,
        adopt: bool,
    ) -> Result<DataDir, DataDirError> {
        create(path)?;
        let lock = lock(path)?;
        let unusable = |reason: String| DataDirError::Unusable {
            path: path.to_path_buf(),
            reason,
        };
        if let Some(membership) = read_text(path, REMOVED_FILE).map_err(unusable)? {
            return Err(DataDirError::Removed {
                path: path.to_path_buf(),
                node: read_node_id(path)?.unwrap_or(id),
                membership,
            });
        }
        let recorded_id = read_node_id(path)?;
        if let Some(recorded) = recorded_id
            && recorded != id
        {
            return Err(DataDirError::OtherNode {
                path: path.to_path_buf(),
                recorded,
                id,
            });
        }
        let recorded_name = read_cluster_name(path)?;
        if let (Some(recorded), Some(given)) = (&recorded_name, cluster_name)
            && recorded != given
        {
            return Err(DataDirError::OtherCluster {
                path: path.to_path_buf(),
                recorded: recorded.clone(),
                node: id,
                given: given.to_string(),
            });
        }

        let unclaimed = recorded_id.is_none() && holds_state(path).map_err(unusable)?;
        if unclaimed && !adopt {
            return Err(DataDirError::Unclaimed {
                path: path.to_path_buf(),
                id,
            });
        }
        if recorded_id.is_none() {
            if unclaimed {
                tracing::warn!(
                    node_id = id,
                    path = %path.display(),
                    "--adopt-data-dir: recording a data directory without node-id as this node's"
                );
            } else {
                // Empty: whatever it will hold, this node receives (or bootstraps, or restores).
                write_record(path, CREATED_BY_FILE, &id.to_string()).map_err(unusable)?;
            }
            write_record(path, NODE_ID_FILE, &id.to_string()).map_err(unusable)?;
        }
        let created_here = read_id(path, CREATED_BY_FILE)? == Some(id);
        let cluster_name = match (recorded_name, cluster_name) {
            (Some(recorded), _) => Some(recorded),
            (None, Some(given)) => {
                write_record(path, CLUSTER_NAME_FILE, given).map_err(unusable)?;
                tracing::info!(cluster_name = given, "recorded the cluster name");
                Some(given.to_string())
            }
            (None, None) => None,
        };
        Ok(DataDir {
            path: path.to_path_buf(),
            id,
            adopt,
            created_here,
            cluster_name,
            _lock: lock,
        })
    }

    /// Checks the latest membership the directory's Raft state records (`None` while it records
    /// none: a new node's empty log) against this node: see [`admit`].
    pub(crate) fn check_members(
        &self,
        membership: Option<&Membership<u64, BasicNode>>,
    ) -> Result<Admitted, DataDirError> {
        admit(
            &self.path,
            self.id,
            membership,
            self.created_here,
            self.adopt,
        )
    }

    /// The cluster name recorded in the directory, if any.
    pub(crate) fn cluster_name(&self) -> Option<&str> {
        self.cluster_name.as_deref()
    }
}

/// Creates the directory if needed; refuses a path that is not a directory.
fn create(path: &Path) -> Result<(), DataDirError> {
    let fail = |reason: String| DataDirError::Unusable {
        path: path.to_path_buf(),
        reason,
    };
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_dir() => {
            return Err(fail(
                "is a file, not a directory (choose another --data-dir or move the file)".into(),
            ));
        }
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(format!("cannot be read: {e}"))),
    }
    std::fs::create_dir_all(path).map_err(|e| fail(format!("cannot be created: {e}")))
}

/// Takes the exclusive lock on `<dir>/LOCK` and writes this process's pid into it.
fn lock(dir: &Path) -> Result<File, DataDirError> {
    let lock_path = dir.join(LOCK_FILE);
    let fail = |e: std::io::Error| DataDirError::Unusable {
        path: dir.to_path_buf(),
        reason: format!("open {}: {e}", lock_path.display()),
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(fail)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let pid = file
                .read_to_string(&mut text)
                .ok()
                .and_then(|_| text.trim().parse().ok());
            return Err(DataDirError::InUse {
                path: dir.to_path_buf(),
                pid,
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(fail(e)),
    }
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(format!("{}\n", std::process::id()).as_bytes()))
        .map_err(|e| DataDirError::Unusable {
            path: dir.to_path_buf(),
            reason: format!("write this process's pid into {}: {e}", lock_path.display()),
        })?;
    Ok(file)
}

/// The error for a Raft log that sled found locked: another process (e.g. a conchd from before
/// the `LOCK` file) has the directory open.
pub(crate) fn in_use(dir: &Path) -> DataDirError {
    DataDirError::InUse {
        path: dir.to_path_buf(),
        pid: None,
    }
}

/// Whether the directory holds Raft state or a cluster id.
fn holds_state(dir: &Path) -> Result<bool, String> {
    for entry in STATE_ENTRIES {
        match std::fs::symlink_metadata(dir.join(entry)) {
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot be read: {entry}: {e}")),
        }
    }
    Ok(false)
}

/// The trimmed text of `<dir>/<name>`, or `None` when the file does not exist.
fn read_text(dir: &Path, name: &str) -> Result<Option<String>, String> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("read {}: {e}", path.display())),
    }
}

/// Why a directory whose Raft state records a membership was let start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// It records no membership yet (empty, or a `--join` node not yet added).
    NoMembership,
    /// The membership names this node, as a voter or a learner.
    Member,
    /// The membership leaves this node out, but this node created the directory: it is
    /// catching up, or waiting to learn of its removal (see the module's invariants).
    CatchingUp,
    /// The membership leaves this node out, and `--adopt-data-dir` starts it anyway.
    Adopted,
}

/// Decides whether node `id` may start on the directory at `path`, whose Raft state's latest
/// membership is `membership` (`None` when it records none); `created_here` when the
/// directory's `created-by` is `id`, `adopt` for `--adopt-data-dir`.
///
/// Refused only when the membership names the node neither as a voter nor as a learner, and
/// the node did not create the directory (see the module's invariants for why that narrows it),
/// and the operator did not adopt it (a warning then).
fn admit(
    path: &Path,
    id: u64,
    membership: Option<&Membership<u64, BasicNode>>,
    created_here: bool,
    adopt: bool,
) -> Result<Admitted, DataDirError> {
    let Some(membership) = membership else {
        return Ok(Admitted::NoMembership);
    };
    if membership.get_node(&id).is_some() {
        return Ok(Admitted::Member);
    }
    // The membership's nodes come in id order.
    let ids: Vec<String> = membership.nodes().map(|(id, _)| id.to_string()).collect();
    let members = if ids.is_empty() {
        "none".to_string()
    } else {
        ids.join(", ")
    };
    if created_here {
        tracing::info!(
            node_id = id,
            members,
            "this node's data directory holds a membership without it: catching up"
        );
        return Ok(Admitted::CatchingUp);
    }
    if adopt {
        tracing::warn!(
            node_id = id,
            members,
            path = %path.display(),
            "--adopt-data-dir: starting on a data directory whose membership leaves this node out"
        );
        return Ok(Admitted::Adopted);
    }
    Err(DataDirError::NotAMember {
        path: path.to_path_buf(),
        id,
        members,
    })
}

/// The node id recorded in `dir`, if any.
pub(crate) fn read_node_id(dir: &Path) -> Result<Option<u64>, DataDirError> {
    read_id(dir, NODE_ID_FILE)
}

/// The node id recorded in `<dir>/<name>`, if any.
fn read_id(dir: &Path, name: &str) -> Result<Option<u64>, DataDirError> {
    let unusable = |reason: String| DataDirError::Unusable {
        path: dir.to_path_buf(),
        reason,
    };
    let Some(text) = read_text(dir, name).map_err(unusable)? else {
        return Ok(None);
    };
    match text.parse::<u64>() {
        Ok(id) if id > 0 => Ok(Some(id)),
        _ => Err(unusable(format!(
            "{name} does not hold a node id: {:?}",
            text.chars().take(32).collect::<String>()
        ))),
    }
}

/// The cluster name recorded in `dir`, if any.
pub(crate) fn read_cluster_name(dir: &Path) -> Result<Option<String>, DataDirError> {
    let unusable = |reason: String| DataDirError::Unusable {
        path: dir.to_path_buf(),
        reason,
    };
    let Some(name) = read_text(dir, CLUSTER_NAME_FILE).map_err(unusable)? else {
        return Ok(None);
    };
    check_cluster_name(&name)
        .map_err(|e| unusable(format!("{CLUSTER_NAME_FILE} is damaged: {e}")))?;
    Ok(Some(name))
}

/// Records `name` as the cluster name of `dir` unless one is recorded; returns the name now
/// recorded.
pub(crate) fn adopt_cluster_name(dir: &Path, name: &str) -> Result<String, DataDirError> {
    if let Some(recorded) = read_cluster_name(dir)? {
        return Ok(recorded);
    }
    check_cluster_name(name).map_err(|reason| DataDirError::Unusable {
        path: dir.to_path_buf(),
        reason,
    })?;
    write_record(dir, CLUSTER_NAME_FILE, name).map_err(|reason| DataDirError::Unusable {
        path: dir.to_path_buf(),
        reason,
    })?;
    Ok(name.to_string())
}

/// Records that the node was removed from its cluster, with the membership that left it out.
pub(crate) fn record_removed(dir: &Path, membership: &str) -> Result<(), String> {
    write_record(dir, REMOVED_FILE, membership)
}

/// Writes `<dir>/<name>` durably: a temporary file, fsync, rename, fsync of the directory.
pub(crate) fn write_record(dir: &Path, name: &str, text: &str) -> Result<(), String> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let fail = |e: std::io::Error| format!("write {}: {e}", path.display());
    {
        let mut file = File::create(&tmp).map_err(fail)?;
        file.write_all(format!("{text}\n").as_bytes())
            .map_err(fail)?;
        file.sync_all().map_err(fail)?;
    }
    std::fs::rename(&tmp, &path).map_err(fail)?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(fail)
}

/// Removes `<dir>/<name>` durably (fsync of the directory); a file already absent is no error.
pub(crate) fn remove_record(dir: &Path, name: &str) -> Result<(), String> {
    let path = dir.join(name);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("remove {}: {e}", path.display())),
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("remove {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_records_its_node_and_refuses_another() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("data");
        // first start   node 1, no name     -> created, node-id 1
        let opened = DataDir::open(&dir, 1, None, false)?;
        assert_eq!(read_node_id(&dir)?, Some(1));
        assert_eq!(opened.cluster_name(), None);
        drop(opened);
        // second start  --id 2              -> refused, naming both, nothing written
        let before = std::fs::read_dir(&dir)?.count();
        let Err(refused) = DataDir::open(&dir, 2, Some("prod-a"), false) else {
            anyhow::bail!("node 2 opened node 1's directory");
        };
        assert!(refused.is_usage());
        assert_eq!(
            refused.to_string(),
            format!(
                "data directory {} belongs to node 1, not --id 2 (start node 1 on it, or give \
                 node 2 its own --data-dir)",
                dir.display()
            )
        );
        assert_eq!(std::fs::read_dir(&dir)?.count(), before);
        assert_eq!(read_cluster_name(&dir)?, None);
        // third start   node 1 again        -> fine
        drop(DataDir::open(&dir, 1, None, false)?);
        Ok(())
    }

    #[test]
    fn a_cluster_name_is_recorded_once_and_a_different_one_refused() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("data");
        // bootstrap     --cluster-name prod-a     -> recorded
        drop(DataDir::open(&dir, 1, Some("prod-a"), false)?);
        // restart       no --cluster-name         -> the recorded one holds
        let opened = DataDir::open(&dir, 1, None, false)?;
        assert_eq!(opened.cluster_name(), Some("prod-a"));
        drop(opened);
        // restart       --cluster-name prod-b     -> refused, naming both
        let Err(refused) = DataDir::open(&dir, 1, Some("prod-b"), false) else {
            anyhow::bail!("another cluster name was accepted");
        };
        assert!(refused.is_usage());
        assert_eq!(
            refused.to_string(),
            format!(
                "data directory {} belongs to cluster \"prod-a\" (node 1), not --cluster-name \
                 \"prod-b\"",
                dir.display()
            )
        );
        assert_eq!(read_cluster_name(&dir)?.as_deref(), Some("prod-a"));
        // adopting a leader's name never replaces a recorded one
        assert_eq!(adopt_cluster_name(&dir, "prod-c")?, "prod-a");
        Ok(())
    }

    #[test]
    fn a_directory_without_its_record_is_refused_unless_adopted() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("data");
        std::fs::create_dir_all(dir.join("raft"))?;
        std::fs::write(dir.join("vote"), b"x")?;
        // state without node-id, started as node 3          -> refused, nothing written
        assert!(matches!(
            DataDir::open(&dir, 3, None, false),
            Err(DataDirError::Unclaimed { id: 3, .. })
        ));
        assert_eq!(read_node_id(&dir)?, None);
        // adopted by the operator                           -> node-id 3 recorded
        drop(DataDir::open(&dir, 3, None, true)?);
        assert_eq!(read_node_id(&dir)?, Some(3));
        // from then on it is node 3's
        assert!(matches!(
            DataDir::open(&dir, 1, None, true),
            Err(DataDirError::OtherNode {
                recorded: 3,
                id: 1,
                ..
            })
        ));
        Ok(())
    }

    /// Voters `voters`, learners `learners`.
    fn membership(voters: &[u64], learners: &[u64]) -> Membership<u64, BasicNode> {
        let nodes: std::collections::BTreeMap<u64, BasicNode> = voters
            .iter()
            .chain(learners)
            .map(|id| (*id, BasicNode::new(format!("127.0.0.1:{}", 7000 + id))))
            .collect();
        Membership::new(vec![voters.iter().copied().collect()], nodes)
    }

    #[test]
    fn a_membership_that_leaves_the_node_out_is_refused_unless_adopted() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("data");
        let of_1_2_4 = membership(&[1, 2], &[4]);
        // empty log, no membership                  -> starts
        assert_eq!(admit(&dir, 3, None, false, false)?, Admitted::NoMembership);
        // names node 3 as a voter, or as a learner  -> starts
        let with_3 = membership(&[1, 2, 3], &[]);
        assert_eq!(
            admit(&dir, 3, Some(&with_3), false, false)?,
            Admitted::Member
        );
        let learner_3 = membership(&[1, 2], &[3]);
        assert_eq!(
            admit(&dir, 3, Some(&learner_3), false, false)?,
            Admitted::Member
        );
        // {1, 2, learner 4}, started as node 3      -> refused, naming the directory and members
        let Err(refused) = admit(&dir, 3, Some(&of_1_2_4), false, false) else {
            anyhow::bail!("node 3 started on a directory of members 1, 2, 4");
        };
        assert!(refused.is_usage());
        assert_eq!(
            refused.to_string(),
            format!(
                "data directory {} holds the log of a cluster whose members are 1, 2, 4: node 3 \
                 is not one of them (a copy of another node's directory?); start with \
                 --adopt-data-dir to use it anyway",
                dir.display()
            )
        );
        // the same with --adopt-data-dir            -> starts, with a warning
        assert_eq!(
            admit(&dir, 3, Some(&of_1_2_4), false, true)?,
            Admitted::Adopted
        );
        // node 3 created the directory itself       -> starts: it is catching up
        assert_eq!(
            admit(&dir, 3, Some(&of_1_2_4), true, false)?,
            Admitted::CatchingUp
        );
        Ok(())
    }

    #[test]
    fn only_the_node_that_opened_a_directory_empty_is_recorded_as_its_creator() -> anyhow::Result<()>
    {
        let tmp = tempfile::tempdir()?;
        let of_1_2 = membership(&[1, 2], &[]);
        // opened empty by node 3                    -> created-by 3: a membership without it
        //                                              is its own catching up
        let fresh = tmp.path().join("fresh");
        let opened = DataDir::open(&fresh, 3, None, false)?;
        assert_eq!(read_id(&fresh, CREATED_BY_FILE)?, Some(3));
        assert_eq!(opened.check_members(Some(&of_1_2))?, Admitted::CatchingUp);
        drop(opened);
        // a copy of it whose node-id was edited to 4 -> node 4 did not create it: refused
        let copy = tmp.path().join("copy");
        std::fs::create_dir_all(copy.join("raft"))?;
        std::fs::copy(fresh.join(CREATED_BY_FILE), copy.join(CREATED_BY_FILE))?;
        std::fs::write(copy.join(NODE_ID_FILE), b"4\n")?;
        let opened = DataDir::open(&copy, 4, None, false)?;
        assert!(matches!(
            opened.check_members(Some(&of_1_2)),
            Err(DataDirError::NotAMember { id: 4, .. })
        ));
        assert_eq!(opened.check_members(None)?, Admitted::NoMembership);
        drop(opened);
        // adopted (state, no node-id)               -> no created-by: the check holds
        let adopted = tmp.path().join("adopted");
        std::fs::create_dir_all(adopted.join("raft"))?;
        let opened = DataDir::open(&adopted, 5, None, true)?;
        assert_eq!(read_id(&adopted, CREATED_BY_FILE)?, None);
        assert_eq!(opened.check_members(Some(&of_1_2))?, Admitted::Adopted);
        Ok(())
    }

    #[test]
    fn a_second_open_is_refused_naming_the_pid_until_the_first_is_dropped() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("data");
        let first = DataDir::open(&dir, 1, None, false)?;
        let pid = std::process::id();
        assert_eq!(
            std::fs::read_to_string(dir.join(LOCK_FILE))?.trim(),
            pid.to_string()
        );
        let Err(refused) = DataDir::open(&dir, 1, None, false) else {
            anyhow::bail!("opened twice");
        };
        assert!(refused.is_usage());
        assert_eq!(
            refused.to_string(),
            format!(
                "data directory {} is in use by another conchd (pid {pid})",
                dir.display()
            )
        );
        // A lock file without a pid (another program's): "another process".
        std::fs::write(dir.join(LOCK_FILE), b"")?;
        let Err(refused) = DataDir::open(&dir, 1, None, false) else {
            anyhow::bail!("opened twice");
        };
        assert!(
            refused.to_string().ends_with("in use by another process"),
            "{refused}"
        );
        drop(first);
        drop(DataDir::open(&dir, 1, None, false)?);
        Ok(())
    }

    #[test]
    fn a_removed_node_s_directory_is_refused() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("data");
        drop(DataDir::open(&dir, 3, None, false)?);
        record_removed(&dir, "{voters: [1, 2], learners: []}").map_err(anyhow::Error::msg)?;
        let Err(refused) = DataDir::open(&dir, 3, None, false) else {
            anyhow::bail!("a removed node's directory was opened");
        };
        assert!(!refused.is_usage());
        let text = refused.to_string();
        assert!(
            text.contains("node 3, which was removed") && text.contains("voters: [1, 2]"),
            "{text}"
        );
        Ok(())
    }

    #[test]
    fn cluster_names_are_short_and_plain() {
        assert!(check_cluster_name("prod-a_1.eu").is_ok());
        assert!(check_cluster_name(&"x".repeat(64)).is_ok());
        assert!(check_cluster_name("").is_err());
        assert!(check_cluster_name(&"x".repeat(65)).is_err());
        assert!(check_cluster_name("prod a").is_err());
        assert!(check_cluster_name("prod/a").is_err());
    }
}
