//! Rolling upgrades: which release each member runs, and raising the cluster version once every
//! member speaks the new one.
//!
//! A node tells its release and the cluster versions it speaks over the peer service
//! (`ConchPeer.NodeInfo`); a node of release 0.1.0 answers UNIMPLEMENTED, which means cluster
//! version 1 only. The cluster version moves only through [`Cmd::SetClusterVersion`], proposed
//! here and nowhere else:
//! - by `ConchAdmin.FinalizeUpgrade` (`conch cluster finalize`), the operator's word that the
//!   upgrade is done and no node will go back to the previous release;
//! - once, by the node that bootstrapped a new cluster: a cluster created by this release has
//!   no previous release to go back to.
//!
//! What always holds: the command is proposed only after every voter and learner of the
//! membership this node knows answered with a release that speaks the new version; a member that
//! does not answer, or speaks less, refuses the raise, naming it. Adding a learner whose release
//! does not speak the cluster version is refused too (`api/membership.rs`), so a member that
//! could not decode the log never joins after the raise.

use std::sync::Arc;
use std::time::Duration;

use conch_proto::conch::PeerMessage;
use serde::{Deserialize, Serialize};

use crate::node::Node;
use crate::raft::NodeId;
use crate::raft::network::{decode, encode};
use crate::state::version::{self, BASE, NEWEST};
use crate::state::{Cmd, Error};

/// How long a member has to answer [`NodeInfo`].
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// What a node says of its release (`ConchPeer.NodeInfo`'s reply).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub release: String,
    /// The newest cluster version the release speaks (it speaks every one from 1 on).
    pub cluster_version_max: u32,
    /// The newest data format it reads (it reads every one from 0.1.0's on).
    pub data_format_max: u32,
}

impl NodeInfo {
    /// This node's.
    pub fn this_node() -> NodeInfo {
        NodeInfo {
            release: crate::release::RELEASE.to_string(),
            cluster_version_max: NEWEST,
            data_format_max: version::NEWEST_DATA_FORMAT,
        }
    }

    /// A node of release 0.1.0, which does not serve `NodeInfo`.
    pub fn release_0_1_0() -> NodeInfo {
        NodeInfo {
            release: "0.1.0".to_string(),
            cluster_version_max: BASE,
            data_format_max: version::OLDEST_DATA_FORMAT,
        }
    }
}

/// One member's answer, or why there was none.
#[derive(Clone, Debug)]
pub struct MemberRelease {
    pub id: NodeId,
    pub info: Result<NodeInfo, String>,
}

/// Asks every voter and learner of the membership this node knows for its release (this node
/// answers for itself), in id order.
pub async fn member_releases(node: &Arc<Node>) -> Vec<MemberRelease> {
    let asks = node.members().into_iter().map(|member| {
        let node = Arc::clone(node);
        async move {
            let info = if member.id == node.id {
                Ok(NodeInfo::this_node())
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
pub fn common_version(members: &[MemberRelease]) -> Result<u32, String> {
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
pub struct Finalized {
    pub previous: u32,
    pub current: u32,
    pub members: Vec<MemberRelease>,
}

/// Raises the cluster version to the newest one every member speaks (through the log, from any
/// node). Refused with `FailedPrecondition`, changing nothing, when a member does not answer;
/// a version already reached is answered as it is.
pub async fn finalize(node: &Arc<Node>) -> Result<Finalized, crate::api::status::ApiError> {
    node.linearizable().await?;
    let previous = node.applied.read(|s| s.cluster_version()).0;
    let members = member_releases(node).await;
    let target = common_version(&members).map_err(|why| {
        Error::failed_precondition(format!(
            "cannot finalize the upgrade: {why}; every voter and learner must answer"
        ))
    })?;
    if target <= previous {
        if previous < NEWEST {
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
                crate::release::first_speaking(NEWEST).unwrap_or(crate::release::RELEASE),
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
    tracing::info!(
        from = previous,
        to = target,
        "cluster version raised: the upgrade is final, no node can go back to the previous release"
    );
    Ok(Finalized {
        previous,
        current: target,
        members,
    })
}

/// Run by the node that bootstrapped a new cluster: raises the cluster version to the newest
/// once every member answers with a release that speaks it. A member of an older release
/// leaves the cluster at the version they share, for the operator to finalize later.
pub async fn finalize_new_cluster(node: Arc<Node>) {
    let mut wait = Duration::from_millis(100);
    loop {
        if node.applied.read(|s| s.cluster_version()).0 >= NEWEST {
            return;
        }
        let members = member_releases(&node).await;
        match common_version(&members) {
            Ok(target) if target < NEWEST => {
                tracing::info!(
                    cluster_version = target,
                    "a member runs an earlier release: the cluster stays at the version all \
                     speak until `conch cluster finalize`"
                );
                return;
            }
            Ok(_) => match finalize(&node).await {
                Ok(done) => {
                    tracing::debug!(cluster_version = done.current, "new cluster finalized");
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
    fn a_node_of_0_1_0_speaks_the_first_version_only() {
        let old = NodeInfo::release_0_1_0();
        assert_eq!((old.cluster_version_max, old.data_format_max), (1, 7));
        assert_eq!(NodeInfo::this_node().cluster_version_max, NEWEST);
    }
}
