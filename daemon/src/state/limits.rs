//! The limits every request is checked against (Grackle's where it has one). Those a client
//! checks too are the wire contract's (`conch_proto::wire`), the one constant-only thing the
//! state takes from outside std, serde and bincode.

pub(crate) const NAME_MAX_CHARS: usize = conch_proto::wire::NAME_MAX_CHARS;
pub(crate) const DESCRIPTION_MAX_BYTES: usize = 1024;
pub(crate) const METADATA_MAX_ENTRIES: usize = 32;
pub(crate) const METADATA_KEY_MAX_BYTES: usize = 128;
pub(crate) const METADATA_VALUE_MAX_BYTES: usize = conch_proto::wire::METADATA_VALUE_MAX_BYTES;
pub(crate) const PROCESS_ID_MAX_BYTES: usize = conch_proto::wire::PROCESS_ID_MAX_BYTES;
pub(crate) const LEASE_ID_MAX_BYTES: usize = 128;
pub(crate) const TTL_MIN_S: u64 = 1;
pub(crate) const TTL_MAX_S: u64 = 300;
pub(crate) const TIMEOUT_MAX_S: i64 = 300;
/// A hold limit (`max_hold_ms`): 0 for none, else 1 s to 30 days.
pub(crate) const MAX_HOLD_MIN_MS: u64 = 1_000;
pub(crate) const MAX_HOLD_MAX_MS: u64 = 30 * 24 * 3_600 * 1_000;
pub(crate) const PAGE_LIMIT_DEFAULT: usize = 100;
pub(crate) const PAGE_LIMIT_MAX: i32 = 250;
pub(crate) const PERMITS_MAX: u64 = conch_proto::wire::PERMITS_MAX;
pub(crate) const HOLDERS_PER_SEMAPHORE_MAX: usize = 1000;
/// A lock name: 1-256 characters of `[-_.0-9a-zA-Z/]`.
pub(crate) const LOCK_NAME_MAX_CHARS: usize = 256;
pub(crate) const HOLDERS_PER_LOCK_MAX: usize = 1000;
pub(crate) const WAITERS_PER_LOCK_MAX: usize = 10_000;
/// Most conflicting locks an acquire's answer lists.
pub(crate) const BLOCKING_LOCKS_MAX: usize = 50;
pub(crate) const WAITERS_PER_SEMAPHORE_MAX: usize = 10_000;
/// The members of one all-or-none acquire (`AcquireSet`): 2 to 16 distinct semaphores.
pub(crate) const SET_MEMBERS_MIN: usize = 2;
pub(crate) const SET_MEMBERS_MAX: usize = 16;
pub(crate) const SEMAPHORES_PER_NAMESPACE_MAX: usize = 1_000_000;
pub(crate) const LEASES_PER_NAMESPACE_MAX: usize = 1_000_000;
pub(crate) const NAMESPACES_MAX: usize = 100_000;
/// A request id (`conch-request-id`): 1 to 64 ASCII letters, digits, `-` or `_`.
pub(crate) const REQUEST_ID_MAX_BYTES: usize = conch_proto::wire::REQUEST_ID_MAX_BYTES;
/// Most request ids the state remembers; the oldest is forgotten first.
pub(crate) const REQUESTS_REMEMBERED_MAX: usize = 100_000;
/// How long (state clock) a request id is remembered after its command ran.
pub(crate) const REQUEST_RETENTION_NS: i64 = 120 * 1_000_000_000;

/// Quotas of a new namespace (see `quota.rs`): enough for thousands of jobs, small enough that one namespace
/// stays well inside a small node's memory.
pub(crate) const DEFAULT_SEMAPHORES: u64 = 10_000;
pub(crate) const DEFAULT_LEASES: u64 = 10_000;
pub(crate) const DEFAULT_ENTRIES: u64 = 100_000;
pub(crate) const DEFAULT_NAMESPACE_BYTES: u64 = 64 << 20;
/// Request ids remembered for one namespace's writes; past it, that namespace's oldest is
/// forgotten first, so one namespace's retries never push out another's.
pub(crate) const DEFAULT_REQUEST_IDS: u64 = 10_000;
/// The default budget of the whole state's stored bytes.
pub(crate) const DEFAULT_STATE_BUDGET_BYTES: u64 = 512 << 20;

/// Wait groups and barriers (Grackle's limits where it has them).
/// A wait group's `delete_after_finished_seconds` and a barrier's
/// `delete_inactive_after_seconds`: at least a minute.
pub(crate) const SYNC_RETENTION_MIN_S: u64 = 60;
/// Jobs one `CompleteJobsFromWaitGroup` may report.
pub(crate) const JOBS_PER_CALL_MAX: usize = 50;
pub(crate) const WAIT_GROUPS_PER_NAMESPACE_MAX: usize = 1_000_000;
pub(crate) const BARRIERS_PER_NAMESPACE_MAX: usize = 1_000_000;
/// Generations whose participants a barrier keeps: the current one and the one that tripped
/// last. Older records go at the trip that makes them older.
pub(crate) const BARRIER_GENERATIONS_KEPT: u64 = 2;
