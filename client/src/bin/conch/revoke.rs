//! `conch revoke sema|lock|elect …`: an administrator takes a holder's slot and says why;
//! `conch audit`: the trail that records it; and [`revoked`], what a holder's conch asks once
//! it finds its hold gone, to say who took it and why (exit 81).
//!
//! The revoke is one `RevokeHolder` call: the cluster revokes the holder's whole lease (every
//! hold and wait of it), grants the next waiters in the same entry, and records who did it and
//! why. Revoke is a subcommand of its own, not a flag of `conch sema NAME`, so that it can never
//! be read as a command to run under a slot.

use std::process::ExitCode;
use std::time::Duration;

use conch_client::audit::REVOKE_HOLDER;
use conch_client::proto::conch::AuditRecord;
use conch_client::{Client, LeaseKind, elect, sema};
use serde::Serialize;

use crate::cli::{AuditArgs, RevokeCommand};
use crate::exit::{self, Exit};
use crate::timefmt::format_unix_nanos;

/// What `conch audit --json` prints per record.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Entry {
    pub seq: u64,
    pub at: Option<String>,
    pub actor: String,
    pub actor_role: String,
    pub actor_token_id: String,
    pub action: String,
    pub namespace: String,
    pub object_kind: String,
    pub object: String,
    pub lease_id: String,
    pub holder: String,
    pub reason: String,
    pub detail: String,
}

fn entry(r: &AuditRecord) -> Entry {
    Entry {
        seq: r.seq,
        at: format_unix_nanos(r.at),
        actor: r.actor.clone(),
        actor_role: r.actor_role.clone(),
        actor_token_id: r.actor_token_id.clone(),
        action: r.action.clone(),
        namespace: r.namespace_name.clone(),
        object_kind: r.object_kind.clone(),
        object: r.object_name.clone(),
        lease_id: r.lease_id.clone(),
        holder: r.holder.clone(),
        reason: r.reason.clone(),
        detail: r.detail.clone(),
    }
}

/// Who, as a line shows it: `ops (role admins)` or `anonymous`.
pub(crate) fn actor(r: &AuditRecord) -> String {
    match r.actor_role.as_str() {
        "" => r.actor.clone(),
        role => format!("{} (role {role})", r.actor),
    }
}

/// One record as a line: time, who, what, target, then the reason or what changed.
pub(crate) fn line(r: &AuditRecord) -> String {
    let at = format_unix_nanos(r.at).unwrap_or_else(|| "-".into());
    let mut target = match r.object_kind.as_str() {
        "state" => "state".to_string(),
        "namespace" => format!("namespace {}", r.namespace_name),
        kind => format!("{kind} {}/{}", r.namespace_name, r.object_name),
    };
    if !r.lease_id.is_empty() {
        target.push_str(&format!(" lease={}", r.lease_id));
    }
    if !r.holder.is_empty() {
        target.push_str(&format!(" holder={}", r.holder));
    }
    let mut out = format!("{at} {} {} {target}", actor(r), r.action);
    if !r.reason.is_empty() {
        out.push_str(&format!(" reason={:?}", r.reason));
    }
    if !r.detail.is_empty() {
        out.push_str(&format!(" ({})", r.detail));
    }
    out
}

pub(crate) async fn run(client: &Client, command: RevokeCommand) -> anyhow::Result<ExitCode> {
    let (kind, namespace, object, lease, reason) = match command {
        RevokeCommand::Sema {
            name,
            max,
            holder,
            reason,
            namespace,
        } => {
            let semaphore = sema::semaphore_name(&name, max).map_err(exit::usage)?;
            (LeaseKind::Semaphore, namespace, semaphore, holder, reason)
        }
        RevokeCommand::Lock {
            path,
            holder,
            reason,
            namespace,
        } => (LeaseKind::Lock, namespace, path, holder, reason),
        RevokeCommand::Elect {
            name,
            reason,
            namespace,
        } => {
            let semaphore = elect::semaphore_name(&name).map_err(exit::usage)?;
            let lease = leader_lease(client, &namespace, &name, &semaphore).await?;
            (LeaseKind::Semaphore, namespace, semaphore, lease, reason)
        }
    };
    let record = client
        .revoke_holder(kind, &namespace, &object, &lease, &reason)
        .await?;
    crate::print_lines([line(&record)])?;
    Ok(ExitCode::SUCCESS)
}

