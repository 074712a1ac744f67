//! Command-line definition of `conch` (clap derive). Doc comments are the help text. The
//! top-level command and its global flags are here; each family of subcommands has a file:
//! `hold.rs` the commands that hold something while running a command (`sema`, `lock`,
//! `elect`), `objects.rs` what a namespace holds (`list`, `delete`, `revoke`, `audit`,
//! `namespace`), `admin.rs` the cluster's administration (`cluster`, `certs`, `auth`), and
//! `values.rs` the parsers of flag values they share.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use conch_client::DEFAULT_ENDPOINT;

mod admin;
mod hold;
mod objects;
#[cfg(test)]
mod tests;
mod values;

pub(crate) use admin::{
    AuthCommand, CertsCommand, ClusterCommand, RevokeHolder, RoleCommand, TokenCommand,
};
pub(crate) use hold::{ElectArgs, LockArgs, Member, SemaArgs};
pub(crate) use objects::{AuditArgs, DeleteCommand, ListCommand, NamespaceCommand, RevokeCommand};

use admin::{AUTH_EXAMPLES, CERTS_EXAMPLES};
use hold::{ELECT_EXAMPLES, LOCK_EXAMPLES, SEMA_EXAMPLES};
use objects::{
    AUDIT_EXAMPLES, DELETE_EXAMPLES, LIST_EXAMPLES, NAMESPACE_EXAMPLES, REVOKE_HOLDER_EXAMPLES,
};
use values::duration_arg;

const TOP_EXAMPLES: &str = "\
Examples:
  conch sema certs-renew --max 1 --nonblock -- ./renew.sh || echo \"already running elsewhere\"
  conch sema heavy-jobs --max 2 -- /usr/local/bin/run-job.sh
  conch sema heavy-jobs --max 2 --who
  conch lock db/orders -- ./migrate-orders.sh        # exclusive: also against db, db/orders/…
  conch lock db/orders/2026 --shared -- ./report.sh
  conch lock db --who
  conch elect billing --value \"$(hostname):8080\" -- ./scheduler
  conch revoke sema heavy-jobs --max 2 --holder LEASE_ID --reason \"stuck since 09:00\"
  conch audit --namespace conch
  conch --endpoints node1:7001,node2:7001,node3:7001 cluster status
  CONCH_TOKEN_FILE=ci.token conch sema deploy --max 1 -- ./deploy.sh   # access control on
  conch sema nightly --namespace team-a --max 1 -- ./backup.sh          # a team's namespace
  conch list semaphores                       # and locks, wait-groups, barriers, namespaces
  conch delete semaphore heavy-jobs --max 3   # a --max used by mistake
  conch completions bash > /etc/bash_completion.d/conch

Exit status: 64 usage error, 65 no such thing (or it exists already), 69 no conch node
answered, 75 busy: no slot (or lock) in time, 77 no token or no permission, 78 TLS settings
wrong (or a client certificate refused), 79 slot, lock or leadership lost while running (lease
lost, semaphore deleted or resized, lock hold dropped), 80 hold limit (--max-hold) reached and
the command stopped, 81 revoked by an administrator (`conch revoke`, see `conch audit`), 82 a
quota or limit refused it; otherwise the command's own status (see `conch sema --help`,
`conch lock --help`, `conch elect --help`).";

/// conch: cluster-wide semaphores, locks and elections for shell scripts and cron jobs, served
/// by conchd.
#[derive(Debug, Parser)]
#[command(
    name = "conch",
    version = conch_client::proto::VERSION,
    after_help = TOP_EXAMPLES,
    propagate_version = true
)]
pub(crate) struct Cli {
    /// conchd endpoints, comma separated (host:port); any node will do.
    #[arg(
        long,
        global = true,
        env = "CONCH_ENDPOINTS",
        hide_env_values = true,
        value_name = "HOST:PORT,..",
        default_value = DEFAULT_ENDPOINT
    )]
    pub endpoints: String,

    /// Deadline of each request to the cluster.
    #[arg(long, global = true, value_name = "DURATION", default_value = "5s", value_parser = duration_arg)]
    pub timeout: Duration,

    /// Log what conch does on stderr (-v info, -vv debug; or set CONCH_LOG to a filter).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Speak TLS to every endpoint, checking the nodes' certificates against this CA (PEM).
    #[arg(
        long,
        global = true,
        env = "CONCH_CACERT",
        value_name = "FILE",
        help_heading = "TLS"
    )]
    pub cacert: Option<PathBuf>,

    /// Client certificate (PEM) for nodes that require one (--client-ca); needs --key.
    #[arg(
        long,
        global = true,
        env = "CONCH_CERT",
        value_name = "FILE",
        help_heading = "TLS"
    )]
    pub cert: Option<PathBuf>,

    /// Private key (PEM) of --cert; only its owner may read it (chmod 600).
    #[arg(
        long,
        global = true,
        env = "CONCH_KEY",
        value_name = "FILE",
        help_heading = "TLS"
    )]
    pub key: Option<PathBuf>,

    /// The bearer token itself, from the environment only: `--token` on the command line is
    /// refused, since every user of the machine could read it in the process list.
    #[arg(
        long,
        global = true,
        env = "CONCH_TOKEN",
        hide = true,
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,

    /// File holding the bearer token for a cluster with access control on (see `conch auth
    /// --help`); only its owner may read it (chmod 600). Or put the token itself in CONCH_TOKEN.
    /// Empty (`CONCH_TOKEN_FILE=`) is the same as unset.
    #[arg(long, global = true, env = "CONCH_TOKEN_FILE", value_name = "FILE", value_parser = path_or_empty)]
    pub token_file: Option<std::path::PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

