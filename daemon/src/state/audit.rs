//! The audit trail: who took a slot from whom, or changed what others may hold, and why.
//!
//! Canonical data (in snapshots, backups and the state hash): a counter and a ring of at most
//! [`AUDIT_RECORDS_MAX`] records, oldest first; past it the oldest record is dropped first.
//! Records are made by the command code (`apply.rs`), in the entry that made the change, for:
//! - [`AuditAction::RevokeHolder`]: an administrator's [`Cmd::RevokeHolder`], with its reason;
//! - [`AuditAction::RevokeLease`]: a lease revoked by a token other than the one that created
//!   it, one record per hold it had (only knowable while tokens are in use);
//! - [`AuditAction::DeleteSemaphore`], [`AuditAction::DeleteLock`]: one record per holder the
//!   deletion dropped;
//! - [`AuditAction::UpdateSemaphore`]: a change of a semaphore's permits or hold limit;
//! - [`AuditAction::SetQuotas`], [`AuditAction::SetBudget`]: a change of a namespace's quotas or
//!   of the state's byte budget.
//!
//! Times come from the entry: `at` is the batch's wall stamp (for people to read), `clock_ns`
//! the lease clock; nothing here reads a clock. The actor is the token that made the call, by
//! name and role as they were then (a later revocation of the token does not rewrite it), or
//! `anonymous` for a call without a known token (access control off).
//!
//! What always holds here: at most [`AUDIT_RECORDS_MAX`] records; `seq` strictly increasing and
//! at most the counter; every reason at most [`AUDIT_REASON_MAX_BYTES`] bytes.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

pub(crate) use super::audit_types::*;
use super::types::*;

/// A record before the trail numbers and stamps it.
#[derive(Clone, Debug)]
pub(super) struct Draft {
    pub(super) action: AuditAction,
    pub(super) namespace: String,
    pub(super) object_kind: AuditObject,
    pub(super) object: String,
    pub(super) lease: String,
    pub(super) holder: String,
    pub(super) lease_owner: Option<u64>,
    pub(super) reason: String,
    pub(super) detail: String,
}

impl Draft {
    pub(super) fn new(
        action: AuditAction,
        namespace: &str,
        kind: AuditObject,
        object: &str,
    ) -> Draft {
        Draft {
            action,
            namespace: namespace.to_string(),
            object_kind: kind,
            object: object.to_string(),
            lease: String::new(),
            holder: String::new(),
            lease_owner: None,
            reason: String::new(),
            detail: String::new(),
        }
    }

    /// The same, naming the removed hold's lease (`id`) and its process and creator.
    pub(super) fn holder(mut self, id: String, process_id: &str, owner: Option<u64>) -> Draft {
        self.lease = id;
        self.holder = process_id.to_string();
        self.lease_owner = owner;
        self
    }
}

/// The trail. Its fields are private: records are added only through [`Audit::push`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Audit {
    /// The last `seq` handed out (0: none yet).
    last_seq: u64,
    /// Oldest first.
    records: VecDeque<AuditRecord>,
}

/// Refuses a reason longer than [`AUDIT_REASON_MAX_BYTES`].
pub(crate) fn reason(value: &str) -> Result<(), Error> {
    if value.len() > AUDIT_REASON_MAX_BYTES {
        return Err(Error::invalid(format!(
            "reason must be at most {AUDIT_REASON_MAX_BYTES} bytes, got {}",
            value.len()
        )));
    }
    Ok(())
}

impl Audit {
    /// Adds `draft` as the newest record, dropping the oldest beyond the bound; returns it.
    pub(super) fn push(
        &mut self,
        draft: Draft,
        actor: &Actor,
        at: Nanos,
        clock_ns: Nanos,
    ) -> AuditRecord {
        self.last_seq = self.last_seq.saturating_add(1);
        let record = AuditRecord {
            seq: self.last_seq,
            at,
            clock_ns,
            actor: actor.clone(),
            action: draft.action,
            namespace: draft.namespace,
            object_kind: draft.object_kind,
            object: draft.object,
            lease: draft.lease,
            holder: draft.holder,
            lease_owner: draft.lease_owner,
            reason: draft.reason,
            detail: draft.detail,
        };
        self.records.push_back(record.clone());
        while self.records.len() > AUDIT_RECORDS_MAX {
            self.records.pop_front();
        }
        record
    }

    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    /// Records matching `filter` that `visible` lets through, newest first, starting below
    /// `before` (a `seq`; `None`: from the newest), at most `limit`; with the `seq` to continue
    /// below, if more follow.
    pub(super) fn newest_first(
        &self,
        filter: &AuditFilter,
        before: Option<u64>,
        limit: usize,
        visible: impl Fn(&AuditRecord) -> bool,
    ) -> (Vec<AuditRecord>, Option<u64>) {
        let mut out = Vec::new();
        let candidates = self
            .records
            .iter()
            .rev()
            .filter(|r| before.is_none_or(|b| r.seq < b))
            .filter(|r| filter.matches(r) && visible(r));
        for r in candidates {
            if out.len() == limit {
                let next = out.last().map(|last: &AuditRecord| last.seq);
                return (out, next);
            }
            out.push(r.clone());
        }
        (out, None)
    }

    /// The rules in the module docs, from the data alone.
    pub(super) fn check_invariants(&self) -> Result<(), String> {
        if self.records.len() > AUDIT_RECORDS_MAX {
            return Err(format!(
                "audit trail holds {} records, over {AUDIT_RECORDS_MAX}",
                self.records.len()
            ));
        }
        let mut previous = 0;
        for r in &self.records {
            if r.seq <= previous || r.seq > self.last_seq {
                return Err(format!("audit record {}: seq out of order", r.seq));
            }
            previous = r.seq;
            reason(&r.reason).map_err(|e| format!("audit record {}: {}", r.seq, e.message))?;
        }
        Ok(())
    }
}
