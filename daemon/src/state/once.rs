//! Exactly-once writes: [`Cmd::Once`] and the grants that settle a remembered queued acquire.
//!
//! A client write carries a request id chosen by the caller for one logical operation (every
//! retry of it reuses the id). The first time the id is seen, the command runs as usual; if it
//! succeeds, its reply is remembered under the id (`requests.rs`). A repeat of the id with the
//! same command gets the remembered reply and changes nothing else (no reaping either: the
//! repeat is not a command that runs). A repeat with a different command is refused.
//!
//! Decisions:
//! - Refused commands are not remembered: a refusal changed nothing, so running the command
//!   again is safe, and the retry's answer is the answer of the only attempt that took effect.
//! - A queued acquire's reply is not final. While its waiter waits, the entry is linked to the
//!   waiter; the grant that later takes it from the queue replaces the remembered reply with
//!   `Acquired` and that grant's token, so a retry sees the one grant, never a second one with
//!   a new token. A repeat of a still-queued acquire runs it again (a re-attach that keeps the
//!   place, as without an id), and so does a repeat after the wait ended without a grant.
//! - Entries are forgotten oldest first beyond [`super::limits::REQUESTS_REMEMBERED_MAX`], and
//!   once [`super::limits::REQUEST_RETENTION_NS`] of state clock passed since they were
//!   remembered, checked when a batch moves the clock: never by a timer, so an idle cluster
//!   writes nothing. A retry later than that runs again, as without an id.

use super::data::State;
use super::hash::fnv1a64;
use super::limits::{DEFAULT_REQUEST_IDS, REQUESTS_REMEMBERED_MAX};
use super::requests::scoped_key;
use super::snapshot::bincode_options;
use super::types::*;
use super::version::Gate;
use bincode::Options;

/// FNV-1a 64 of the command's canonical encoding. An acquire's wait is left out: a client's
/// retries and re-attaches of one acquire ask for what is left of its wait.
fn digest(cmd: &Cmd) -> u64 {
    // The token is left out too: it is who asks, not what is asked.
    let cmd = cmd.unwrapped();
    let bytes = match cmd {
        Cmd::Acquire { .. } | Cmd::AcquireLock { .. } | Cmd::AcquireSet { .. } => {
            let mut cmd = cmd.clone();
            if let Cmd::Acquire { wait_ns, .. }
            | Cmd::AcquireLock { wait_ns, .. }
            | Cmd::AcquireSet { wait_ns, .. } = &mut cmd
            {
                *wait_ns = 0;
            }
            bincode_options().serialize(&cmd)
        }
        // The lease id's secret is drawn by the node that took each attempt: a retry through
        // any node is the same request.
        Cmd::CreateLease { .. } => {
            let mut cmd = cmd.clone();
            if let Cmd::CreateLease { secret, .. } = &mut cmd {
                *secret = 0;
            }
            bincode_options().serialize(&cmd)
        }
        cmd => bincode_options().serialize(cmd),
    };
    fnv1a64(&bytes.unwrap_or_default())
}

fn is_pending(reply: &Outcome) -> bool {
    matches!(
        reply,
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
    )
}

impl State {
    /// A remembered grant's hold limit counts from when it was answered, and a repeat comes
    /// later: it is answered with what is left of the hold now (1 ns once that hold is gone),
    /// so a caller that counts from sending the repeat never counts past the hold's end.
    fn hold_left_now(&self, cmd: &Cmd, reply: Outcome) -> Outcome {
        if let (
            Outcome::AcquireSet(mut r),
            Cmd::AcquireSet {
                ns, lease, members, ..
            },
        ) = (reply.clone(), cmd.unwrapped())
        {
            if let AcquireSetStatus::Acquired { grants } = &mut r.status {
                for (grant, member) in grants.iter_mut().zip(members) {
                    if grant.hold_ns > 0 {
                        let left = self
                            .holder(ns, &member.sem, lease)
                            .filter(|h| h.token == grant.token)
                            .map(|h| h.hold_left_ns);
                        grant.hold_ns = left.filter(|l| *l > 0).unwrap_or(1);
                    }
                }
            }
            return Outcome::AcquireSet(r);
        }
        let Outcome::Acquire(mut r) = reply else {
            return reply;
        };
        if let AcquireStatus::Acquired { token, hold_ns } = r.status
            && hold_ns > 0
        {
            let left = match cmd.unwrapped() {
                Cmd::Acquire { ns, sem, lease, .. } => self
                    .holder(ns, sem, lease)
                    .filter(|h| h.token == token)
                    .map(|h| h.hold_left_ns),
                _ => None,
            };
            r.status = AcquireStatus::Acquired {
                token,
                hold_ns: left.filter(|l| *l > 0).unwrap_or(1),
            };
        }
        Outcome::Acquire(r)
    }

