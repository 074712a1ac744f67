//! The two kinds of lease, which the server keeps apart: a lease of one kind holds only what
//! its kind holds (a lock lease locks, a semaphore lease takes permits).

/// Which kind of lease: the server keeps semaphore leases and lock leases apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseKind {
    /// Holds semaphore permits (`CreateSemaphoreLease`, ...).
    Semaphore,
    /// Holds locks (`CreateLockLease`, ...).
    Lock,
}

impl LeaseKind {
    /// `"semaphore lease"` or `"lock lease"`, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            LeaseKind::Semaphore => "semaphore lease",
            LeaseKind::Lock => "lock lease",
        }
    }
}
