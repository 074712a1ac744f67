//! Rolling upgrades: which release each member runs, and raising the cluster version once every
//! member speaks the new one.
//!
//! A node tells its release and the cluster versions it speaks over the peer service
//! (`ConchPeer.NodeInfo`); a node of release 0.1.0 answers UNIMPLEMENTED, which means cluster
//! version 1 only. The cluster version moves only through [`Cmd::SetClusterVersion`], proposed
//! here and nowhere else:
//! - by `ConchAdmin.FinalizeUpgrade` (`conch cluster finalize`), the operator's word that the
//!   upgrade is done and no node will go back to the previous release;
//! - by the node that bootstrapped a new cluster: a cluster created by this release has no
//!   previous release to go back to. The node records the version the cluster is to run at in
//!   its data directory before it bootstraps (`new-cluster-version`) and removes the record
//!   once that is settled, so a restart in between carries on; a cluster created by an earlier
//!   release never has the record, and only the operator finalizes it.
//!
//! What always holds: the command is proposed only after every voter and learner of the
//! membership this node knows answered with a release that speaks the new version; a member that
//! does not answer, or speaks less, refuses the raise, naming it. Adding a learner whose release
//! does not speak the cluster version is refused too (`api/membership.rs`), so a member that
//! could not decode the log never joins after the raise.
//!
//! What a node speaks is its build's newest cluster version unless configured lower
//! (`Config::cluster_version_max`, for embedders such as the simulator): such a node answers
//! `NodeInfo` with that version, bootstraps a new cluster at it, and refuses log entries that
//! raise the cluster version past it ([`crate::raft::followable`]), as a node of the release that speaks no
//! more could not decode them.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use conch_proto::conch::PeerMessage;
use serde::{Deserialize, Serialize};

use crate::data_dir::{self, DataDirError};
use crate::node::Node;
use crate::raft::NodeId;
use crate::raft::network::{decode, encode};
use crate::state::version::{self, BASE, NEWEST};
use crate::state::{Cmd, Error};

/// How long a member has to answer [`NodeInfo`].
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// What a node says of its release (`ConchPeer.NodeInfo`'s reply).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeInfo {
    pub release: String,
    /// The newest cluster version the release speaks (it speaks every one from 1 on).
    pub cluster_version_max: u32,
    /// The newest data format it reads (it reads every one from 0.1.0's on).
    pub data_format_max: u32,
}

impl NodeInfo {
    /// What a node of this build says that speaks cluster versions up to `cluster_version_max`
    /// (this build's newest unless the node was configured to speak less).
    pub(crate) fn speaking(cluster_version_max: u32) -> NodeInfo {
        NodeInfo {
            release: crate::support::release::RELEASE.to_string(),
            cluster_version_max,
            data_format_max: version::data_format(cluster_version_max),
        }
    }

    /// This node's.
    pub(crate) fn this_node(node: &Node) -> NodeInfo {
        NodeInfo::speaking(node.config.cluster_version_max)
    }

    /// A node of release 0.1.0, which does not serve `NodeInfo`.
    pub(crate) fn release_0_1_0() -> NodeInfo {
        NodeInfo {
            release: "0.1.0".to_string(),
            cluster_version_max: BASE,
            data_format_max: version::OLDEST_DATA_FORMAT,
        }
    }
}

/// One member's answer, or why there was none.
#[derive(Clone, Debug)]
pub(crate) struct MemberRelease {
    pub id: NodeId,
    pub info: Result<NodeInfo, String>,
}

/// Asks every voter and learner of the membership this node knows for its release (this node
/// answers for itself), in id order.
pub(crate) async fn member_releases(node: &Arc<Node>) -> Vec<MemberRelease> {
    let asks = node.members().into_iter().map(|member| {
        let node = Arc::clone(node);
        async move {
            let info = if member.id == node.id {
                Ok(NodeInfo::this_node(&node))
            } else {
                ask(&node, member.id, &member.addr).await
            };
            MemberRelease {
                id: member.id,
                info,
            }
        }
    });
    futures::future::join_all(asks).await
}

/// Asks node `id` at `addr` for its release.
async fn ask(node: &Node, id: NodeId, addr: &str) -> Result<NodeInfo, String> {
    let mut peer = node.peer_of(id, addr).map_err(|e| e.to_string())?;
    let mut request = tonic::Request::new(PeerMessage {
        payload: encode(&()).map_err(|e| e.to_string())?,
    });
    request.set_timeout(ASK_TIMEOUT);
    crate::raft::peer_target::name_target(&mut request, id);
    match tokio::time::timeout(ASK_TIMEOUT, peer.node_info(request)).await {
        Err(_) => Err(format!("no answer within {} s", ASK_TIMEOUT.as_secs())),
        Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
            Ok(NodeInfo::release_0_1_0())
        }
        Ok(Err(status)) => Err(status.message().to_string()),
        Ok(Ok(reply)) => decode::<NodeInfo>(&reply.into_inner().payload)
            .map_err(|e| format!("undecodable answer: {e}")),
    }
}

