//! The subcommands over what a namespace holds: `list`, `delete`, `revoke` (a holder), `audit`
//! and `namespace`.

use clap::{Args, Subcommand};

use super::values::{namespace_arg, size_arg};

pub(super) const LIST_EXAMPLES: &str = "\
Examples:
  conch list semaphores                      # in the namespace conch (or --namespace NS)
  conch list locks --namespace team-a --json
  conch list wait-groups
  conch list barriers
  conch list namespaces

A conch sema semaphore is listed as NAME.N (N its --max); an election as NAME.elect; the
per-host lock of --spread as NAME.N.host-HOST.

Exit status: 0 listed, 64 usage error, 65 no such namespace, 69 no conch node answered, 77 no
read permission on the namespace.";

pub(super) const DELETE_EXAMPLES: &str = "\
Examples:
  # the other --max of a name in use by mistake: see it, then delete it
  conch list semaphores
  conch delete semaphore heavy-jobs --max 3       # heavy-jobs.3
  conch delete semaphore billing.elect            # as listed, without --max
  conch delete lock db/orders
  conch delete wait-group nightly-2026-06-12
  conch delete barrier map-done
  conch delete namespace team-a                   # and everything in it

Holders of what is deleted lose it: a conch running a command under a deleted semaphore or lock
stops it and exits 79.

Exit status: 0 deleted, 64 usage error, 65 it does not exist (nothing deleted), 69 no conch
node answered, 77 no write permission on the namespace (admin for a namespace).";

