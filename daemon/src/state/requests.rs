//! The table of remembered request ids: what a repeated client write is answered with.
//!
//! Canonical data (in snapshots and the state hash): a counter and, per request id, the order
//! it was remembered in (`seq`), the clock then (`at_ns`), a digest of the command, the reply,
//! and, while that reply is a queued acquire whose waiter still waits, the waiter it waits as.
//! Derived and rebuilt on decode: `order` (seq -> id, oldest first) and `waiting` (waiter ->
//! the ids waiting as it).
//!
//! What always holds here: at most [`REQUESTS_REMEMBERED_MAX`] entries; none older than
//! [`REQUEST_RETENTION_NS`] at the clock after a batch's clock moved; `seq` unique and at most
//! the counter; `at_ns` at most the clock and never decreasing in `seq` order; a waiter link
//! only on a queued acquire reply; both indexes equal what the entries imply. Every change goes
//! through the methods below, which keep both indexes; which reply to remember is the caller's
//! business (`once.rs`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::limits::{REQUEST_RETENTION_NS, REQUESTS_REMEMBERED_MAX};
use super::types::*;

/// The key of a request id scoped to the token (`token`: its id, or another name of it) and
/// the namespace (`""` for none) that sent it: `t<token>/<namespace>/<id>`. No part holds a
/// `/` (request ids and namespace names cannot, token names are built without one), so two
/// scopes never share a key, and a scoped key is never a plain id (ids hold no `/` either).
pub(super) fn scoped_key(token: &str, namespace: &str, id: &str) -> String {
    format!("t{token}/{namespace}/{id}")
}

/// The group whose quota `key` counts against: its token and namespace for a [`scoped_key`]
/// (`t<token>/<namespace>`), its namespace for a plain id (0.1.0's keys, and cluster version
/// 1's). The two never meet: a namespace name holds no `/`. So from cluster version 2 on, when
/// ids are scoped, a namespace's `request_ids` quota bounds each token's ids in it, and one
/// token's writes never push another's ids out.
fn quota_group(key: &str, namespace: &str) -> String {
    match key.strip_prefix('t').and_then(|_| key.rsplit_once('/')) {
        Some((scope, _)) if key.matches('/').count() == 2 => scope.to_string(),
        _ => namespace.to_string(),
    }
}

/// Whether `key` is a plain request id (as 0.1.0 keys them) or a [`scoped_key`] of one.
fn valid_key(key: &str) -> bool {
    let id = match key
        .strip_prefix('t')
        .map(|rest| rest.splitn(3, '/').collect::<Vec<_>>())
    {
        Some(parts) if parts.len() == 3 => parts[2],
        _ => key,
    };
    super::validate::request_id(id).is_ok()
}

/// A waiter named the way events name it: (namespace, semaphore, lease id).
pub(super) type WaiterRef = (String, String, String);

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Requests {
    /// The last `seq` handed out (0: none yet).
    last_seq: u64,
    entries: BTreeMap<String, Remembered>,
    /// Derived: seq -> request id, oldest first.
    #[serde(skip)]
    order: BTreeMap<u64, String>,
    /// Derived: waiter -> the request ids whose queued acquire waits as it.
    #[serde(skip)]
    waiting: BTreeMap<WaiterRef, BTreeSet<String>>,
    /// Derived: namespace ("" for commands about none) -> the `seq`s of its entries.
    #[serde(skip)]
    by_namespace: BTreeMap<String, BTreeSet<u64>>,
    /// Derived: quota group ([`quota_group`]) -> the `seq`s of its entries.
    #[serde(skip)]
    by_group: BTreeMap<String, BTreeSet<u64>>,
}

/// Reached only through `&` outside this module.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Remembered {
    pub(super) seq: u64,
    pub(super) at_ns: Nanos,
    /// FNV-1a 64 of the command's canonical encoding: a repeat must be the same command.
    pub(super) digest: u64,
    /// The namespace the command was about ("" for none): its quota bounds its entries.
    pub(super) namespace: String,
    pub(super) reply: Outcome,
    /// While `reply` is a queued acquire still waiting: the waiter it waits as.
    pub(super) waiter: Option<WaiterRef>,
}

