//! `conch cluster status`: every node's view of the Raft cluster, one row per node.
//!
//! ```text
//! NODE  ADDRESS         STATE     LEADER  TERM  LAST-LOG  COMMIT  APPLIED  RELEASE  MEMBERS
//! 1     127.0.0.1:7001  Leader    1       3     120       120     120      0.2.0    1,2,3
//! 2     127.0.0.1:7002  Follower  1       3     120       120     120      0.2.0    1,2,3
//! -     127.0.0.1:7003  unreachable: tcp connect error: Connection refused (os error 111)
//! cluster version: 2
//! ```
//!
//! The endpoints are asked first, then any member address they report that was not asked yet,
//! so one endpoint is enough to see the whole cluster.

use conch_client::Client;
use conch_client::proto::conch::ClusterStatusResponse;
use serde::Serialize;

/// One node's row.
#[derive(Debug, Serialize)]
pub(crate) struct Row {
    /// The address asked.
    pub endpoint: String,
    /// The answer, if the node gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<NodeStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The node answered, refusing the call (no token, or an unknown or revoked one).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// The node could not be asked because of the TLS settings (a client certificate it
    /// refuses: revoked, of another CA, missing; TLS to a plaintext node or the other way).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub tls_refused: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct NodeStatus {
    pub node_id: u64,
    pub addr: String,
    pub state: String,
    pub leader_id: u64,
    pub leader_addr: String,
    pub term: u64,
    pub last_log_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    pub members: Vec<MemberJson>,
    pub state_hash: String,
    /// Empty on a node that has not joined a cluster yet.
    pub cluster_id: String,
    /// What the node finds wrong with its own setup.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// The release the node runs (a node of 0.1.0 does not say: "0.1.0").
    pub release: String,
    /// The newest cluster version its release speaks.
    pub cluster_version_max: u32,
    /// The replicated cluster version, as the node applied it.
    pub cluster_version: u32,
}

#[derive(Debug, Serialize)]
pub(crate) struct MemberJson {
    pub id: u64,
    pub addr: String,
    pub voter: bool,
}

impl From<ClusterStatusResponse> for NodeStatus {
    fn from(r: ClusterStatusResponse) -> Self {
        NodeStatus {
            node_id: r.node_id,
            addr: r.addr,
            state: r.state,
            leader_id: r.leader_id,
            leader_addr: r.leader_addr,
            term: r.term,
            last_log_index: r.last_log_index,
            commit_index: r.commit_index,
            applied_index: r.applied_index,
            snapshot_index: r.snapshot_index,
            members: r
                .members
                .into_iter()
                .map(|m| MemberJson {
                    id: m.id,
                    addr: m.addr,
                    voter: m.voter,
                })
                .collect(),
            state_hash: format!("{:016x}", r.state_hash),
            cluster_id: r.cluster_id,
            problems: r.problems,
            // A node of 0.1.0 leaves these out.
            release: if r.release.is_empty() {
                "0.1.0".to_string()
            } else {
                r.release
            },
            cluster_version_max: r.cluster_version_max.max(1),
            cluster_version: r.cluster_version.max(1),
        }
    }
}

