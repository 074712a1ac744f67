//! Quotas: how much one namespace, and the whole state, may hold.
//!
//! Every namespace has [`Quotas`] (replicated, set by a cluster admin, defaults in `limits.rs`) on its
//! semaphores, leases, entries (holders plus waiters) and stored bytes; the state has a budget
//! on the stored bytes of all namespaces together. A command that would go past one is refused
//! with `ResourceExhausted` naming the quota, and changes nothing; lowering a quota below what
//! is in use refuses only growth, never takes anything away.
//!
//! Stored bytes follow one size model, so every node counts the same: each namespace, semaphore
//! and lease costs [`OBJECT_BYTES`] plus its name, description, process id and metadata (keys
//! and values); each holder and waiter costs [`ENTRY_BYTES`] plus its metadata. The model
//! counts what a client can make the state keep; the overheads stand for the maps and
//! indexes around each object.
//!
//! What always holds: each namespace's [`Usage`] equals what its data implies
//! (`Namespace::computed_usage` in `data.rs`), and the state's
//! stored bytes are the sum over its namespaces.

use serde::{Deserialize, Serialize};

pub(crate) use super::types::Quotas;
use super::types::{Error, Metadata};

/// What a namespace, semaphore or lease costs besides its strings.
pub(crate) const OBJECT_BYTES: u64 = 256;
/// What a holder or waiter costs besides its metadata.
pub(crate) const ENTRY_BYTES: u64 = 128;

use super::limits::DEFAULT_STATE_BUDGET_BYTES;
/// The largest value a byte quota or the budget may be set to.
pub(crate) const BYTES_MAX: u64 = 64 << 30;

impl Quotas {
    /// Refuses quotas beyond what the state can hold at all.
    pub fn validate(&self) -> Result<(), Error> {
        use super::limits::{LEASES_PER_NAMESPACE_MAX, SEMAPHORES_PER_NAMESPACE_MAX};
        let entries_max = (SEMAPHORES_PER_NAMESPACE_MAX as u64).saturating_mul(11_000);
        for (name, value, max) in [
            (
                "semaphores",
                self.semaphores,
                SEMAPHORES_PER_NAMESPACE_MAX as u64,
            ),
            ("leases", self.leases, LEASES_PER_NAMESPACE_MAX as u64),
            ("entries", self.entries, entries_max),
            ("bytes", self.bytes, BYTES_MAX),
            (
                "request_ids",
                self.request_ids,
                super::limits::REQUESTS_REMEMBERED_MAX as u64,
            ),
        ] {
            if value > max {
                return Err(Error::invalid(format!(
                    "quota {name} must be at most {max}, got {value}"
                )));
            }
        }
        Ok(())
    }
}

/// What a namespace uses of its quotas (semaphores and leases are counted by their maps).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub entries: u64,
    pub bytes: u64,
}

pub(super) fn metadata_bytes(metadata: &Metadata) -> u64 {
    metadata
        .iter()
        .map(|(k, v)| (k.len() + v.len()) as u64)
        .sum()
}

/// A namespace's, semaphore's or lease's stored bytes.
pub(super) fn object_bytes(strings: &[&str], metadata: &Metadata) -> u64 {
    let text: u64 = strings.iter().map(|s| s.len() as u64).sum();
    OBJECT_BYTES
        .saturating_add(text)
        .saturating_add(metadata_bytes(metadata))
}

/// A holder's or waiter's stored bytes.
pub(super) fn entry_bytes(metadata: &Metadata) -> u64 {
    ENTRY_BYTES.saturating_add(metadata_bytes(metadata))
}

/// `ResourceExhausted` naming the quota that `more` would pass. `quota` is formatted only then:
/// the check runs on every growing command.
pub(super) fn check(
    quota: impl std::fmt::Display,
    used: u64,
    more: u64,
    limit: u64,
) -> Result<(), Error> {
    if more > 0 && used.saturating_add(more) > limit {
        return Err(Error::exhausted(format!(
            "{quota} reached: {used} in use, {more} more asked, at most {limit}"
        )));
    }
    Ok(())
}

/// The state's budget on the stored bytes of all namespaces together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Budget {
    pub bytes: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            bytes: DEFAULT_STATE_BUDGET_BYTES,
        }
    }
}