impl Requests {
    pub(super) fn get(&self, id: &str) -> Option<&Remembered> {
        self.entries.get(id)
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when some remembered acquire still waits (so grants may need recording).
    pub(super) fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Entries remembered for commands about `namespace`.
    pub(super) fn count(&self, namespace: &str) -> u64 {
        self.by_namespace
            .get(namespace)
            .map_or(0, |s| s.len() as u64)
    }

    /// Remembers `reply` under `id` (replacing what was there) as the newest entry of
    /// `namespace`, forgetting the oldest entries of its quota group ([`quota_group`]: the
    /// token's in that namespace, or the namespace's for a plain id) beyond `quota`, then the
    /// oldest of all beyond the cap.
    #[allow(clippy::too_many_arguments)] // one entry's fields, and where it counts
    pub(super) fn remember(
        &mut self,
        id: &str,
        namespace: &str,
        quota: u64,
        at_ns: Nanos,
        digest: u64,
        reply: Outcome,
        waiter: Option<WaiterRef>,
    ) {
        self.forget(id);
        self.last_seq = self.last_seq.saturating_add(1);
        let seq = self.last_seq;
        self.by_namespace
            .entry(namespace.to_string())
            .or_default()
            .insert(seq);
        let group = quota_group(id, namespace);
        self.by_group.entry(group.clone()).or_default().insert(seq);
        if let Some(waiter) = &waiter {
            self.waiting
                .entry(waiter.clone())
                .or_default()
                .insert(id.to_string());
        }
        self.order.insert(seq, id.to_string());
        self.entries.insert(
            id.to_string(),
            Remembered {
                seq,
                at_ns,
                digest,
                namespace: namespace.to_string(),
                reply,
                waiter,
            },
        );
        while self.by_group.get(&group).map_or(0, |s| s.len() as u64) > quota {
            let oldest = self
                .by_group
                .get(&group)
                .and_then(|seqs| seqs.first())
                .and_then(|seq| self.order.get(seq))
                .cloned();
            let Some(oldest) = oldest else {
                break;
            };
            self.forget(&oldest);
        }
        while self.entries.len() > REQUESTS_REMEMBERED_MAX {
            let Some((_, oldest)) = self.order.first_key_value() else {
                break;
            };
            let oldest = oldest.clone();
            self.forget(&oldest);
        }
    }

    /// Forgets `id`, if remembered.
    pub(super) fn forget(&mut self, id: &str) {
        let Some(entry) = self.entries.remove(id) else {
            return;
        };
        self.order.remove(&entry.seq);
        if let Some(seqs) = self.by_namespace.get_mut(&entry.namespace) {
            seqs.remove(&entry.seq);
            if seqs.is_empty() {
                self.by_namespace.remove(&entry.namespace);
            }
        }
        let group = quota_group(id, &entry.namespace);
        if let Some(seqs) = self.by_group.get_mut(&group) {
            seqs.remove(&entry.seq);
            if seqs.is_empty() {
                self.by_group.remove(&group);
            }
        }
        if let Some(waiter) = &entry.waiter {
            self.unlink(waiter, id);
        }
    }

    fn unlink(&mut self, waiter: &WaiterRef, id: &str) {
        if let Some(ids) = self.waiting.get_mut(waiter) {
            ids.remove(id);
            if ids.is_empty() {
                self.waiting.remove(waiter);
            }
        }
    }

    /// Forgets every entry remembered at or before `clock_ns - REQUEST_RETENTION_NS`.
    pub(super) fn expire(&mut self, clock_ns: Nanos) {
        let horizon = clock_ns.saturating_sub(REQUEST_RETENTION_NS);
        while let Some((_, oldest)) = self.order.first_key_value() {
            let oldest = oldest.clone();
            match self.entries.get(&oldest) {
                Some(entry) if entry.at_ns > horizon => return,
                _ => self.forget(&oldest),
            }
        }
    }

    /// The waiter `waiter` was granted: every remembered acquire waiting as it now answers
    /// `reply` (the grant), and waits no more.
    pub(super) fn settle_granted(&mut self, waiter: &WaiterRef, reply: &Outcome) {
        let Some(ids) = self.waiting.remove(waiter) else {
            return;
        };
        for id in ids {
            if let Some(entry) = self.entries.get_mut(&id) {
                entry.reply = reply.clone();
                entry.waiter = None;
            }
        }
    }

    /// The members of the set acquire remembered as waiting as `waiter`, if it is one.
    pub(super) fn waiting_set(&self, waiter: &WaiterRef) -> Option<Vec<String>> {
        let ids = self.waiting.get(waiter)?;
        ids.iter()
            .find_map(|id| match &self.entries.get(id)?.reply {
                Outcome::AcquireSet(reply) => Some(reply.members.clone()),
                _ => None,
            })
    }

    /// The waiter `waiter` left its queue without a grant: the remembered acquires waiting as
    /// it keep their queued reply, which is not final (a repeat runs the acquire again).
    pub(super) fn settle_ended(&mut self, waiter: &WaiterRef) {
        let Some(ids) = self.waiting.remove(waiter) else {
            return;
        };
        for id in ids {
            if let Some(entry) = self.entries.get_mut(&id) {
                entry.waiter = None;
            }
        }
    }

    /// Rebuilds both indexes from the entries (on decode).
    pub(super) fn rebuild(&mut self) -> Result<(), String> {
        self.order.clear();
        self.waiting.clear();
        self.by_namespace.clear();
        self.by_group.clear();
        for (id, entry) in &self.entries {
            if self.order.insert(entry.seq, id.clone()).is_some() {
                return Err(format!("request sequence {} is used twice", entry.seq));
            }
            self.by_namespace
                .entry(entry.namespace.clone())
                .or_default()
                .insert(entry.seq);
            self.by_group
                .entry(quota_group(id, &entry.namespace))
                .or_default()
                .insert(entry.seq);
            if let Some(waiter) = &entry.waiter {
                self.waiting
                    .entry(waiter.clone())
                    .or_default()
                    .insert(id.clone());
            }
        }
        Ok(())
    }

    /// Checks the table's rules against the clock; `waits(waiter)` says whether that waiter is
    /// queued in the state.
    pub(super) fn check(
        &self,
        clock_ns: Nanos,
        waits: impl Fn(&WaiterRef) -> bool,
    ) -> Result<(), String> {
        if self.entries.len() > REQUESTS_REMEMBERED_MAX {
            return Err("more request ids remembered than the cap".into());
        }
        let mut order = BTreeMap::new();
        let mut waiting: BTreeMap<WaiterRef, BTreeSet<String>> = BTreeMap::new();
        let mut by_namespace: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
        let mut by_group: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
        let horizon = clock_ns.saturating_sub(REQUEST_RETENTION_NS);
        for (id, entry) in &self.entries {
            let at = |what: &str| format!("request id {id}: {what}");
            if !valid_key(id) {
                return Err(at("not a valid request id"));
            }
            if entry.seq == 0 || entry.seq > self.last_seq || order.insert(entry.seq, id).is_some()
            {
                return Err(at("sequence reused or not from the counter"));
            }
            by_namespace
                .entry(entry.namespace.clone())
                .or_default()
                .insert(entry.seq);
            by_group
                .entry(quota_group(id, &entry.namespace))
                .or_default()
                .insert(entry.seq);
            if entry.at_ns > clock_ns || entry.at_ns <= horizon {
                return Err(at("remembered in the future or past its retention"));
            }
            if let Some(waiter) = &entry.waiter {
                let queued = matches!(
                    entry.reply,
                    Outcome::Acquire(AcquireReply {
                        status: AcquireStatus::Queued { .. },
                        ..
                    }) | Outcome::AcquireLock(AcquireLockReply {
                        status: AcquireStatus::Queued { .. },
                        ..
                    }) | Outcome::AcquireSet(AcquireSetReply {
                        status: AcquireSetStatus::Queued { .. },
                        ..
                    })
                );
                if !queued || !waits(waiter) {
                    return Err(at("linked to a waiter that does not wait"));
                }
                waiting
                    .entry(waiter.clone())
                    .or_default()
                    .insert(id.clone());
            }
        }
        let mut last_at = Nanos::MIN;
        for id in order.values() {
            let at_ns = self.entries.get(*id).map_or(Nanos::MIN, |e| e.at_ns);
            if at_ns < last_at {
                return Err(format!("request id {id}: remembered out of time order"));
            }
            last_at = at_ns;
        }
        let order: BTreeMap<u64, String> = order
            .into_iter()
            .map(|(seq, id)| (seq, id.clone()))
            .collect();
        if order != self.order
            || waiting != self.waiting
            || by_namespace != self.by_namespace
            || by_group != self.by_group
        {
            return Err("request id indexes do not match the entries".into());
        }
        Ok(())
    }
}
