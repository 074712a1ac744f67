//! `conch cluster health`: one line (or one JSON object) and an exit status for scripts, load
//! balancers and monitoring checks.
//!
//! Every node is asked (the endpoints, then the members they report), and the answers are
//! judged from the leader's point of view:
//! - the leader is the node that says it leads in the highest term any node reports;
//! - a voter *agrees* when it answered, is in that term and names that leader;
//! - **healthy** (exit 0): a leader, every voter agrees, none is catching up;
//! - **degraded** (exit 1): a leader with a majority of voters agreeing, but some voter is down,
//!   follows no leader, or is catching up (applied more than [`CATCHING_UP_ENTRIES`] behind);
//! - **unhealthy** (exit 2): no node answered, no leader, or fewer than a majority agree (a
//!   leader cut off from the others may still believe it leads: it does not count as quorum).

use std::collections::BTreeSet;
use std::process::ExitCode;

use conch_client::Client;
use serde::Serialize;

use crate::cluster::{NodeStatus, Row, STATUS_DEGRADED, STATUS_NO_LEADER};

/// A voter whose applied index is further than this behind the leader's commit is catching up
/// (the same bound as the node's own gRPC health check).
pub(crate) const CATCHING_UP_ENTRIES: u64 = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Level {
    Healthy,
    Degraded,
    Unhealthy,
}

/// The verdict, as `--json` prints it.
#[derive(Debug, Serialize)]
pub(crate) struct Health {
    pub status: Level,
    pub summary: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<u64>,
    pub term: u64,
    pub voters: Vec<u64>,
    /// Voters that answered, are in the leader's term and name the leader.
    pub agreeing: Vec<u64>,
    /// Voters that did not answer.
    pub down: Vec<u64>,
    /// Voters that answered but follow no leader, or another one, or are in another term.
    pub disagreeing: Vec<u64>,
    /// Voters far behind the leader's commit.
    pub catching_up: Vec<u64>,
    /// Endpoints that did not answer (with the error), whoever they are.
    pub unreachable: Vec<String>,
}

impl Health {
    pub(crate) fn exit_code(&self) -> ExitCode {
        match self.status {
            Level::Healthy => ExitCode::SUCCESS,
            Level::Degraded => ExitCode::from(STATUS_DEGRADED),
            Level::Unhealthy => ExitCode::from(STATUS_NO_LEADER),
        }
    }
}