/// The newest cluster version every member speaks, or why the members' answers allow none.
pub(crate) fn common_version(members: &[MemberRelease]) -> Result<u32, String> {
    let mut common = NEWEST;
    for member in members {
        match &member.info {
            Ok(info) => common = common.min(info.cluster_version_max),
            Err(e) => return Err(format!("node {} did not answer: {e}", member.id)),
        }
    }
    Ok(common.max(BASE))
}

/// What [`finalize`] did.
#[derive(Clone, Debug)]
pub(crate) struct Finalized {
    pub previous: u32,
    pub current: u32,
    pub members: Vec<MemberRelease>,
}

/// Who raises the cluster version, which the log line says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Raiser {
    /// `conch cluster finalize`: the end of a rolling upgrade.
    Operator,
    /// The node that bootstrapped a new cluster, which has no earlier release to go back to.
    NewCluster,
}

/// Raises the cluster version to the newest one every member speaks (through the log, from any
/// node). Refused with `FailedPrecondition`, changing nothing, when a member does not answer;
/// a version already reached is answered as it is.
pub(crate) async fn finalize(node: &Arc<Node>) -> Result<Finalized, crate::api::status::ApiError> {
    raise(node, NEWEST, Raiser::Operator).await
}

/// [`finalize`], to `ceiling` at most.
async fn raise(
    node: &Arc<Node>,
    ceiling: u32,
    raiser: Raiser,
) -> Result<Finalized, crate::api::status::ApiError> {
    node.linearizable().await?;
    let previous = node.applied.read(|s| s.cluster_version()).0;
    let members = member_releases(node).await;
    let target = common_version(&members)
        .map_err(|why| {
            Error::failed_precondition(format!(
                "cannot finalize the upgrade: {why}; every voter and learner must answer"
            ))
        })?
        .min(ceiling);
    if target <= previous {
        if previous < NEWEST && raiser == Raiser::Operator {
            let behind: Vec<String> = members
                .iter()
                .filter_map(|m| m.info.as_ref().ok().map(|i| (m.id, i)))
                .filter(|(_, i)| i.cluster_version_max < NEWEST)
                .map(|(id, i)| format!("node {id} runs conch {}", i.release))
                .collect();
            return Err(Error::failed_precondition(format!(
                "cannot finalize the upgrade to cluster version {NEWEST}: {}, which speaks \
                 cluster version {previous} at most; upgrade {} to conch {} or later first",
                behind.join(", "),
                if behind.len() == 1 { "it" } else { "them" },
                crate::support::release::first_speaking(NEWEST)
                    .unwrap_or(crate::support::release::RELEASE),
            ))
            .into());
        }
        return Ok(Finalized {
            previous,
            current: previous,
            members,
        });
    }
    node.write_one(Cmd::SetClusterVersion { version: target })
        .await??;
    match raiser {
        Raiser::Operator => tracing::info!(
            from = previous,
            to = target,
            "cluster version raised: the upgrade is final, no node can go back to the previous \
             release"
        ),
        Raiser::NewCluster => tracing::info!(
            from = previous,
            to = target,
            "new cluster: it runs at cluster version {target}, the newest every member speaks \
             (created by this release, it has no earlier release to go back to)"
        ),
    }
    Ok(Finalized {
        previous,
        current: target,
        members,
    })
}

/// Records, in the data directory of a node about to bootstrap a new cluster, the cluster
/// version the new cluster is to run at: [`finalize_new_cluster`] raises it there, and a
/// restart before it is done carries on. Only a bootstrap writes it, so a cluster created by
/// an earlier release (which the operator finalizes) never has one.
pub(crate) fn record_new_cluster(data_dir: &Path, version: u32) -> Result<(), DataDirError> {
    data_dir::write_record(data_dir, data_dir::NEW_CLUSTER_FILE, &version.to_string()).map_err(
        |reason| DataDirError::Unusable {
            path: data_dir.to_path_buf(),
            reason,
        },
    )
}

/// The cluster version the new cluster this node bootstrapped is still to be raised to, if it
/// bootstrapped one and that is not done (see [`record_new_cluster`]).
pub(crate) fn new_cluster_version(data_dir: &Path) -> Result<Option<u32>, DataDirError> {
    let path = data_dir.join(data_dir::NEW_CLUSTER_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(DataDirError::Unusable {
                path: data_dir.to_path_buf(),
                reason: format!("read {}: {e}", path.display()),
            });
        }
    };
    match text.trim().parse::<u32>() {
        Ok(version) if version >= BASE => Ok(Some(version)),
        _ => Err(DataDirError::Unusable {
            path: data_dir.to_path_buf(),
            reason: format!(
                "{} does not hold a cluster version: {:?} (remove the file to leave raising the \
                 cluster version to `conch cluster finalize`)",
                path.display(),
                text.trim().chars().take(32).collect::<String>()
            ),
        }),
    }
}