    /// Applies one command of a batch, recording in the request table what it settled.
    pub(super) fn apply_tracked(&mut self, cmd: &Cmd, events: &mut Vec<Event>) -> Reply {
        let start = events.len();
        match cmd {
            Cmd::Once { request_id, cmd } => self.apply_once(request_id, cmd, events, start),
            cmd => {
                let reply = self.apply(cmd, events);
                self.settle_requests(&events[start..]);
                reply
            }
        }
    }

    fn apply_once(&mut self, id: &str, cmd: &Cmd, events: &mut Vec<Event>, start: usize) -> Reply {
        super::validate::request_id(id)?;
        if matches!(
            cmd.unwrapped(),
            Cmd::Once { .. } | Cmd::GiveUp { .. } | Cmd::Expire | Cmd::ExtendLeases
        ) {
            return Err(Error::invalid(
                "conch-request-id applies to client writes only",
            ));
        }
        // A remembered reply goes only to a caller who may make the request now.
        self.authorize(cmd)?;
        let digest = digest(cmd);
        let key = self.request_key(id, cmd);
        // An id remembered before its token's ids were scoped (the cluster version moved on
        // since) still answers its retries, as it did then.
        let remembered = match self.data.requests.get(&key) {
            None if key != id => self.data.requests.get(id).filter(|e| e.digest == digest),
            found => found,
        };
        if let Some(entry) = remembered {
            if entry.digest != digest {
                return Err(Error::invalid(format!(
                    "conch-request-id {id} was already used for a different request"
                )));
            }
            if !is_pending(&entry.reply) {
                let reply = entry.reply.clone();
                return Ok(self.hold_left_now(cmd, reply));
            }
        }
        let result = self.apply(cmd, events);
        // Events first: the reaping before the command may end an older wait of this waiter.
        self.settle_requests(&events[start..]);
        let reply = result?;
        let waiter = match (cmd.unwrapped(), &reply) {
            (Cmd::Acquire { ns, sem, lease, .. }, reply) if is_pending(reply) => {
                Some((ns.clone(), sem.clone(), lease.clone()))
            }
            (
                Cmd::AcquireLock {
                    ns, path, lease, ..
                },
                reply,
            ) if is_pending(reply) => Some((ns.clone(), lock_object(path), lease.clone())),
            // A waiting set is linked to its first member's waiter: it is granted (and ends)
            // whole, in one entry.
            (
                Cmd::AcquireSet {
                    ns, lease, members, ..
                },
                reply,
            ) if is_pending(reply) => members
                .first()
                .map(|m| (ns.clone(), m.sem.clone(), lease.clone())),
            _ => None,
        };
        let clock_ns = self.data.clock_ns;
        // Counted against the namespace the command is about (its quota as it is now: one
        // just created or deleted has the default), or, about none, only against the cap.
        let namespace = cmd.namespace().unwrap_or("");
        let quota = match namespace {
            "" => REQUESTS_REMEMBERED_MAX as u64,
            name => self
                .data
                .namespaces
                .get(name)
                .map_or(DEFAULT_REQUEST_IDS, |ns| ns.quotas().request_ids),
        };
        self.data.requests.remember(
            &key,
            namespace,
            quota,
            clock_ns,
            digest,
            reply.clone(),
            waiter,
        );
        Ok(reply)
    }

