//! `conch cluster add-learner|promote|remove|transfer-leader|snapshot|backup|finalize`: the admin calls
//! on the cluster, each answered with what it changed (`status` and `health` only read, in
//! `cluster` and `health`).

use std::collections::BTreeSet;
use std::process::ExitCode;

use conch_client::proto::conch::conch_admin_client::ConchAdminClient;
use conch_client::proto::conch::{
    AddLearnerRequest, ChangeMembershipRequest, FinalizeUpgradeRequest, MembershipResponse,
    TransferLeaderRequest, TriggerSnapshotRequest,
};
use conch_client::{Client, request};

use crate::cli::ClusterCommand;
use crate::exit;

/// `conch cluster add-learner|promote|remove|transfer-leader|snapshot`: one admin call (the node
/// that answers hands membership changes to the leader), then the resulting members.
pub(crate) async fn change(client: &Client, command: ClusterCommand) -> anyhow::Result<ExitCode> {
    let opts = client.default_options();
    match command {
        ClusterCommand::Status { json } => crate::health::status(client, json).await,
        ClusterCommand::Health { json } => crate::health::run(client, json).await,
        ClusterCommand::AddLearner { id, addr } => {
            let r = client
                .call("add learner", opts, |ch, t| {
                    let req = AddLearnerRequest {
                        node_id: id,
                        addr: addr.clone(),
                    };
                    async move { ConchAdminClient::new(ch).add_learner(request(req, t)).await }
                })
                .await?;
            print_members(&r)
        }
        ClusterCommand::Promote { ids } => {
            change_voters(client, |voters| voters.extend(&ids)).await
        }
        ClusterCommand::Remove { ids } => {
            // The server checks every id is a member (voter or learner) and a voter remains.
            let r = client
                .call("remove members", opts, |ch, t| {
                    let req = ChangeMembershipRequest {
                        voters: vec![],
                        remove: ids.clone(),
                    };
                    async move {
                        ConchAdminClient::new(ch)
                            .change_membership(request(req, t))
                            .await
                    }
                })
                .await?;
            print_members(&r)
        }
        ClusterCommand::TransferLeader { id } => {
            // The node answers once it leads, or says who does instead (then this fails).
            let r = client
                .call("transfer leadership", opts, |ch, t| async move {
                    ConchAdminClient::new(ch)
                        .transfer_leader(request(TransferLeaderRequest { to_node_id: id }, t))
                        .await
                })
                .await?;
            crate::print_lines([format!("node {} leads (term {})", r.leader_id, r.term)])?;
            Ok(ExitCode::SUCCESS)
        }
        ClusterCommand::Snapshot { node, all } => snapshot(client, node, all).await,
        ClusterCommand::Budget { size } => {
            let r = client.set_state_budget(size).await?;
            crate::print_lines([format!(
                "state budget {} bytes, {} stored",
                r.budget_bytes, r.state_bytes
            )])?;
            Ok(ExitCode::SUCCESS)
        }
        ClusterCommand::Backup { file } => crate::backup::run(client, &file).await,
        ClusterCommand::Finalize => {
            let r = client
                .call("finalize the upgrade", opts, |ch, t| async move {
                    ConchAdminClient::new(ch)
                        .finalize_upgrade(request(FinalizeUpgradeRequest {}, t))
                        .await
                })
                .await?;
            let mut lines: Vec<String> = r
                .nodes
                .iter()
                .map(|n| {
                    format!(
                        "node {}: conch {} (speaks cluster version {})",
                        n.node_id, n.release, n.cluster_version_max
                    )
                })
                .collect();
            lines.push(if r.cluster_version == r.previous_cluster_version {
                format!(
                    "cluster version {} already: nothing to finalize",
                    r.cluster_version
                )
            } else {
                format!(
                    "cluster version {} -> {}: the upgrade is final",
                    r.previous_cluster_version, r.cluster_version
                )
            });
            crate::print_lines(lines)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `conch cluster snapshot [--node N | --all]`: one line per node snapshotted, naming it.
async fn snapshot(client: &Client, node: Option<u64>, all: bool) -> anyhow::Result<ExitCode> {
    let targets: Vec<u64> = match node {
        Some(id) => vec![id],
        None => {
            let status = client.cluster_status().await?;
            if all {
                status.members.iter().map(|m| m.id).collect()
            } else if status.leader_id != 0 {
                vec![status.leader_id]
            } else {
                return Err(exit::Exit {
                    code: exit::UNAVAILABLE,
                    message: format!(
                        "node {} knows no leader; name a node with --node",
                        status.node_id
                    ),
                }
                .into());
            }
        }
    };
    let mut first_error: Option<anyhow::Error> = None;
    for id in targets {
        let r = client
            .call("trigger snapshot", client.default_options(), |ch, t| {
                let req = TriggerSnapshotRequest { node_id: id };
                async move {
                    ConchAdminClient::new(ch)
                        .trigger_snapshot(request(req, t))
                        .await
                }
            })
            .await;
        match r {
            Ok(r) => crate::print_lines([format!(
                "node {}: snapshot at log index {}",
                r.node_id, r.snapshot_index
            )])?,
            Err(e) => {
                crate::print_lines([format!("node {id}: failed: {e}")])?;
                first_error.get_or_insert(e.into());
            }
        }
    }
    match first_error {
        None => Ok(ExitCode::SUCCESS),
        Some(e) => Ok(ExitCode::from(exit::code_for(&e))),
    }
}

/// Reads the current voters, edits them, and asks for exactly that voter set.
async fn change_voters(
    client: &Client,
    edit: impl FnOnce(&mut BTreeSet<u64>),
) -> anyhow::Result<ExitCode> {
    let status = client.cluster_status().await?;
    let mut voters: BTreeSet<u64> = status
        .members
        .iter()
        .filter(|m| m.voter)
        .map(|m| m.id)
        .collect();
    edit(&mut voters);
    if voters.is_empty() {
        return Err(exit::usage("the cluster must keep at least one voter"));
    }
    let voters: Vec<u64> = voters.into_iter().collect();
    let r = client
        .call("change membership", client.default_options(), |ch, t| {
            let req = ChangeMembershipRequest {
                voters: voters.clone(),
                remove: vec![],
            };
            async move {
                ConchAdminClient::new(ch)
                    .change_membership(request(req, t))
                    .await
            }
        })
        .await?;
    print_members(&r)
}

fn print_members(r: &MembershipResponse) -> anyhow::Result<ExitCode> {
    let mut lines = vec![format!("membership at log index {}:", r.log_index)];
    for m in &r.members {
        let role = if m.voter { "voter" } else { "learner" };
        lines.push(format!("  {}  {}  {role}", m.id, m.addr));
    }
    crate::print_lines(lines)?;
    Ok(ExitCode::SUCCESS)
}
