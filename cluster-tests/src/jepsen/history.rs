//! The history of a run: every operation a client (or the checker itself) sent, as
//! invoke → ok / fail / unknown, with timestamps on the test process's monotonic clock
//! (microseconds since the run began): tokio's clock, which is the machine's, or the simulated
//! one when the workload runs under the simulator.
//!
//! - `ok`: the server answered; the value says what it answered.
//! - `fail`: the operation certainly had no effect (the server refused it with a definite error
//!   such as `NotFound`, or the connection was refused so nothing was sent).
//! - `unknown`: it may or may not have taken effect (timed out, connection lost, `Unavailable`
//!   after forwarding, an internal error). An operation still pending when the run ends is
//!   unknown too.
//!
//! An operation is recorded at invoke time and completed later, so an operation whose task was
//! cancelled still appears (as unknown).

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Microseconds since the run began (monotonic).
pub type Micros = u64;

/// Who sent an operation: a workload client, or the checker's own final reads and cleanup.
pub const CHECKER_PROCESS: usize = 10_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    CreateLease {
        ttl_s: u64,
    },
    Refresh {
        lease: String,
    },
    Revoke {
        lease: String,
    },
    Acquire {
        lease: String,
        sem: String,
        weight: u64,
        timeout_ms: u64,
    },
    Release {
        lease: String,
        sem: String,
    },
    /// All or none (`conch.v1 AcquireSemaphores`): every `(semaphore, weight)` member.
    AcquireSet {
        lease: String,
        members: Vec<(String, u64)>,
        timeout_ms: u64,
    },
    /// Linearizable `ListSemaphoreHolders`.
    ReadHolders {
        sem: String,
    },
    /// Linearizable `ListSemaphoreLeases` (all pages).
    ReadLeases,
    /// `CreateLockLease` (the lock workload; see [`super::locks`]).
    LockCreateLease {
        ttl_s: u64,
    },
    LockRefresh {
        lease: String,
    },
    LockRevoke {
        lease: String,
    },
    AcquireLock {
        lease: String,
        path: String,
        exclusive: bool,
        timeout_ms: u64,
    },
    ReleaseLock {
        lease: String,
        path: String,
    },
    /// Linearizable `ListLocks` (all pages).
    ReadLocks,
    /// Linearizable `ListLockLeases` (all pages).
    ReadLockLeases,
}

impl OpKind {
    /// The lease this operation acts on, if it names one.
    pub fn lease(&self) -> Option<&str> {
        match self {
            OpKind::Refresh { lease }
            | OpKind::Revoke { lease }
            | OpKind::Acquire { lease, .. }
            | OpKind::AcquireSet { lease, .. }
            | OpKind::Release { lease, .. } => Some(lease),
            _ => None,
        }
    }

    /// Whether this is an operation of the lock workload.
    pub fn is_lock(&self) -> bool {
        matches!(
            self,
            OpKind::LockCreateLease { .. }
                | OpKind::LockRefresh { .. }
                | OpKind::LockRevoke { .. }
                | OpKind::AcquireLock { .. }
                | OpKind::ReleaseLock { .. }
                | OpKind::ReadLocks
                | OpKind::ReadLockLeases
        )
    }