fn ids(list: &[u64]) -> String {
    list.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Judges the cluster from every node's answer.
pub(crate) fn evaluate(rows: &[Row]) -> Health {
    let answered: Vec<&NodeStatus> = rows.iter().filter_map(|r| r.status.as_ref()).collect();
    let unreachable: Vec<String> = rows
        .iter()
        .filter(|r| r.status.is_none())
        .map(|r| {
            format!(
                "{} ({})",
                r.endpoint,
                r.error.as_deref().unwrap_or("no answer")
            )
        })
        .collect();
    let leader = answered
        .iter()
        .filter(|s| s.leader_id != 0 && s.leader_id == s.node_id)
        .max_by_key(|s| s.term)
        .copied();
    // The membership as the leader knows it, else as the node in the highest term knows it.
    let reference = leader.or_else(|| answered.iter().max_by_key(|s| s.term).copied());
    let voters: Vec<u64> = reference
        .map(|s| {
            s.members
                .iter()
                .filter(|m| m.voter)
                .map(|m| m.id)
                .collect::<BTreeSet<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .collect();
    let answer_of = |id: u64| answered.iter().find(|s| s.node_id == id).copied();
    let term = leader.map_or(0, |l| l.term);
    let mut agreeing = Vec::new();
    let mut down = Vec::new();
    let mut disagreeing = Vec::new();
    let mut catching_up = Vec::new();
    for &id in &voters {
        match (answer_of(id), leader) {
            (None, _) => down.push(id),
            (Some(s), Some(l)) if s.term == l.term && s.leader_id == l.node_id => {
                agreeing.push(id);
                if l.commit_index.saturating_sub(s.applied_index) > CATCHING_UP_ENTRIES {
                    catching_up.push(id);
                }
            }
            (Some(_), _) => disagreeing.push(id),
        }
    }
    let majority = voters.len() / 2 + 1;
    let up = voters.len() - down.len();
    let (status, summary) = match leader {
        _ if answered.is_empty() => (
            Level::Unhealthy,
            format!("unhealthy: no node answered ({})", unreachable.join(", ")),
        ),
        None => (
            Level::Unhealthy,
            format!(
                "unhealthy: no leader ({up}/{} voters up{})",
                voters.len(),
                if down.is_empty() {
                    String::new()
                } else {
                    format!("; down: {}", ids(&down))
                }
            ),
        ),
        Some(l) if agreeing.len() < majority => (
            Level::Unhealthy,
            format!(
                "unhealthy: no quorum: node {} says it leads term {} but only {}/{} voters follow it (need {majority})",
                l.node_id,
                l.term,
                agreeing.len(),
                voters.len()
            ),
        ),
        Some(l) => {
            let mut problems = Vec::new();
            if !down.is_empty() {
                problems.push(format!("down: {}", ids(&down)));
            }
            if !disagreeing.is_empty() {
                problems.push(format!("not following the leader: {}", ids(&disagreeing)));
            }
            if !catching_up.is_empty() {
                problems.push(format!("catching up: {}", ids(&catching_up)));
            }
            problems.extend(answered.iter().flat_map(|s| s.problems.iter().cloned()));
            let base = format!(
                "leader {}, term {}, {}/{} voters up, commit index {}",
                l.node_id,
                l.term,
                up,
                voters.len(),
                l.commit_index
            );
            if problems.is_empty() {
                (Level::Healthy, format!("healthy: {base}"))
            } else {
                (
                    Level::Degraded,
                    format!("degraded: {base}; {}; quorum holds", problems.join("; ")),
                )
            }
        }
    };
    Health {
        status,
        summary,
        leader: leader.map(|l| l.node_id),
        term,
        voters,
        agreeing,
        down,
        disagreeing,
        catching_up,
        unreachable,
    }
}

pub(crate) async fn run(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let rows = crate::cluster::gather(client).await;
    let health = evaluate(&rows);
    if let Some((code, refused)) = crate::cluster::refusal(&rows, health.status == Level::Unhealthy)
    {
        eprintln!("conch: the cluster's health is unknown: this caller was {refused}");
        return Ok(ExitCode::from(code));
    }
    let line = if json {
        serde_json::to_string(&health)?
    } else {
        health.summary.clone()
    };
    crate::print_lines([line])?;
    Ok(health.exit_code())
}

/// `conch cluster status`: every node's row, the cluster id, then the verdict [`run`] reaches
/// from the same rows; its exit status is that verdict's, so a node that says it leads but that
/// no majority follows is trusted by neither command.
pub(crate) async fn status(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let rows = crate::cluster::gather(client).await;
    let health = evaluate(&rows);
    if let Some((code, refused)) = crate::cluster::refusal(&rows, health.status == Level::Unhealthy)
    {
        eprintln!("conch: the cluster's health is unknown: this caller was {refused}");
        return Ok(ExitCode::from(code));
    }
    if json {
        crate::print_lines([serde_json::to_string_pretty(&rows)?])?;
    } else {
        let mut lines = crate::cluster::render_table(&rows);
        lines.extend(crate::cluster::cluster_id_line(&rows));
        lines.extend(crate::cluster::cluster_version_line(&rows));
        lines.push(health.summary.clone());
        crate::print_lines(lines)?;
    }
    Ok(health.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::MemberJson;

    fn node(id: u64, leader: u64, term: u64, applied: u64) -> Row {
        Row {
            endpoint: format!("127.0.0.1:700{id}"),
            status: Some(NodeStatus {
                node_id: id,
                addr: format!("127.0.0.1:700{id}"),
                state: if leader == id { "Leader" } else { "Follower" }.into(),
                leader_id: leader,
                leader_addr: String::new(),
                term,
                last_log_index: applied,
                commit_index: applied,
                applied_index: applied,
                snapshot_index: 0,
                members: (1..=3)
                    .map(|id| MemberJson {
                        id,
                        addr: format!("127.0.0.1:700{id}"),
                        voter: true,
                    })
                    .collect(),
                state_hash: String::new(),
                cluster_id: "c".into(),
                problems: Vec::new(),
                release: "0.2.0".into(),
                cluster_version_max: 2,
                cluster_version: 2,
            }),
            error: None,
            refused: false,
            tls_refused: false,
        }
    }

    fn down(id: u64) -> Row {
        Row {
            endpoint: format!("127.0.0.1:700{id}"),
            status: None,
            error: Some("connection refused".into()),
            refused: false,
            tls_refused: false,
        }
    }

    #[test]
    fn all_up_with_a_leader_is_healthy() {
        let h = evaluate(&[node(1, 1, 3, 50), node(2, 1, 3, 50), node(3, 1, 3, 50)]);
        assert_eq!(h.status, Level::Healthy, "{}", h.summary);
        assert_eq!(
            h.summary,
            "healthy: leader 1, term 3, 3/3 voters up, commit index 50"
        );
        assert_eq!(h.exit_code(), ExitCode::SUCCESS);
    }

    #[test]
    fn a_minority_down_or_behind_is_degraded() {
        let h = evaluate(&[node(1, 1, 3, 50), node(2, 1, 3, 50), down(3)]);
        assert_eq!(h.status, Level::Degraded, "{}", h.summary);
        assert_eq!(h.down, vec![3]);
        assert!(
            h.summary.contains("down: 3") && h.summary.contains("2/3"),
            "{}",
            h.summary
        );

        let mut behind = node(1, 1, 3, 5000);
        if let Some(s) = behind.status.as_mut() {
            s.commit_index = 5000;
        }
        let h = evaluate(&[behind, node(2, 1, 3, 5000), node(3, 1, 3, 10)]);
        assert_eq!(h.status, Level::Degraded, "{}", h.summary);
        assert_eq!(h.catching_up, vec![3]);
    }

    #[test]
    fn a_refusal_is_reported_when_it_leaves_the_health_unknown() {
        let refused = || {
            let mut row = down(1);
            row.refused = true;
            row.error = Some("unknown or revoked token".into());
            row
        };
        let (code, said) = crate::cluster::refusal(&[refused(), down(2)], true).expect("a refusal");
        assert!(said.contains("unknown or revoked token"), "{said}");
        assert_eq!(code, crate::exit::NO_PERMISSION);
        let tls = || {
            let mut row = down(1);
            row.tls_refused = true;
            row.error = Some("received fatal alert: CertificateRevoked".into());
            row
        };
        let (code, said) = crate::cluster::refusal(&[tls(), down(2)], true).expect("a refusal");
        assert!(said.contains("CertificateRevoked"), "{said}");
        assert_eq!(code, crate::exit::CONFIG);
        assert_eq!(crate::cluster::refusal(&[down(1), down(2)], true), None);
        // Nodes answered and show a quorum: the refusal of another changes nothing.
        let quorum = [node(1, 1, 3, 5), node(2, 1, 3, 5), tls()];
        assert_ne!(evaluate(&quorum).status, Level::Unhealthy);
        assert_eq!(crate::cluster::refusal(&quorum, false), None);
        // One node answered (it has not yet read the new revocation list), the others refused
        // the caller: no quorum can be seen, so the health is unknown, not an outage.
        for (rows, code) in [
            ([node(1, 1, 3, 5), tls(), tls()], crate::exit::CONFIG),
            (
                [node(1, 1, 3, 5), refused(), down(3)],
                crate::exit::NO_PERMISSION,
            ),
        ] {
            assert_eq!(evaluate(&rows).status, Level::Unhealthy);
            let (got, said) = crate::cluster::refusal(&rows, true).expect("a refusal");
            assert_eq!(got, code, "{said}");
        }
        // No quorum and nobody refused: an outage, as it looks.
        assert_eq!(
            crate::cluster::refusal(&[node(1, 1, 3, 5), down(2), down(3)], true),
            None
        );
    }

    #[test]
    fn a_node_that_reports_a_setup_problem_makes_the_cluster_degraded() {
        let mut troubled = node(2, 1, 3, 50);
        if let Some(s) = troubled.status.as_mut() {
            s.problems = vec!["node 2 was started with --bootstrap-admin-token-file but …".into()];
        }
        let h = evaluate(&[node(1, 1, 3, 50), troubled, node(3, 1, 3, 50)]);
        assert_eq!(h.status, Level::Degraded, "{}", h.summary);
        assert!(
            h.summary.contains("bootstrap-admin-token-file"),
            "{}",
            h.summary
        );
    }

    #[test]
    fn no_leader_or_no_quorum_is_unhealthy() {
        let h = evaluate(&[node(1, 0, 4, 50), node(2, 0, 4, 50), down(3)]);
        assert_eq!(h.status, Level::Unhealthy, "{}", h.summary);
        assert!(
            h.summary.starts_with("unhealthy: no leader"),
            "{}",
            h.summary
        );

        // An old leader cut off from the others still says it leads term 3; the others moved
        // on to term 4 and elected node 2: node 2's view wins.
        let h = evaluate(&[node(1, 1, 3, 50), node(2, 2, 4, 60), node(3, 2, 4, 60)]);
        assert_eq!(h.status, Level::Degraded, "{}", h.summary);
        assert_eq!((h.leader, h.disagreeing.clone()), (Some(2), vec![1]));

        // Only the cut-off leader answers: it is no quorum.
        let h = evaluate(&[node(1, 1, 3, 50), down(2), down(3)]);
        assert_eq!(h.status, Level::Unhealthy, "{}", h.summary);
        assert!(h.summary.contains("no quorum"), "{}", h.summary);

        let h = evaluate(&[down(1), down(2)]);
        assert_eq!(h.status, Level::Unhealthy);
        assert!(
            h.summary.starts_with("unhealthy: no node answered"),
            "{}",
            h.summary
        );
    }

    /// A node that says it leads but that no majority follows (cut off from the others, still
    /// believing it leads an old term) is not trusted: unhealthy, the exit status `cluster
    /// status` shares.
    #[test]
    fn a_leader_cut_off_from_the_others_is_not_trusted() {
        let alone = [node(1, 1, 3, 50), down(2), down(3)];
        let h = evaluate(&alone);
        assert_eq!(h.status, Level::Unhealthy, "{}", h.summary);
        assert_eq!(h.exit_code(), ExitCode::from(STATUS_NO_LEADER));
        // With everyone answering, the leader of the highest term is the one trusted.
        let all = [node(1, 1, 3, 50), node(2, 2, 4, 50), node(3, 2, 4, 50)];
        let h = evaluate(&all);
        assert_eq!(h.leader, Some(2));
        assert_eq!(h.status, Level::Degraded, "{}", h.summary);
        assert_eq!(h.disagreeing, vec![1]);
        // A voter that gave no row at all is down.
        let h = evaluate(&[node(1, 1, 3, 50), node(2, 1, 3, 50)]);
        assert_eq!((h.status, h.down.clone()), (Level::Degraded, vec![3]));
    }
}