/// A path, where the empty string is allowed (and then means "not given": `CONCH_TOKEN_FILE=`
/// in a script that clears it).
fn path_or_empty(value: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(value))
}

impl Cli {
    /// The token file, unless it was given empty (`CONCH_TOKEN_FILE=`), which means unset.
    pub(crate) fn token_file(&self) -> Option<&std::path::Path> {
        self.token_file
            .as_deref()
            .filter(|p| !p.as_os_str().is_empty())
    }

    /// The token from `CONCH_TOKEN`, unless it is empty (`CONCH_TOKEN=`), which means unset.
    pub(crate) fn token(&self) -> Option<&str> {
        self.token.as_deref().filter(|t| !t.is_empty())
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a command while holding one of N cluster-wide slots, or show who holds them.
    #[command(after_help = SEMA_EXAMPLES)]
    Sema(SemaArgs),
    /// Run a command while holding a hierarchical lock (exclusive or shared), or show who holds
    /// and waits.
    #[command(after_help = LOCK_EXAMPLES)]
    Lock(LockArgs),
    /// Inspect and change the cluster: status, membership, leadership, snapshots, backups.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Make a CA and node/client certificates for a TLS cluster (PEM files in one directory).
    #[command(after_help = CERTS_EXAMPLES)]
    Certs {
        #[command(subcommand)]
        command: CertsCommand,
    },

    /// Manage access control: turn it on or off, roles and their permissions, tokens.
    #[command(after_help = AUTH_EXAMPLES)]
    Auth {
        #[command(subcommand)]
        command: AuthCommand,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Run a command only while this host is the elected leader, or show or follow the leader.
    #[command(after_help = ELECT_EXAMPLES)]
    Elect(ElectArgs),
    /// Namespaces: one per team keeps teams apart (create needs admin on it, or cluster-admin).
    #[command(after_help = NAMESPACE_EXAMPLES)]
    Namespace {
        #[command(subcommand)]
        command: NamespaceCommand,
    },
    /// Wait groups: N jobs report in, and whoever waits learns when all of them did.
    #[command(after_help = crate::sync_args::WAIT_GROUP_EXAMPLES)]
    WaitGroup {
        #[command(subcommand)]
        command: crate::sync_args::WaitGroupCommand,
    },
    /// Barriers: N processes meet, then all go on together.
    #[command(after_help = crate::sync_args::BARRIER_EXAMPLES)]
    Barrier {
        #[command(subcommand)]
        command: crate::sync_args::BarrierCommand,
    },
    /// Take a slot, lock or leadership from its holder (admin on the namespace), saying why:
    /// the holder's lease is revoked, the next waiter gets in, the audit trail keeps the
    /// record, and the holder's conch stops its command and exits 81 printing the reason.
    #[command(after_help = REVOKE_HOLDER_EXAMPLES)]
    Revoke {
        #[command(subcommand)]
        command: RevokeCommand,
    },
    /// List what a namespace holds (semaphores, locks, wait groups, barriers), or the
    /// namespaces; --json prints a JSON array.
    #[command(after_help = LIST_EXAMPLES)]
    List {
        #[command(subcommand)]
        what: ListCommand,
    },
    /// Delete a semaphore, lock, wait group, barrier or namespace (write permission on the
    /// namespace; a namespace: admin). A missing one is an error (exit 65).
    #[command(after_help = DELETE_EXAMPLES)]
    Delete {
        #[command(subcommand)]
        what: DeleteCommand,
    },
    /// Show the audit trail, newest first: administrators' revokes, holders dropped by a
    /// revoke or a deletion, capacity and quota changes (cluster-admin, or admin on --namespace;
    /// a holder may read its own lease's records with --namespace and --lease).
    #[command(after_help = AUDIT_EXAMPLES)]
    Audit(AuditArgs),
}
