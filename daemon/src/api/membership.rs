//! Membership changes that cannot hurt the cluster: which nodes a removal takes out (voters and
//! learners alike, every one of them a member), and the check a new learner's address passes
//! before it is added (it answers as a conch node that is empty or already of this cluster).

use std::collections::BTreeSet;
use std::time::Duration;

use conch_proto::conch::ClusterStatusRequest;
use tonic::metadata::MetadataMap;

use super::auth::forward;
use super::status::ApiError;
use crate::node::Node;
use crate::state::Error;

/// How long the address of a new learner has to answer.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The members a removal takes out, split by role (Raft removes voters and learners with
/// different changes).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Removal {
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
}

/// Checks a removal against the current members: every id must be a member, and at least one
/// voter must remain. The error names the first id that is not a member.
pub(crate) fn plan_removal(
    voters: &BTreeSet<u64>,
    learners: &BTreeSet<u64>,
    remove: &[u64],
) -> Result<Removal, Error> {
    let remove: BTreeSet<u64> = remove.iter().copied().collect();
    if let Some(id) = remove
        .iter()
        .find(|id| !voters.contains(id) && !learners.contains(id))
    {
        let members: Vec<String> = voters.union(learners).map(u64::to_string).collect();
        return Err(Error::invalid(format!(
            "node {id} is not a member (members: {})",
            members.join(", ")
        )));
    }
    let removal = Removal {
        voters: voters.intersection(&remove).copied().collect(),
        learners: learners.intersection(&remove).copied().collect(),
    };
    if removal.voters.len() == voters.len() {
        return Err(Error::invalid(
            "the cluster must keep at least one voter".to_string(),
        ));
    }
    Ok(removal)
}

/// Asks the node at `addr` (over the peer dialer, so TLS clusters work) for its status, and
/// accepts it as learner `id` only when it answers within [`PROBE_TIMEOUT`] as node `id`, with no
/// cluster id yet or this cluster's. Anything else is refused, saying what was found. With peer
/// mutual TLS the dial itself already requires a node certificate naming `id`.
pub(crate) async fn probe_new_member(
    node: &Node,
    id: u64,
    addr: &str,
    metadata: &MetadataMap,
) -> Result<(), ApiError> {
    let refuse =
        |found: String| ApiError::NotJoinable(format!("not adding node {id} at {addr}: {found}"));
    let mut admin = node
        .admin_of(id, addr)
        .map_err(|e| refuse(format!("cannot dial it: {e}")))?;
    let mut request = forward(metadata, ClusterStatusRequest {});
    request.set_timeout(PROBE_TIMEOUT);
    let answer = tokio::time::timeout(PROBE_TIMEOUT, admin.cluster_status(request)).await;
    let status = match answer {
        Err(_) => {
            return Err(refuse(format!(
                "nothing answered within {} s",
                PROBE_TIMEOUT.as_secs()
            )));
        }
        Ok(Err(status)) => {
            let found = match status.code() {
                tonic::Code::FailedPrecondition => {
                    format!("it is a node of another cluster ({})", status.message())
                }
                tonic::Code::Unimplemented => {
                    "something answers there, but not a conch node".to_string()
                }
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => {
                    format!("nothing answers as a conch node ({})", status.message())
                }
                code => format!("it refused the check: {code:?}: {}", status.message()),
            };
            return Err(refuse(found));
        }
        Ok(Ok(reply)) => reply.into_inner(),
    };
    if status.node_id != id {
        return Err(refuse(format!(
            "the node there is node {}, not node {id}",
            status.node_id
        )));
    }
    // A node that cannot decode what the log holds now must not join (see `upgrade.rs`).
    let current = node.applied.read(|s| s.cluster_version()).0;
    let speaks = status.cluster_version_max.max(crate::state::version::BASE);
    if speaks < current {
        let release = match status.release.as_str() {
            "" => "0.1.0",
            release => release,
        };
        return Err(refuse(format!(
            "it runs conch {release}, which speaks cluster version {speaks}, and this cluster \
             runs at version {current}: start it with conch {} or later",
            crate::support::release::first_speaking(current)
                .unwrap_or(crate::support::release::RELEASE)
        )));
    }
    let ours = node.cluster_id.get().unwrap_or_default();
    if !status.cluster_id.is_empty() && status.cluster_id != ours {
        return Err(refuse(format!(
            "it is a node of another cluster (cluster id {}, this cluster's is {ours}); \
             start it with an empty data directory and --join",
            status.cluster_id
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    #[test]
    fn removals_take_voters_and_learners_and_name_strangers() {
        let voters = set(&[1, 2, 3]);
        let learners = set(&[4]);
        assert_eq!(
            plan_removal(&voters, &learners, &[4]).expect("learner"),
            Removal {
                voters: set(&[]),
                learners: set(&[4])
            }
        );
        assert_eq!(
            plan_removal(&voters, &learners, &[3, 4, 3]).expect("both"),
            Removal {
                voters: set(&[3]),
                learners: set(&[4])
            }
        );
        let stranger = plan_removal(&voters, &learners, &[2, 42]).expect_err("not a member");
        assert_eq!(stranger.kind, crate::state::ErrorKind::InvalidArgument);
        assert!(
            stranger.message.contains("node 42 is not a member"),
            "{stranger:?}"
        );
        let all = plan_removal(&voters, &learners, &[1, 2, 3]).expect_err("no voter left");
        assert!(all.message.contains("at least one voter"), "{all:?}");
    }
}