    pub fn sem(&self) -> Option<&str> {
        match self {
            OpKind::Acquire { sem, .. }
            | OpKind::Release { sem, .. }
            | OpKind::ReadHolders { sem } => Some(sem),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderSeen {
    pub lease: String,
    pub weight: u64,
    pub token: u64,
}

/// One holder of a lock as a read shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockHolderSeen {
    pub lease: String,
    pub exclusive: bool,
    pub token: u64,
}

/// One held lock as a read shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockSeen {
    pub path: String,
    /// `LOCK_STATE_…` name.
    pub state: String,
    pub holders: Vec<LockHolderSeen>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OkValue {
    Lease {
        lease: String,
    },
    Done,
    Acquired {
        token: u64,
        active_holds: u64,
        permits: u64,
    },
    /// `UNAVAILABLE` or `TIMED_OUT`: not an error, nothing held.
    NotAcquired {
        outcome: String,
        active_holds: u64,
        permits: u64,
    },
    Released {
        active_holds: u64,
        permits: u64,
    },
    /// An all-or-none acquire's grant: one token per member, in the order of the request.
    SetAcquired {
        tokens: Vec<u64>,
    },
    Holders {
        holders: Vec<HolderSeen>,
    },
    Leases {
        leases: Vec<String>,
    },
    LockAcquired {
        token: u64,
    },
    /// `UNAVAILABLE` or `TIMED_OUT`, with the contention reason.
    LockNotAcquired {
        outcome: String,
        reason: String,
    },
    Locks {
        locks: Vec<LockSeen>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pending,
    Ok(OkValue),
    Fail { code: String, message: String },
    Unknown { reason: String },
}

impl Outcome {
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok(_))
    }

    /// Pending counts as unknown: it may have happened.
    pub fn is_unknown(&self) -> bool {
        matches!(self, Outcome::Unknown { .. } | Outcome::Pending)
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Outcome::Fail { code, .. } if code == "NotFound")
    }
}

#[derive(Clone, Debug)]
pub struct Op {
    pub id: usize,
    pub process: usize,
    /// The node the request was sent to.
    pub node: u64,
    pub kind: OpKind,
    pub invoke: Micros,
    pub complete: Option<Micros>,
    pub outcome: Outcome,
}

impl Op {
    /// When the outcome was known; `Micros::MAX` while pending.
    pub fn end(&self) -> Micros {
        self.complete.unwrap_or(Micros::MAX)
    }

    pub fn token(&self) -> Option<u64> {
        match &self.outcome {
            Outcome::Ok(OkValue::Acquired { token, .. }) => Some(*token),
            _ => None,
        }
    }

    /// The token this acquire (single or all-or-none) was granted for semaphore `sem`, if any.
    pub fn token_of(&self, sem: &str) -> Option<u64> {
        match (&self.kind, &self.outcome) {
            (OpKind::Acquire { sem: s, .. }, Outcome::Ok(OkValue::Acquired { token, .. }))
                if s == sem =>
            {
                Some(*token)
            }
            (OpKind::AcquireSet { members, .. }, Outcome::Ok(OkValue::SetAcquired { tokens })) => {
                members
                    .iter()
                    .zip(tokens)
                    .find(|((s, _), _)| s == sem)
                    .map(|(_, t)| *t)
            }
            _ => None,
        }
    }

    /// The weight this acquire asks of `sem` (single or all-or-none), if it names it.
    pub fn weight_of(&self, sem: &str) -> Option<u64> {
        match &self.kind {
            OpKind::Acquire { sem: s, weight, .. } if s == sem => Some((*weight).max(1)),
            OpKind::AcquireSet { members, .. } => members
                .iter()
                .find(|(s, _)| s == sem)
                .map(|(_, w)| (*w).max(1)),
            _ => None,
        }
    }

    pub fn acquired(&self) -> bool {
        self.token().is_some()
    }
}