    /// The key `id` is remembered under. Once [`Gate::ScopedRequestIds`] is open it names the
    /// token the command was sent with and the namespace it is about ([`scoped_key`]), so one
    /// token's ids never answer, block or reveal another's;
    /// before, the id alone, as release 0.1.0 keys it.
    fn request_key(&self, id: &str, cmd: &Cmd) -> String {
        if !Gate::ScopedRequestIds.open_at(self.data.cluster_version) {
            return id.to_string();
        }
        let token = match cmd {
            Cmd::As { token, .. } => match self.data.auth.token_id(token) {
                Some(seq) => seq.to_string(),
                // Access control is off and the token unknown: its hash still tells callers
                // apart.
                None => token[..8].iter().map(|b| format!("{b:02x}")).collect(),
            },
            _ => "-".to_string(),
        };
        scoped_key(&token, cmd.namespace().unwrap_or(""), id)
    }

    /// Refuses `cmd` (possibly an [`Cmd::As`]) unless its token may make it now.
    fn authorize(&self, cmd: &Cmd) -> Result<(), Error> {
        let (token, inner) = match cmd {
            Cmd::As { token, cmd } => (Some(token), &**cmd),
            cmd => (None, cmd),
        };
        match super::auth::access_of(inner) {
            Some(access) => Ok(self.data.auth.authorize(token, access)?),
            None => Ok(()),
        }
    }

    /// Records grants and ended waits of remembered queued acquires.
    fn settle_requests(&mut self, events: &[Event]) {
        if !self.data.requests.has_waiting() {
            return;
        }
        for event in events {
            match event {
                Event::Granted {
                    ns,
                    sem,
                    lease,
                    token,
                    hold_ns,
                    ..
                } => {
                    let waiter = (ns.clone(), sem.clone(), lease.clone());
                    if let Some(members) = self.data.requests.waiting_set(&waiter) {
                        let namespace = self.data.namespaces.get(ns);
                        let grants = namespace.and_then(|n| {
                            let seq = n.lease_seq(lease)?;
                            n.set_grants(&members, seq, self.data.clock_ns)
                        });
                        match grants {
                            Some(grants) => {
                                let reply = Outcome::AcquireSet(AcquireSetReply {
                                    status: AcquireSetStatus::Acquired { grants },
                                    members,
                                });
                                self.data.requests.settle_granted(&waiter, &reply);
                            }
                            None => self.data.requests.settle_ended(&waiter),
                        }
                        continue;
                    }
                    if let Some(path) = lock_path(sem) {
                        let Some(namespace) = self.data.namespaces.get(ns) else {
                            self.data.requests.settle_ended(&waiter);
                            continue;
                        };
                        let reply = Outcome::AcquireLock(AcquireLockReply {
                            status: AcquireStatus::Acquired {
                                token: *token,
                                hold_ns: 0,
                            },
                            lock: namespace.lock_view(path),
                            reason: Contention::None,
                            blocking: Vec::new(),
                        });
                        self.data.requests.settle_granted(&waiter, &reply);
                        continue;
                    }
                    let view = self
                        .data
                        .namespaces
                        .get(ns)
                        .and_then(|n| n.semaphores().get(sem))
                        .map(|s| s.view(sem));
                    match view {
                        Some(semaphore) => {
                            let reply = Outcome::Acquire(AcquireReply {
                                status: AcquireStatus::Acquired {
                                    token: *token,
                                    hold_ns: *hold_ns,
                                },
                                semaphore,
                            });
                            self.data.requests.settle_granted(&waiter, &reply);
                        }
                        None => self.data.requests.settle_ended(&waiter),
                    }
                }
                Event::WaitEnded { ns, sem, lease, .. } => {
                    let waiter = (ns.clone(), sem.clone(), lease.clone());
                    self.data.requests.settle_ended(&waiter);
                }
                Event::Synced { .. } | Event::Lost { .. } => {}
            }
        }
    }
}