/// The lease of the election's leader: its first holder, in grant order.
async fn leader_lease(
    client: &Client,
    namespace: &str,
    name: &str,
    semaphore: &str,
) -> anyhow::Result<String> {
    let holders = match client.list_holders(namespace, semaphore).await {
        Ok(h) => h,
        Err(e) if e.is_not_found() => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let Some(leader) = holders.into_iter().min_by_key(|h| h.fencing_token) else {
        return Err(Exit {
            code: exit::REFUSED,
            message: format!("election {namespace}/{name} has no leader to revoke"),
        }
        .into());
    };
    if leader.lease_id.is_empty() {
        return Err(Exit {
            code: exit::NO_PERMISSION,
            message: format!(
                "the leader's lease is not shown to this token: revoking needs admin on \
                 namespace {namespace}"
            ),
        }
        .into());
    }
    Ok(leader.lease_id)
}

pub(crate) async fn audit(client: &Client, args: &AuditArgs) -> anyhow::Result<ExitCode> {
    let namespace = args.namespace.as_deref().unwrap_or("");
    let lease = args.lease.as_deref().unwrap_or("");
    let records = client
        .list_audit(namespace, lease, args.limit as usize)
        .await?;
    if args.json {
        let entries: Vec<Entry> = records.iter().map(entry).collect();
        crate::print_lines([serde_json::to_string_pretty(&entries)?])?;
    } else if records.is_empty() {
        crate::print_lines(["no records".to_string()])?;
    } else {
        crate::print_lines(records.iter().map(line))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// How long a holder that lost its hold waits for the trail's answer before it exits 79 as
/// for any other loss.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The administrator's revoke that ended lease `lease_id` of `namespace`, if the audit trail
/// says so: called once a holder knows its hold is gone (its refresh found the lease gone).
/// `None` when the trail has no such record or cannot be read now (the loss is then an
/// ordinary one).
pub(crate) async fn revoked(
    client: &Client,
    namespace: &str,
    lease_id: &str,
) -> Option<AuditRecord> {
    match tokio::time::timeout(LOOKUP_TIMEOUT, client.revocation(namespace, lease_id)).await {
        Ok(Ok(record)) => record.filter(|r| r.action == REVOKE_HOLDER),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "audit trail lookup failed");
            None
        }
        Err(_) => None,
    }
}

/// The line a revoked holder prints after `conch: `.
pub(crate) fn revoked_line(slot: &str, record: &AuditRecord) -> String {
    let at = format_unix_nanos(record.at).unwrap_or_else(|| "-".into());
    format!(
        "{slot} revoked by {} at {at}: {}",
        actor(record),
        record.reason
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> AuditRecord {
        AuditRecord {
            seq: 3,
            at: 1_781_259_300 * 1_000_000_000,
            actor: "ops".into(),
            actor_role: "admins".into(),
            actor_token_id: "tk_2".into(),
            action: REVOKE_HOLDER.into(),
            namespace_name: "conch".into(),
            object_kind: "semaphore".into(),
            object_name: "jobs.2".into(),
            lease_id: "1-abc".into(),
            holder: "node1/42".into(),
            reason: "stuck since 9".into(),
            detail: String::new(),
        }
    }

    #[test]
    fn a_line_names_time_actor_action_target_and_reason() {
        assert_eq!(
            line(&record()),
            "2026-06-12T10:15:00Z ops (role admins) revoke-holder semaphore conch/jobs.2 \
             lease=1-abc holder=node1/42 reason=\"stuck since 9\""
        );
        let budget = AuditRecord {
            actor: "anonymous".into(),
            actor_role: String::new(),
            action: "set-budget".into(),
            namespace_name: String::new(),
            object_kind: "state".into(),
            object_name: String::new(),
            lease_id: String::new(),
            holder: String::new(),
            reason: String::new(),
            detail: "budget_bytes 1 -> 2".into(),
            ..record()
        };
        assert_eq!(
            line(&budget),
            "2026-06-12T10:15:00Z anonymous set-budget state (budget_bytes 1 -> 2)"
        );
    }

    #[test]
    fn the_revoked_holder_is_told_who_and_why() {
        assert_eq!(
            revoked_line("slot", &record()),
            "slot revoked by ops (role admins) at 2026-06-12T10:15:00Z: stuck since 9"
        );
    }
}