pub fn fmt_micros(t: Micros) -> String {
    if t == Micros::MAX {
        return "…".into();
    }
    format!("{}.{:03}s", t / 1_000_000, (t / 1000) % 1000)
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = if self.process == CHECKER_PROCESS {
            "checker".to_string()
        } else {
            format!("c{}", self.process)
        };
        write!(
            f,
            "#{} {who} n{} [{} .. {}] ",
            self.id,
            self.node,
            fmt_micros(self.invoke),
            fmt_micros(self.end())
        )?;
        match &self.kind {
            OpKind::CreateLease { ttl_s } => write!(f, "create-lease ttl={ttl_s}s")?,
            OpKind::Refresh { lease } => write!(f, "refresh {lease}")?,
            OpKind::Revoke { lease } => write!(f, "revoke {lease}")?,
            OpKind::Acquire {
                lease,
                sem,
                weight,
                timeout_ms,
            } => write!(f, "acquire {sem} w={weight} wait={timeout_ms}ms {lease}")?,
            OpKind::Release { lease, sem } => write!(f, "release {sem} {lease}")?,
            OpKind::AcquireSet {
                lease,
                members,
                timeout_ms,
            } => {
                let members: Vec<String> =
                    members.iter().map(|(s, w)| format!("{s}:{w}")).collect();
                write!(
                    f,
                    "acquire-set {} wait={timeout_ms}ms {lease}",
                    members.join("+")
                )?
            }
            OpKind::ReadHolders { sem } => write!(f, "read-holders {sem}")?,
            OpKind::ReadLeases => write!(f, "read-leases")?,
            OpKind::LockCreateLease { ttl_s } => write!(f, "create-lock-lease ttl={ttl_s}s")?,
            OpKind::LockRefresh { lease } => write!(f, "refresh-lock-lease {lease}")?,
            OpKind::LockRevoke { lease } => write!(f, "revoke-lock-lease {lease}")?,
            OpKind::AcquireLock {
                lease,
                path,
                exclusive,
                timeout_ms,
            } => write!(
                f,
                "acquire-lock {path} {} wait={timeout_ms}ms {lease}",
                if *exclusive { "exclusive" } else { "shared" }
            )?,
            OpKind::ReleaseLock { lease, path } => write!(f, "release-lock {path} {lease}")?,
            OpKind::ReadLocks => write!(f, "read-locks")?,
            OpKind::ReadLockLeases => write!(f, "read-lock-leases")?,
        }
        write!(f, " -> ")?;
        match &self.outcome {
            Outcome::Pending => write!(f, "pending (unknown)"),
            Outcome::Unknown { reason } => write!(f, "unknown ({reason})"),
            Outcome::Fail { code, message } => write!(f, "fail {code} ({message})"),
            Outcome::Ok(value) => match value {
                OkValue::Lease { lease } => write!(f, "ok {lease}"),
                OkValue::Done => write!(f, "ok"),
                OkValue::Acquired {
                    token,
                    active_holds,
                    permits,
                } => write!(
                    f,
                    "ok ACQUIRED token={token} holds={active_holds}/{permits}"
                ),
                OkValue::NotAcquired {
                    outcome,
                    active_holds,
                    permits,
                } => write!(f, "ok {outcome} holds={active_holds}/{permits}"),
                OkValue::Released {
                    active_holds,
                    permits,
                } => write!(f, "ok holds={active_holds}/{permits}"),
                OkValue::Holders { holders } => {
                    write!(f, "ok [")?;
                    for (i, h) in holders.iter().enumerate() {
                        if i > 0 {
                            write!(f, ", ")?;
                        }
                        write!(f, "{} w={} token={}", h.lease, h.weight, h.token)?;
                    }
                    write!(f, "]")
                }
                OkValue::Leases { leases } => write!(f, "ok {} leases", leases.len()),
                OkValue::SetAcquired { tokens } => write!(f, "ok ACQUIRED tokens={tokens:?}"),
                OkValue::LockAcquired { token } => write!(f, "ok ACQUIRED token={token}"),
                OkValue::LockNotAcquired { outcome, reason } => {
                    write!(f, "ok {outcome} ({reason})")
                }
                OkValue::Locks { locks } => {
                    write!(f, "ok [")?;
                    for (i, lock) in locks.iter().enumerate() {
                        if i > 0 {
                            write!(f, "; ")?;
                        }
                        write!(f, "{}:", lock.path)?;
                        for h in &lock.holders {
                            let mode = if h.exclusive { "x" } else { "s" };
                            write!(f, " {}/{mode}/token={}", h.lease, h.token)?;
                        }
                    }
                    write!(f, "]")
                }
            },
        }
    }
}

/// The shared, append-only history of one run.
pub struct History {
    start: Instant,
    ops: Mutex<Vec<Op>>,
}

impl History {
    pub fn new(start: Instant) -> History {
        History {
            start,
            ops: Mutex::new(Vec::new()),
        }
    }

