//! The audit trail's vocabulary (see `audit.rs`): records, who made them, what they name, and
//! the bounds. Plain data, a leaf: the commands' replies (`types.rs`) carry a record.

use serde::{Deserialize, Serialize};

/// The trail keeps the newest this many records.
pub(crate) const AUDIT_RECORDS_MAX: usize = 10_000;
/// A reason is at most this many bytes (UTF-8).
pub(crate) const AUDIT_REASON_MAX_BYTES: usize = 256;
/// The actor of a call made without a known token.
pub(crate) const ANONYMOUS: &str = "anonymous";

/// What was done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuditAction {
    RevokeHolder,
    RevokeLease,
    DeleteSemaphore,
    DeleteLock,
    UpdateSemaphore,
    SetQuotas,
    SetBudget,
}

impl AuditAction {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditAction::RevokeHolder => "revoke-holder",
            AuditAction::RevokeLease => "revoke-lease",
            AuditAction::DeleteSemaphore => "delete-semaphore",
            AuditAction::DeleteLock => "delete-lock",
            AuditAction::UpdateSemaphore => "update-semaphore",
            AuditAction::SetQuotas => "set-quotas",
            AuditAction::SetBudget => "set-budget",
        }
    }
}

/// What kind of thing a record's `object` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuditObject {
    Semaphore,
    Lock,
    /// The namespace itself (`object` empty).
    Namespace,
    /// The whole state (`namespace` and `object` empty).
    State,
}

impl AuditObject {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditObject::Semaphore => "semaphore",
            AuditObject::Lock => "lock",
            AuditObject::Namespace => "namespace",
            AuditObject::State => "state",
        }
    }
}

/// Who made a call, as the trail keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    /// The token's name, or [`ANONYMOUS`].
    pub name: String,
    /// The token's role (empty for anonymous).
    pub role: String,
    /// The token's id (`tk_<n>`), if known.
    pub token: Option<u64>,
}

/// One record of the trail.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// 1, 2, ... in the order records were made (never reused).
    pub seq: u64,
    /// The entry's wall-clock stamp (ns since the Unix epoch).
    pub at: i64,
    /// The entry's lease clock.
    pub clock_ns: i64,
    pub actor: Actor,
    pub action: AuditAction,
    pub namespace: String,
    pub object_kind: AuditObject,
    /// A semaphore's name or a lock's path (empty for namespace and state records).
    pub object: String,
    /// The lease whose hold was removed (empty when none was).
    pub lease: String,
    /// That lease's process id.
    pub holder: String,
    /// The token that created that lease: it may read this record.
    pub lease_owner: Option<u64>,
    /// Why, as the caller said (revoke-holder only; empty otherwise).
    pub reason: String,
    /// What changed, for capacity and quota records (`permits 3 -> 1`).
    pub detail: String,
}

/// Which records a read wants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Empty: every namespace.
    pub namespace: String,
    /// Empty: every lease.
    pub lease: String,
}

impl AuditFilter {
    pub(super) fn matches(&self, r: &AuditRecord) -> bool {
        (self.namespace.is_empty() || r.namespace == self.namespace)
            && (self.lease.is_empty() || r.lease == self.lease)
    }
}