#[derive(Debug, Subcommand)]
pub(crate) enum ListCommand {
    /// The semaphores of the namespace: permits, permits held, holders, waiters.
    #[command(visible_alias = "semaphore")]
    Semaphores {
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ns: crate::sync_args::NamespaceArg,
    },
    /// The locks of the namespace: path, state, holders, waiters.
    #[command(visible_alias = "lock")]
    Locks {
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ns: crate::sync_args::NamespaceArg,
    },
    /// The wait groups of the namespace: status, jobs done of the counter, expiry.
    #[command(visible_alias = "wait-group")]
    WaitGroups {
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ns: crate::sync_args::NamespaceArg,
    },
    /// The barriers of the namespace: generation, parties arrived of expected.
    #[command(visible_alias = "barrier")]
    Barriers {
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ns: crate::sync_args::NamespaceArg,
    },
    /// The namespaces (those the token may read).
    #[command(visible_alias = "namespace")]
    Namespaces {
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum DeleteCommand {
    /// A semaphore: NAME with --max N (NAME.N, as `conch sema NAME --max N` uses), or its name
    /// as `conch list semaphores` shows it.
    Semaphore {
        /// The semaphore's name, or with --max the NAME of `conch sema`.
        name: String,
        /// The capacity: delete NAME.N.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=conch_client::sema::MAX_PERMITS))]
        max: Option<u64>,
        #[command(flatten)]
        ns: crate::sync_args::NamespaceArg,
    },
    /// A lock path: its holds are dropped and its holders lose it.
    Lock {
        /// The lock's path.
        path: String,
        #[command(flatten)]
        ns: crate::sync_args::NamespaceArg,
    },
    /// A wait group.
    WaitGroup {
        /// The wait group's name.
        name: String,
        #[command(flatten)]
        ns: crate::sync_args::NamespaceArg,
    },
    /// A barrier.
    Barrier {
        /// The barrier's name.
        name: String,
        #[command(flatten)]
        ns: crate::sync_args::NamespaceArg,
    },
    /// A namespace and everything in it (admin on it, or cluster-admin).
    Namespace {
        /// The namespace's name.
        name: String,
    },
}

pub(super) const REVOKE_HOLDER_EXAMPLES: &str = "\
Examples:
  # who holds, with lease ids (a token with admin on the namespace sees them)
  conch sema heavy-jobs --max 2 --who --json
  # take the slot of a stuck job; it is stopped and exits 81, the next waiter gets in
  conch revoke sema heavy-jobs --max 2 --holder ls_000000000000002a… --reason \"stuck since 09:00, INC-42\"
  conch revoke lock db/orders --holder ls_0000000000000031… --reason \"migration hung\"
  conch revoke elect billing --reason \"leader wedged, failing over\"
  conch audit --namespace conch

Needs admin on the namespace (cluster-admin will do) while access control is on. The holder's
conch notices within about a third of its --ttl, stops its command (SIGTERM, SIGKILL after
--kill-after), prints who revoked it and why, and exits 81.

Exit status: 0 revoked (the record is printed), 64 a bad flag or an empty or too long reason,
65 no such lease, or it neither holds nor waits for that semaphore or lock (or no leader), 69
no conch node answered, 77 no admin permission on the namespace.";

pub(super) const AUDIT_EXAMPLES: &str = "\
Examples:
  conch audit                                   # everything (cluster-admin)
  conch audit --namespace team-a --limit 20     # one namespace (admin on it)
  conch audit --namespace conch --lease ls_000000000000002a… --json

Each line: time, who (token name and role, or anonymous with access control off), what
(revoke-holder, revoke-lease, delete-semaphore, delete-lock, update-semaphore, set-quotas,
set-budget), the target, and the reason or what changed. The cluster keeps the newest 10000
records; they are in snapshots and backups.";

#[derive(Debug, Subcommand)]
pub(crate) enum RevokeCommand {
    /// Revoke a holder of `conch sema NAME --max N` (its lease id: `conch sema NAME --max N
    /// --who`, as an admin of the namespace).
    Sema {
        /// The name given to `conch sema`.
        #[arg(value_name = "NAME")]
        name: String,
        /// The --max the holder runs with (part of the semaphore's identity).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=conch_client::sema::MAX_PERMITS))]
        max: u64,
        /// The holder's lease id.
        #[arg(long, value_name = "LEASE_ID")]
        holder: String,
        /// Why (1-256 bytes): kept in the audit trail and printed by the holder's conch.
        #[arg(long, value_name = "TEXT")]
        reason: String,
        #[arg(long, value_name = "NS", env = "CONCH_NAMESPACE", default_value = conch_client::sema::NAMESPACE, value_parser = namespace_arg)]
        namespace: String,
    },
    /// Revoke a holder of `conch lock PATH` (its lease id: `conch lock PATH --who`).
    Lock {
        /// The lock's path.
        #[arg(value_name = "PATH")]
        path: String,
        /// The holder's lease id.
        #[arg(long, value_name = "LEASE_ID")]
        holder: String,
        /// Why (1-256 bytes): kept in the audit trail and printed by the holder's conch.
        #[arg(long, value_name = "TEXT")]
        reason: String,
        #[arg(long, value_name = "NS", env = "CONCH_NAMESPACE", default_value = conch_client::sema::NAMESPACE, value_parser = namespace_arg)]
        namespace: String,
    },
    /// Revoke the current leader of `conch elect NAME`; the next candidate takes over.
    Elect {
        /// The election's name.
        #[arg(value_name = "NAME")]
        name: String,
        /// Why (1-256 bytes): kept in the audit trail and printed by the leader's conch.
        #[arg(long, value_name = "TEXT")]
        reason: String,
        #[arg(long, value_name = "NS", env = "CONCH_NAMESPACE", default_value = conch_client::sema::NAMESPACE, value_parser = namespace_arg)]
        namespace: String,
    },
}

#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    /// Only the records of this namespace (needs admin on it, or cluster-admin).
    #[arg(long, value_name = "NS", value_parser = namespace_arg)]
    pub namespace: Option<String>,
    /// Only the records of this lease.
    #[arg(long, value_name = "LEASE_ID")]
    pub lease: Option<String>,
    /// At most this many records (the newest).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub limit: u64,
    /// Print JSON (an array of records).
    #[arg(long)]
    pub json: bool,
}

pub(super) const NAMESPACE_EXAMPLES: &str = "\
Examples:
  # a namespace for team A, whose jobs run with tokens of the role jobs-a
  conch namespace create team-a
  conch auth role grant jobs-a team-a acquire
  CONCH_TOKEN_FILE=a.token conch sema nightly --namespace team-a --max 1 -- ./backup.sh

  conch namespace list";

#[derive(Debug, Subcommand)]
pub(crate) enum NamespaceCommand {
    /// Create a namespace (refused if it exists).
    Create {
        /// Namespace name: letters, digits, '-', '_' and '.'.
        #[arg(value_parser = namespace_arg)]
        name: String,
        /// A description, shown by `list`.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List the namespaces this token may read.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a namespace's quotas and what it uses (read on it); with any of the options, set
    /// those quotas and keep the others (cluster-admin). Growth past a quota is refused with
    /// RESOURCE_EXHAUSTED naming it; a quota below what is in use refuses only growth.
    Quota {
        #[arg(value_parser = namespace_arg)]
        name: String,
        /// Most semaphores.
        #[arg(long, value_name = "N")]
        semaphores: Option<u64>,
        /// Most leases.
        #[arg(long, value_name = "N")]
        leases: Option<u64>,
        /// Most holders plus waiters over all its semaphores.
        #[arg(long, value_name = "N")]
        entries: Option<u64>,
        /// Most stored bytes (e.g. 64MiB, 1GiB, 500000), by the size model in the book (Quotas).
        #[arg(long, value_name = "SIZE", value_parser = size_arg)]
        bytes: Option<u64>,
        /// Most request ids remembered for its writes (past it, its oldest is forgotten).
        #[arg(long, value_name = "N")]
        request_ids: Option<u64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}