/// Members as `1,2,3` with learners marked: `1,2,3,4(learner)`.
fn members_cell(members: &[MemberJson]) -> String {
    if members.is_empty() {
        return "-".to_string();
    }
    members
        .iter()
        .map(|m| {
            if m.voter {
                m.id.to_string()
            } else {
                format!("{}(learner)", m.id)
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The table, aligned; an unreachable node's row ends in its error.
pub(crate) fn render_table(rows: &[Row]) -> Vec<String> {
    let header = [
        "NODE", "ADDRESS", "STATE", "LEADER", "TERM", "LAST-LOG", "COMMIT", "APPLIED", "RELEASE",
        "MEMBERS",
    ];
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for row in rows {
        match &row.status {
            Some(s) => cells.push(vec![
                s.node_id.to_string(),
                if s.addr.is_empty() {
                    row.endpoint.clone()
                } else {
                    s.addr.clone()
                },
                if s.state.is_empty() {
                    "?".to_string()
                } else {
                    s.state.clone()
                },
                if s.leader_id == 0 {
                    "-".to_string()
                } else {
                    s.leader_id.to_string()
                },
                s.term.to_string(),
                s.last_log_index.to_string(),
                s.commit_index.to_string(),
                s.applied_index.to_string(),
                s.release.clone(),
                members_cell(&s.members),
            ]),
            None => cells.push(vec![
                "-".to_string(),
                row.endpoint.clone(),
                format!(
                    "unreachable: {}",
                    row.error.as_deref().unwrap_or("no answer")
                ),
            ]),
        }
    }
    let columns = header.len();
    let mut widths = vec![0usize; columns];
    for line in &cells {
        // A short (unreachable) row's last cell spans the rest of the line.
        if line.len() < columns {
            for (i, c) in line.iter().enumerate().take(line.len() - 1) {
                widths[i] = widths[i].max(c.len());
            }
        } else {
            for (i, c) in line.iter().enumerate() {
                widths[i] = widths[i].max(c.len());
            }
        }
    }
    cells
        .iter()
        .map(|line| {
            let mut out = String::new();
            for (i, c) in line.iter().enumerate() {
                if i + 1 == line.len() {
                    out.push_str(c);
                } else {
                    out.push_str(&format!("{c:<w$}  ", w = widths[i]));
                }
            }
            out
        })
        .collect()
}

/// The line under the table on the cluster version: the one the nodes applied (the highest
/// seen, when a node lags), and whether an upgrade waits to be finalized: every node speaks a
/// newer version than the cluster runs at.
pub(crate) fn cluster_version_line(rows: &[Row]) -> Option<String> {
    let answered: Vec<&NodeStatus> = rows.iter().filter_map(|r| r.status.as_ref()).collect();
    let current = answered.iter().map(|s| s.cluster_version).max()?;
    let common = answered.iter().map(|s| s.cluster_version_max).min()?;
    Some(if common > current {
        format!(
            "cluster version: {current} (every node that answered speaks {common}: run `conch \
             cluster finalize` once all run the new release)"
        )
    } else {
        format!("cluster version: {current}")
    })
}

/// The line under the table naming the cluster id, or every id seen when nodes disagree.
pub(crate) fn cluster_id_line(rows: &[Row]) -> Option<String> {
    let mut ids: Vec<(String, Vec<u64>)> = Vec::new();
    for s in rows.iter().filter_map(|r| r.status.as_ref()) {
        let id = if s.cluster_id.is_empty() {
            "none".to_string()
        } else {
            s.cluster_id.clone()
        };
        match ids.iter_mut().find(|(known, _)| *known == id) {
            Some((_, nodes)) => nodes.push(s.node_id),
            None => ids.push((id, vec![s.node_id])),
        }
    }
    match ids.as_slice() {
        [] => None,
        [(id, _)] => Some(format!("cluster id: {id}")),
        many => Some(format!(
            "cluster ids differ: {}",
            many.iter()
                .map(|(id, nodes)| format!(
                    "{id} (node {})",
                    nodes
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                ))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// `cluster status` and `cluster health`: degraded (see `health::evaluate`).
pub(crate) const STATUS_DEGRADED: u8 = 1;
/// `cluster status` and `cluster health`: unhealthy (see `health::evaluate`).
pub(crate) const STATUS_NO_LEADER: u8 = 2;

async fn ask_all(client: &Client, endpoints: Vec<String>) -> Vec<Row> {
    let mut set = tokio::task::JoinSet::new();
    for (i, ep) in endpoints.into_iter().enumerate() {
        let client = client.clone();
        set.spawn(async move {
            let result = client.cluster_status_of(&ep).await;
            (i, ep, result)
        });
    }
    let mut rows = Vec::new();
    while let Some(joined) = set.join_next().await {
        if let Ok((i, endpoint, result)) = joined {
            let row = match result {
                Ok(s) => Row {
                    endpoint,
                    status: Some(s.into()),
                    error: None,
                    refused: false,
                    tls_refused: false,
                },
                Err(e) => Row {
                    endpoint,
                    status: None,
                    refused: matches!(
                        e.code(),
                        Some(tonic::Code::Unauthenticated | tonic::Code::PermissionDenied)
                    ),
                    tls_refused: e.is_tls_configuration(),
                    error: Some(short_error(&e)),
                },
            };
            rows.push((i, row));
        }
    }
    rows.sort_by_key(|(i, _)| *i);
    rows.into_iter().map(|(_, r)| r).collect()
}

fn short_error(e: &conch_client::Error) -> String {
    match e {
        conch_client::Error::Unavailable { last, .. } => last.clone(),
        other => other.to_string(),
    }
}

/// Every node's answer: the endpoints first, then members they report that nobody asked.
pub(crate) async fn gather(client: &Client) -> Vec<Row> {
    let mut rows = ask_all(client, client.endpoints()).await;
    // Members the endpoints know of that nobody asked yet.
    let asked_ids: Vec<u64> = rows
        .iter()
        .filter_map(|r| r.status.as_ref().map(|s| s.node_id))
        .collect();
    let asked_addrs: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            let mut v = vec![r.endpoint.clone()];
            if let Some(s) = &r.status {
                v.push(s.addr.clone());
            }
            v
        })
        .collect();
    let mut more: Vec<String> = Vec::new();
    for r in &rows {
        for m in r.status.iter().flat_map(|s| &s.members) {
            if !asked_ids.contains(&m.id)
                && !m.addr.is_empty()
                && !asked_addrs.contains(&m.addr)
                && !more.contains(&m.addr)
            {
                more.push(m.addr.clone());
            }
        }
    }
    if !more.is_empty() {
        rows.extend(ask_all(client, more).await);
    }
    rows
}

/// When the caller's refusal leaves the cluster's health unknown: the refusal and its exit
/// status, to be reported as one, not as an outage: 77 when access control refused the token
/// (or its lack), 78 when the TLS settings kept nodes from being asked (a revoked client
/// certificate, one of another CA, none where one is required, TLS to a plaintext node). A
/// monitoring check with a bad credential must not page for the cluster.
///
/// The health is unknown when no node answered, or when the nodes that answered show no quorum
/// (`unhealthy`) while others refused the caller: a node that refused may well follow the
/// leader, as while a new revocation list reaches one node before another.
pub(crate) fn refusal(rows: &[Row], unhealthy: bool) -> Option<(u8, String)> {
    if !unhealthy && rows.iter().any(|r| r.status.is_some()) {
        return None;
    }
    let (code, refused) = match rows.iter().find(|r| r.refused) {
        Some(r) => (crate::exit::NO_PERMISSION, r),
        None => (crate::exit::CONFIG, rows.iter().find(|r| r.tls_refused)?),
    };
    Some((
        code,
        format!(
            "refused by {}: {}",
            refused.endpoint,
            refused.error.as_deref().unwrap_or("access denied")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use conch_client::proto::conch::Member;

    fn node(id: u64, state: &str) -> Row {
        let members = (1..=3)
            .map(|i| Member {
                id: i,
                addr: format!("127.0.0.1:700{i}"),
                voter: true,
            })
            .collect();
        Row {
            endpoint: format!("127.0.0.1:700{id}"),
            status: Some(
                ClusterStatusResponse {
                    node_id: id,
                    addr: format!("127.0.0.1:700{id}"),
                    leader_id: 1,
                    leader_addr: "127.0.0.1:7001".into(),
                    term: 3,
                    state: state.into(),
                    last_log_index: 120,
                    commit_index: 120,
                    applied_index: 119,
                    members,
                    ..Default::default()
                }
                .into(),
            ),
            error: None,
            refused: false,
            tls_refused: false,
        }
    }

    #[test]
    fn table_aligns_and_shows_unreachable_nodes() {
        let rows = vec![
            node(1, "Leader"),
            node(2, "Follower"),
            Row {
                endpoint: "127.0.0.1:7003".into(),
                status: None,
                error: Some("connection refused".into()),
                refused: false,
                tls_refused: false,
            },
        ];
        assert_eq!(
            render_table(&rows),
            [
                "NODE  ADDRESS         STATE     LEADER  TERM  LAST-LOG  COMMIT  APPLIED  RELEASE  MEMBERS",
                "1     127.0.0.1:7001  Leader    1       3     120       120     119      0.1.0    1,2,3",
                "2     127.0.0.1:7002  Follower  1       3     120       120     119      0.1.0    1,2,3",
                "-     127.0.0.1:7003  unreachable: connection refused",
            ]
        );
        assert_eq!(cluster_id_line(&rows).as_deref(), Some("cluster id: none"));
    }

    #[test]
    fn the_cluster_version_line_says_when_an_upgrade_waits_to_be_finalized() {
        let mut rows = vec![node(1, "Leader"), node(2, "Follower")];
        // Nodes of 0.1.0 say nothing of versions: version 1, nothing to finalize.
        assert_eq!(
            cluster_version_line(&rows).as_deref(),
            Some("cluster version: 1")
        );
        let upgrade = |row: &mut Row| {
            if let Some(s) = row.status.as_mut() {
                s.release = "0.2.0".into();
                s.cluster_version_max = 2;
            }
        };
        upgrade(&mut rows[0]);
        assert_eq!(
            cluster_version_line(&rows).as_deref(),
            Some("cluster version: 1"),
            "one node still runs the previous release"
        );
        upgrade(&mut rows[1]);
        assert_eq!(
            cluster_version_line(&rows).as_deref(),
            Some(
                "cluster version: 1 (every node that answered speaks 2: run `conch cluster \
                 finalize` once all run the new release)"
            )
        );
        for row in &mut rows {
            if let Some(s) = row.status.as_mut() {
                s.cluster_version = 2;
            }
        }
        assert_eq!(
            cluster_version_line(&rows).as_deref(),
            Some("cluster version: 2")
        );
    }

    #[test]
    fn learners_are_marked() {
        let m = [
            MemberJson {
                id: 1,
                addr: String::new(),
                voter: true,
            },
            MemberJson {
                id: 4,
                addr: String::new(),
                voter: false,
            },
        ];
        assert_eq!(members_cell(&m), "1,4(learner)");
        assert_eq!(members_cell(&[]), "-");
    }
}