    pub fn start(&self) -> Instant {
        self.start
    }

    pub fn now(&self) -> Micros {
        self.micros(Instant::now())
    }

    pub fn micros(&self, at: Instant) -> Micros {
        at.saturating_duration_since(self.start).as_micros() as Micros
    }

    pub fn instant(&self, t: Micros) -> Instant {
        self.start + Duration::from_micros(t)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Op>> {
        self.ops.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the invocation; returns the op id and its invoke time.
    pub fn invoke(&self, process: usize, node: u64, kind: OpKind) -> (usize, Micros) {
        let mut ops = self.lock();
        let id = ops.len();
        let invoke = self.now();
        ops.push(Op {
            id,
            process,
            node,
            kind,
            invoke,
            complete: None,
            outcome: Outcome::Pending,
        });
        (id, invoke)
    }

    /// Records the outcome; returns the completion time.
    pub fn complete(&self, id: usize, outcome: Outcome) -> Micros {
        let mut ops = self.lock();
        let now = self.now();
        if let Some(op) = ops.get_mut(id) {
            op.complete = Some(now);
            op.outcome = outcome;
        }
        now
    }

    pub fn snapshot(&self) -> Vec<Op> {
        self.lock().clone()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Turns a gRPC error into `fail` (certainly no effect) or `unknown`.
pub fn classify(status: &tonic::Status) -> Outcome {
    use tonic::Code;
    let definite = matches!(
        status.code(),
        Code::NotFound
            | Code::InvalidArgument
            | Code::AlreadyExists
            | Code::ResourceExhausted
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
    );
    // A status made here from the HTTP/2 connection's end is no answer to this call, whatever
    // its code: the server may have applied the call before it tore the connection down (e.g.
    // GOAWAY ENHANCE_YOUR_CALM, which tonic reports as ResourceExhausted). Unknown, then; the
    // checker still reports a ResourceExhausted one as unexpected.
    let connection_ended = std::error::Error::source(status).is_some()
        && status.message().starts_with("h2 protocol error");
    if definite && !connection_ended {
        return Outcome::Fail {
            code: format!("{:?}", status.code()),
            message: status.message().to_string(),
        };
    }
    let detail = error_chain(status);
    // Only this process's own transport error says the request never left: a status the server
    // sent (no source) may quote the server's failure to reach the leader after it queued the
    // request, which is an unknown outcome.
    let local_transport_error = std::error::Error::source(status).is_some();
    if status.code() == Code::Unavailable && local_transport_error && not_sent(&detail) {
        // The TCP connection was refused: the request never left this process.
        return Outcome::Fail {
            code: "NotSent".into(),
            message: detail,
        };
    }
    Outcome::Unknown {
        reason: format!("{:?}: {}", status.code(), detail),
    }
}

/// Whether an unknown outcome's reason says the HTTP/2 connection was closed without an error
/// (GOAWAY with NO_ERROR: the node was stopping), as this process's HTTP/2 stack words it.
pub fn closed_gracefully(reason: &str) -> bool {
    reason.contains("h2 protocol error")
        && (reason.contains("NO_ERROR") || reason.contains("not a result of an error"))
}

fn not_sent(detail: &str) -> bool {
    let d = detail.to_ascii_lowercase();
    d.contains("connection refused") || d.contains("tcp connect error")
}

fn error_chain(status: &tonic::Status) -> String {
    let mut text = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_connection_closed_without_error_counts_as_closed_gracefully() {
        assert!(closed_gracefully(
            "Internal: h2 protocol error: http2 error: connection error received: not a result of an error"
        ));
        assert!(closed_gracefully(
            "Internal: h2 protocol error: http2 error: GoAway(b\"\", NO_ERROR, Remote)"
        ));
        assert!(!closed_gracefully(
            "ResourceExhausted: h2 protocol error: http2 error: GoAway(b\"\", ENHANCE_YOUR_CALM, Remote)"
        ));
        assert!(!closed_gracefully("Internal: the state machine failed"));
    }
}