/// Removes the record of [`record_new_cluster`]: the new cluster's version is settled.
pub(crate) fn forget_new_cluster(data_dir: &Path) {
    if let Err(e) = data_dir::remove_record(data_dir, data_dir::NEW_CLUSTER_FILE) {
        tracing::warn!(error = %e, "the new cluster's version is settled, but its record stays");
    }
}

/// Run by the node that bootstrapped a new cluster (from [`record_new_cluster`]'s record, also
/// after a restart): raises the cluster version to `created_at` (or what this node speaks, if
/// less) once every member answers with a release that speaks it. A member of an older
/// release leaves the cluster at the version they share, for the operator to finalize later.
/// Either way the record is removed once settled.
pub(crate) async fn finalize_new_cluster(node: Arc<Node>, created_at: u32) {
    let target = created_at.min(node.config.cluster_version_max);
    let data_dir = node.config.data_dir.clone();
    let mut wait = Duration::from_millis(100);
    loop {
        if node.applied.read(|s| s.cluster_version()).0 >= target {
            forget_new_cluster(&data_dir);
            return;
        }
        let members = member_releases(&node).await;
        match common_version(&members) {
            Ok(common) if common < target => {
                tracing::info!(
                    cluster_version = common,
                    "a member runs an earlier release: the cluster stays at the version all \
                     speak until `conch cluster finalize`"
                );
                forget_new_cluster(&data_dir);
                return;
            }
            Ok(_) => match raise(&node, target, Raiser::NewCluster).await {
                Ok(done) => {
                    tracing::debug!(cluster_version = done.current, "new cluster finalized");
                    forget_new_cluster(&data_dir);
                    return;
                }
                Err(e) => tracing::debug!(error = %e, "finalizing the new cluster: retrying"),
            },
            Err(why) => tracing::debug!(%why, "finalizing the new cluster: waiting for members"),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: NodeId, max: Option<u32>) -> MemberRelease {
        MemberRelease {
            id,
            info: match max {
                Some(v) => Ok(NodeInfo {
                    release: format!("r{v}"),
                    cluster_version_max: v,
                    data_format_max: version::data_format(v),
                }),
                None => Err("connection refused".into()),
            },
        }
    }

    #[test]
    fn the_common_version_is_the_least_any_member_speaks() {
        assert_eq!(
            common_version(&[member(1, Some(2)), member(2, Some(2))]),
            Ok(2)
        );
        assert_eq!(
            common_version(&[member(1, Some(2)), member(2, Some(1))]),
            Ok(1)
        );
        // A member of a newer release does not raise it past what this build speaks.
        assert_eq!(common_version(&[member(1, Some(NEWEST + 3))]), Ok(NEWEST));
    }

    #[test]
    fn a_member_that_does_not_answer_allows_no_version() {
        let why = common_version(&[member(1, Some(2)), member(3, None)]).unwrap_err();
        assert_eq!(why, "node 3 did not answer: connection refused");
    }

    #[test]
    fn a_raise_past_what_a_node_speaks_is_not_followable() {
        let raise = |index: u64, version: u32| openraft::Entry::<crate::raft::TypeConfig> {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: openraft::EntryPayload::Normal(crate::state::Batch {
                cmds: vec![Cmd::SetClusterVersion { version }],
                ..Default::default()
            }),
        };
        assert_eq!(
            crate::raft::followable(&[raise(4, 1), raise(5, 2)], 2),
            Ok(())
        );
        let why = crate::raft::followable(&[raise(4, 1), raise(5, 2)], 1).unwrap_err();
        assert!(
            why.starts_with(
                "log entry 5 raises the cluster version to 2, and this node speaks \
                 cluster version 1 at most"
            ),
            "{why}"
        );
    }

    #[test]
    fn the_new_cluster_record_is_read_back_removed_and_a_damaged_one_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(new_cluster_version(dir.path()).expect("read"), None);
        record_new_cluster(dir.path(), 2).expect("record");
        assert_eq!(new_cluster_version(dir.path()).expect("read"), Some(2));
        forget_new_cluster(dir.path());
        assert_eq!(new_cluster_version(dir.path()).expect("read"), None);
        forget_new_cluster(dir.path());
        std::fs::write(dir.path().join(data_dir::NEW_CLUSTER_FILE), "two\n").expect("write");
        let err = new_cluster_version(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("new-cluster-version does not hold a cluster version: \"two\"")
                && err.contains("conch cluster finalize"),
            "{err}"
        );
    }

    #[test]
    fn a_node_of_0_1_0_speaks_the_first_version_only() {
        let old = NodeInfo::release_0_1_0();
        assert_eq!((old.cluster_version_max, old.data_format_max), (1, 7));
        let this = NodeInfo::speaking(NEWEST);
        assert_eq!(
            (this.cluster_version_max, this.data_format_max),
            (NEWEST, 8)
        );
        let capped = NodeInfo::speaking(BASE);
        assert_eq!((capped.cluster_version_max, capped.data_format_max), (1, 7));
        assert_eq!(capped.release, crate::support::release::RELEASE);
    }
}
