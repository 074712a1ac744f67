//! Membership changes that cannot hurt the cluster: which nodes a removal takes out (voters and
//! learners alike, every one of them a member).

use std::collections::BTreeSet;

use crate::state::Error;

/// The members a removal takes out, split by role (Raft removes voters and learners with
/// different changes).
#[derive(Debug, PartialEq, Eq)]
pub struct Removal {
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
}

/// Checks a removal against the current members: every id must be a member, and at least one
/// voter must remain. The error names the first id that is not a member.
pub fn plan_removal(
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
