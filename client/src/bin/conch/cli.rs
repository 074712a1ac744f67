//! Command-line definition (clap derive). Doc comments are the help text.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use conch_client::DEFAULT_ENDPOINT;

use crate::duration::parse_duration;

const SEMA_EXAMPLES: &str = "\
Examples:
  # classic lock around a mutating script
  conch sema certs-renew --max 1 --nonblock -- ./renew.sh || echo \"already running elsewhere\"

  # at most 2 nodes run heavy tasks concurrently
  conch sema heavy-jobs --max 2 -- /usr/local/bin/run-job.sh

  # inspect
  conch sema heavy-jobs --max 2 --who

  # a nightly report may not keep a warehouse slot more than 2 hours, even if it hangs
  conch sema warehouse --max 2 --max-hold 2h -- ./nightly-report.sh

  # all or none: a slot of gpu[1] AND two of licences[3], taken in one grant
  conch sema gpu --max 1 --and licences --max 3 --weight 2 -- ./train.sh

Each --and NAME starts another member of the same run; the --max and --weight after it are
that member's (--weight: permits taken, default 1). The members are taken all at once or not
at all: a run that cannot have all waits, as one entry in every member's FIFO queue, holding
none of them, so runs wanting {a, b} and {b, a} never deadlock, and a single `conch sema b`
arriving later waits behind the set. CONCH_REV is then the first member's token and
CONCH_REVS lists every member's, e.g. CONCH_REVS=gpu=12,licences=7.

The command runs with CONCH_REV (the grant's fencing token, strictly increasing cluster-wide)
and CONCH_LEASE (the lease id) in its environment, in a process group of its own: conch
forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to that group. Like `timeout`,
this means the command cannot read from the terminal.

The semaphore is <NAME>.<N> in the namespace conch, or --namespace NS (CONCH_NAMESPACE): one
namespace per team, where only the team's tokens may write, keeps other teams' tokens from
changing it. The command does not see CONCH_TOKEN, CONCH_TOKEN_FILE, CONCH_CERT or CONCH_KEY.

If the lease cannot be kept alive while the command runs (the cluster is unreachable for
about the TTL, or the lease was revoked), or the semaphore is deleted or its permits changed
from N (checked about every TTL/3), conch says so on stderr, sends SIGTERM to the command's
process group, SIGKILL after --kill-after, and exits 79. It gives up before the server can
expire the lease, but a new holder may start while the old command is still stopping:
commands must be idempotent or crash-tolerant.

Exit status:
  the command's     the command ran (128+N if it was killed by signal N)
  0 / 1             --who: someone holds the semaphore / nobody does (the holders, or
                    \"no holder\", are printed either way)
  64                usage error, or a --token-file or --key that group or others may read
  69                no conch node answered (within --wait, when one is given)
  70                internal error (unexpected answer from the cluster), or the semaphore
                    no longer has N permits (changed through the API)
  75                busy: no slot within --wait (at once with --nonblock)
  77                access control: no token, an unknown or revoked one, no acquire
                    permission on the namespace, or a namespace that does not exist and
                    that this token may not create
  78                the TLS settings are wrong: an unusable --cacert/--cert/--key, TLS to a
                    plaintext node or back, a certificate the other side refuses
  79                slot lost while running: lease lost, semaphore deleted or resized
  80                the hold limit (--max-hold, or the semaphore's) was reached: the
                    command was stopped before the server ended the hold
  81                an administrator revoked the slot (`conch revoke`): the command was
                    stopped, and who revoked it and why were printed
  82                a quota or limit refused it (namespace quota full, 1000 holders):
                    waiting does not help
  126 / 127         the command could not be executed / was not found";

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
pub struct Cli {
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
    pub fn token_file(&self) -> Option<&std::path::Path> {
        self.token_file
            .as_deref()
            .filter(|p| !p.as_os_str().is_empty())
    }

    /// The token from `CONCH_TOKEN`, unless it is empty (`CONCH_TOKEN=`), which means unset.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref().filter(|t| !t.is_empty())
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
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

const LIST_EXAMPLES: &str = "\
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

const DELETE_EXAMPLES: &str = "\
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
pub enum ListCommand {
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
pub enum DeleteCommand {
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

const REVOKE_HOLDER_EXAMPLES: &str = "\
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

const AUDIT_EXAMPLES: &str = "\
Examples:
  conch audit                                   # everything (cluster-admin)
  conch audit --namespace team-a --limit 20     # one namespace (admin on it)
  conch audit --namespace conch --lease ls_000000000000002a… --json

Each line: time, who (token name and role, or anonymous with access control off), what
(revoke-holder, revoke-lease, delete-semaphore, delete-lock, update-semaphore, set-quotas,
set-budget), the target, and the reason or what changed. The cluster keeps the newest 10000
records; they are in snapshots and backups.";

#[derive(Debug, Subcommand)]
pub enum RevokeCommand {
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
pub struct AuditArgs {
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

const NAMESPACE_EXAMPLES: &str = "\
Examples:
  # a namespace for team A, whose jobs run with tokens of the role jobs-a
  conch namespace create team-a
  conch auth role grant jobs-a team-a acquire
  CONCH_TOKEN_FILE=a.token conch sema nightly --namespace team-a --max 1 -- ./backup.sh

  conch namespace list";

#[derive(Debug, Subcommand)]
pub enum NamespaceCommand {
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

const CERTS_EXAMPLES: &str = "\
Examples:
  conch certs init certs                    # CA valid 10 years: ca.crt, ca.key, ca.crl
  conch certs node certs --id 1 --host node1.example.com --host 10.0.0.1
  conch certs node certs --id 2 --host 10.0.0.2 --days 90
  conch certs client certs --name ops
  conch certs revoke node 2 --dir certs     # then copy certs/ca.crl to every node

Files: certs/ca.crt, ca.key (keep it offline), ca.crl (conchd's --peer-crl),
node<ID>.crt/.key, client-<NAME>.crt/.key.

A node certificate lists serverAuth and clientAuth and names its node with the
subjectAltName URI urn:conch:node:<ID>; peers accept it only as that node. Node certificates
made by releases before the URI existed are refused as peers: issue them again.";

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Create DIR (if needed) and a new CA in it: ca.crt, ca.key and an empty revocation list
    /// ca.crl.
    Init {
        /// Directory for the CA and the certificates it issues.
        dir: PathBuf,
        /// How long the CA is valid, in days (10 years by default).
        #[arg(long, default_value_t = conch_client::certs::CA_DAYS)]
        days: u32,
    },
    /// Issue DIR/node<ID>.crt and .key: a node certificate (server and client authentication,
    /// naming node ID as urn:conch:node:<ID>) for the hosts and IP addresses that clients and
    /// peers dial. Replaces an existing one.
    Node {
        /// Directory holding the CA (see `conch certs init`).
        dir: PathBuf,
        /// The node's id.
        #[arg(long)]
        id: u64,
        /// A DNS name or IP address the node is reached at (repeat for several).
        #[arg(long = "host", value_name = "HOST", required = true)]
        hosts: Vec<String>,
        /// How long the certificate is valid, in days (2 years by default; never past the CA).
        #[arg(long, default_value_t = conch_client::certs::LEAF_DAYS)]
        days: u32,
    },
    /// Issue DIR/client-<NAME>.crt and .key: a client certificate (client authentication only).
    Client {
        /// Directory holding the CA (see `conch certs init`).
        dir: PathBuf,
        /// The client's name (letters, digits, '-', '_', '.').
        #[arg(long)]
        name: String,
        /// How long the certificate is valid, in days (2 years by default; never past the CA).
        #[arg(long, default_value_t = conch_client::certs::LEAF_DAYS)]
        days: u32,
    },
    /// Revoke the certificate in DIR/node<ID>.crt or DIR/client-<NAME>.crt: add its serial
    /// number to DIR/ca.crl, signed again by the CA (earlier revocations stay). Copy ca.crl to
    /// every node (--peer-crl); nodes re-read it without a restart.
    #[command(after_help = REVOKE_EXAMPLES)]
    Revoke {
        #[command(subcommand)]
        holder: RevokeHolder,
    },
}

const REVOKE_EXAMPLES: &str = "\
Examples:
  conch certs revoke node 2 --dir certs           # node 2's key leaked
  conch certs node certs --id 2 --host 10.0.0.2   # then issue node 2 a new certificate
  conch certs revoke client ops --dir certs
  scp certs/ca.crl node1:/etc/conch/ca.crl        # and to every other node (--peer-crl)";

#[derive(Debug, Subcommand)]
pub enum RevokeHolder {
    /// Revoke DIR/node<ID>.crt (issue the node a new one with `conch certs node`).
    Node {
        /// The node's id.
        id: u64,
        /// Directory holding the CA and the certificate.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Revoke DIR/client-<NAME>.crt.
    Client {
        /// The client's name.
        name: String,
        /// Directory holding the CA and the certificate.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Ask every node (the endpoints, then the members they report) for its Raft status.
    ///
    /// Exit status, as a health check uses it: 0 if every node answered and one of them is the
    /// leader; 1 if some node did not answer but the leader did (degraded); 2 if no node
    /// answered or none that did is the leader.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One line on the cluster's health, judged from the leader's view, and an exit status for
    /// scripts and monitoring checks.
    ///
    /// 0 healthy: a leader, and every voter up and following it; 1 degraded: a leader followed
    /// by a majority, but some voter is down, follows no leader or is catching up; 2 unhealthy:
    /// no node answered, no leader, or no majority follows the leader.
    Health {
        /// Print one JSON object instead of the line.
        #[arg(long)]
        json: bool,
    },
    /// Add a node as a non-voting learner; it starts receiving the log (start it first, with
    /// --initial-cluster naming the members and itself).
    AddLearner {
        /// The new node's id (unused in the cluster).
        id: u64,
        /// The address it serves on (host:port).
        addr: String,
    },
    /// Make learners voters (a joint-consensus membership change).
    Promote {
        /// Ids of learners to promote.
        #[arg(required = true)]
        ids: Vec<u64>,
    },
    /// Remove nodes from the cluster (voters or learners); stop them afterwards.
    Remove {
        /// Ids of nodes to remove.
        #[arg(required = true)]
        ids: Vec<u64>,
    },
    /// Ask a node to take over leadership: it campaigns (with an up-to-date log it wins), and
    /// this returns once it leads; if it did not take over in time, exits non-zero saying who
    /// leads instead.
    TransferLeader {
        /// Id of the node that should lead.
        id: u64,
    },
    /// Take a snapshot and compact the log: on the leader, on node N (--node; any endpoint
    /// forwards the call), or on every member (--all, one line each). The output names the node.
    Snapshot {
        /// The node to snapshot (default: the leader).
        #[arg(long, value_name = "N", conflicts_with = "all")]
        node: Option<u64>,
        /// Snapshot every member, one after the other.
        #[arg(long)]
        all: bool,
    },
    /// Write a consistent backup of the replicated state to FILE (`-`: stdout). Any node
    /// answers, and the backup holds every write acknowledged before the call; it is checked on
    /// receipt (SHA-256) and written atomically. Needs cluster-admin when access control is on.
    /// Restore it into new data directories with `conchd restore`.
    Backup {
        /// Where to write the backup (`-`: stdout, the summary line then goes to stderr).
        file: String,
    },
    /// End a rolling upgrade: raise the cluster version to the newest one every voter and
    /// learner speaks, switching on what the new release adds.
    ///
    /// Until this runs, every node writes only what the previous release reads, so any node can
    /// be put back on it; afterwards none can (go back by restoring a backup taken before).
    /// Refused, changing nothing, while a member does not answer or runs a release that does not
    /// speak the new version: the message names it. Prints every member's release and the
    /// cluster version before and after. Needs cluster-admin when access control is on.
    Finalize,
    /// Set the budget on the stored bytes of every namespace together (cluster-admin): growth
    /// past it is refused with RESOURCE_EXHAUSTED. Prints the budget and what is stored.
    Budget {
        /// The budget (e.g. 512MiB, 2GiB, 1000000).
        #[arg(value_parser = size_arg)]
        size: u64,
    },
}

const AUTH_EXAMPLES: &str = "\
Examples:
  # a role that may run `conch sema` (acquire on the namespace conch), and a token for it
  conch auth role create ci
  conch auth role grant ci conch acquire
  conch auth token create ci-runner --role ci --out ci.token
  CONCH_TOKEN_FILE=ci.token conch sema deploy --max 1 -- ./deploy.sh

  # one namespace per team: team A's role may acquire in team-a only
  conch namespace create team-a
  conch auth role create jobs-a
  conch auth role grant jobs-a team-a acquire
  conch auth token create job-a --role jobs-a --out a.token
  CONCH_TOKEN_FILE=a.token conch sema nightly --namespace team-a --max 1 -- ./backup.sh

  # an administrator, then turn access control on
  conch auth role create root --cluster-admin
  conch auth token create admin --role root --out admin.token
  conch --token-file admin.token auth enable

  conch --token-file admin.token auth token list
  conch --token-file admin.token auth token revoke tk_2

Permissions, per namespace (or * for every namespace): read (get, list), write (acquire,
release, leases, semaphores; includes read), admin (create, update, delete the namespace;
includes write). A cluster-admin role may do everything, including membership changes and
these commands. While access control is on, every command needs a token that allows it.

Tokens: --out writes one to a file only its owner may read; conch refuses a --token-file (or
--key) that group or others may read, and `--token` on the command line (use --token-file or
CONCH_TOKEN). The command run by `conch sema`, `conch lock` and `conch elect` does not see
CONCH_TOKEN, CONCH_TOKEN_FILE, CONCH_CERT or CONCH_KEY.

Exit status: 0 done, 64 refused request (e.g. enable without a cluster-admin token), 65 a role
or token that does not exist (or already does), 69 no conch node answered, 77 no token, an
unknown or revoked one, or one without the permission.";

#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Turn access control on (refused unless a token with a cluster-admin role exists).
    Enable,
    /// Turn access control off: every call is allowed again.
    Disable,
    /// Whether access control is on, with the number of roles and tokens.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Roles: what a token may do.
    Role {
        #[command(subcommand)]
        command: RoleCommand,
    },
    /// Tokens: who may call.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum RoleCommand {
    /// Create a role (with no permissions, unless --cluster-admin).
    Create {
        /// Role name: letters, digits, '-', '_' and '.'.
        name: String,
        /// May do everything: membership, snapshots, access control, every namespace.
        #[arg(long)]
        cluster_admin: bool,
    },
    /// Give a role a permission on a namespace (replacing the one it had there).
    Grant {
        role: String,
        /// A namespace name, or * for every namespace (`conch sema`, `conch lock` and `conch
        /// elect` use the namespace conch unless told --namespace).
        namespace: String,
        /// read < acquire < write < admin: acquire runs `conch sema`/`conch lock`/`conch
        /// elect` (leases, acquire, release, creating a missing semaphore); write also changes
        /// and deletes semaphores and deletes locks; admin also the namespace itself.
        #[arg(value_parser = ["read", "acquire", "write", "admin"])]
        permission: String,
    },
    /// Take away a role's permission on a namespace.
    Revoke { role: String, namespace: String },
    /// List roles with their permissions.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a role (refused while a token uses it).
    Delete { name: String },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token for a role; writes it, once, to --out FILE (created with mode 0600) or
    /// else to stdout.
    Create {
        /// A name to recognize the token by (letters, digits, '-', '_' and '.').
        name: String,
        /// The role it gets.
        #[arg(long)]
        role: String,
        /// Write the token to FILE, created readable by its owner only (0600); an existing
        /// FILE is refused unless --force.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// With --out: replace an existing FILE.
        #[arg(long, requires = "out")]
        force: bool,
    },
    /// Revoke a token by id (tk_…): calls with it are refused from then on, on every node.
    Revoke { id: String },
    /// List tokens (ids, names, roles; never the tokens themselves).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct SemaArgs {
    /// Semaphore name: letters, digits, '-', '_' and '.'.
    #[arg(value_name = "NAME")]
    pub name: String,

    /// The namespace the semaphore, its leases and holders live in (one per team keeps teams
    /// apart; see `conch namespace --help`).
    #[arg(long, value_name = "NS", env = "CONCH_NAMESPACE", default_value = conch_client::sema::NAMESPACE, value_parser = namespace_arg)]
    pub namespace: String,

    /// Capacity N: at most N holders at once, cluster-wide. Part of the identity: callers with
    /// different --max use different semaphores (--max 1 is a lock). After --and NAME: that
    /// member's capacity.
    #[arg(long, value_name = "N", required = true, action = clap::ArgAction::Append, value_parser = clap::value_parser!(u64).range(1..=conch_client::sema::MAX_PERMITS))]
    pub max: Vec<u64>,

    /// All or none: also take a slot of semaphore NAME, in the same grant; the --max (and
    /// --weight) after it are its own. Repeatable (at most 16 members in all).
    #[arg(long = "and", value_name = "NAME", action = clap::ArgAction::Append, conflicts_with_all = ["who", "spread"])]
    pub and: Vec<String>,

    /// The permits taken (1 to --max; default 1): of the semaphore, or with --and of the
    /// member before it. A weighted semaphore: `--max 10 --weight 4` takes 4 of 10 permits.
    #[arg(long, value_name = "W", action = clap::ArgAction::Append, conflicts_with = "who", value_parser = clap::value_parser!(u64).range(1..=conch_client::sema::MAX_PERMITS))]
    pub weight: Vec<u64>,

    /// The members in order (the first is NAME), from --max, --and and --weight by their
    /// positions on the command line ([`SemaArgs::resolve_members`]).
    #[arg(skip)]
    pub members: Vec<Member>,

    /// Lease time to live (whole seconds, 1s-300s): a crashed conch's slot comes back after
    /// about this long.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = ttl_arg)]
    pub ttl: Duration,

    /// Longest wait for a slot [default: forever]; exit 75 if none comes in time. The wait
    /// keeps its place in the FIFO queue across request timeouts and node failover. It bounds
    /// the wall time even when the cluster cannot answer (no quorum: exit 69 when it passes).
    #[arg(long, value_name = "DURATION", value_parser = wait_arg, conflicts_with = "nonblock")]
    pub wait: Option<Wait>,

    /// Do not wait: run only if a slot is free now, else exit 75 (same as --wait 0).
    #[arg(long, short = 'n')]
    pub nonblock: bool,

    /// At most one slot per host: a host already holding one is refused as if no slot were
    /// free.
    #[arg(long)]
    pub spread: bool,

    /// When the slot is lost while the command runs: time between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration_arg)]
    pub kill_after: Duration,

    /// Longest the command may hold the slot (1s-30d), however long its lease lives: the
    /// server ends the hold then and grants the next waiter. conch stops the command before,
    /// and exits 80: SIGTERM when a stop window of --kill-after + 1s is left, but the window is
    /// at most a tenth of the hold (at least 1s), so the command runs for at least 90% of a
    /// hold of 10s or more (--max-hold 10s: SIGTERM after 9s, SIGKILL half a second later; 2h:
    /// SIGTERM 6s before the end). A smaller limit set on the semaphore wins.
    #[arg(long, value_name = "DURATION", value_parser = max_hold_arg)]
    pub max_hold: Option<Duration>,

    /// Show who holds the slots and who waits, in grant and queue order, or "no holder"; exit
    /// 0 if anyone holds, 1 if nobody does.
    #[arg(long, conflicts_with_all = ["wait", "nonblock", "spread", "command"])]
    pub who: bool,

    /// With --who: print JSON.
    #[arg(long)]
    pub json: bool,

    /// The command to run, after `--`.
    #[arg(value_name = "CMD", last = true, required_unless_present = "who")]
    pub command: Vec<String>,
}

const LOCK_EXAMPLES: &str = "\
Examples:
  # one migration of the orders tables at a time; it also waits for (and holds off) anything
  # under db/orders, and an exclusive hold of db
  conch lock db/orders -- ./migrate-orders.sh

  # readers share: many reports at once, but no migration of db/orders while they run
  conch lock db/orders/2026 --shared -- ./report.sh 2026

  # cron: skip this run if the lock is busy, saying what holds it
  conch lock backups/nightly --nonblock -- ./backup.sh || echo \"busy, skipped\"

  # who holds db, its ancestors and descendants, who waits, and what would block
  conch lock db --who
  conch lock db --who --json

Paths are '/'-separated (letters, digits, '-', '_', '.'; at most 256 characters) in the
namespace conch, or --namespace NS (CONCH_NAMESPACE). An exclusive hold (the default)
conflicts with every other hold on the same path, its ancestors (db of db/orders) and its
descendants (db/orders/2026); a --shared hold only with exclusive ones there. Siblings never
conflict. Waiters queue in one FIFO queue per namespace: a waiting exclusive acquire holds
back later shared ones that conflict with it, so a stream of readers cannot starve a writer.

The command runs with, in its environment:
  CONCH_REV         the grant's fencing token: strictly increasing per path (and cluster-wide)
                    from one holder to the next; pass it to what the lock protects so it can
                    refuse a stale holder
  CONCH_LEASE       the lock lease id
  CONCH_LOCK        the path
  CONCH_LOCK_MODE   exclusive or shared
in a process group of its own: conch forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and
SIGUSR2 to that group, so the command cannot read from the terminal. It does not see
CONCH_TOKEN, CONCH_TOKEN_FILE, CONCH_CERT or CONCH_KEY. While conch waits, a status line on a
terminal says where it stands and what blocks it (-v: plain lines).

If the lease cannot be kept alive while the command runs (the cluster is unreachable for
about the TTL, or the lease was revoked), or the hold is dropped (DeleteLock, checked about
every TTL/3), conch says so on stderr, sends SIGTERM to the command's process group, SIGKILL
after --kill-after, and exits 79. It gives up before the server can expire the lease, but a
new holder may start while the old command is still stopping: check CONCH_REV where it
matters.

Exit status:
  the command's     the command ran (128+N if it was killed by signal N)
  0 / 1             --who: the path, an ancestor or a descendant is held / none is
  64                usage error (a bad path, --json without --who, ...)
  69                no conch node answered
  75                no lock within --wait (at once with --nonblock); the message names
                    the reason (peer, ancestor, descendant) and the paths in the way
  77                access control: no token, an unknown or revoked one, no permission on
                    the namespace, or a namespace that does not exist and that this token
                    may not create
  79                lock lost while running: lease lost, or the hold dropped (DeleteLock)
  81                the lock was revoked by an administrator (`conch revoke lock`); the
                    reason was printed
  126 / 127         the command could not be executed / was not found";

#[derive(Debug, Args)]
pub struct LockArgs {
    /// Lock path: '/'-separated segments of letters, digits, '-', '_' and '.'.
    #[arg(value_name = "PATH", value_parser = lock_path_arg)]
    pub path: String,

    /// The namespace the lock, its lease and holders live in (one per team keeps teams apart;
    /// see `conch namespace --help`).
    #[arg(long, value_name = "NS", env = "CONCH_NAMESPACE", default_value = conch_client::sema::NAMESPACE, value_parser = namespace_arg)]
    pub namespace: String,

    /// Hold the lock shared (readers): other shared holds of the path, its ancestors and
    /// descendants may run beside it, exclusive ones may not. Without it the hold is exclusive.
    #[arg(long)]
    pub shared: bool,

    /// Lease time to live (whole seconds, 1s-300s): a crashed conch's lock comes back after
    /// about this long.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = ttl_arg)]
    pub ttl: Duration,

    /// Longest wait for the lock [default: forever]; exit 75 if it does not come in time. The
    /// wait keeps its place in the FIFO queue across request timeouts and node failover.
    #[arg(long, value_name = "DURATION", value_parser = wait_arg, conflicts_with = "nonblock")]
    pub wait: Option<Wait>,

    /// Do not wait: run only if the lock is free now, else exit 75 (same as --wait 0).
    #[arg(long, short = 'n')]
    pub nonblock: bool,

    /// When the lock is lost while the command runs: time between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration_arg)]
    pub kill_after: Duration,

    /// Show the holds on the path, its ancestors and descendants, the acquires queued there,
    /// and what an acquire of the path (exclusive, or --shared) would wait for, or that nothing
    /// is held there; exit 0 either way.
    #[arg(long, conflicts_with_all = ["wait", "nonblock", "command"])]
    pub who: bool,

    /// With --who: print JSON.
    #[arg(long)]
    pub json: bool,

    /// The command to run, after `--`.
    #[arg(value_name = "CMD", last = true, required_unless_present = "who")]
    pub command: Vec<String>,
}

impl LockArgs {
    /// Checks what clap cannot express.
    pub fn validate(&self) -> Result<(), String> {
        if self.json && !self.who {
            return Err("--json goes with --who".to_string());
        }
        Ok(())
    }

    /// The wait bound: `None` is forever.
    pub fn wait_bound(&self) -> Option<Duration> {
        if self.nonblock {
            Some(Duration::ZERO)
        } else {
            self.wait.and_then(|w| w.0)
        }
    }
}

const ELECT_EXAMPLES: &str = "\
Examples:
  # run the billing scheduler on exactly one of the hosts that run this line
  conch elect billing --value \"$(hostname):8080\" -- ./scheduler

  # who leads, then the candidates in the order they take over
  conch elect billing --who

  # one line per change of leader, until interrupted
  conch elect billing --observe --json

  # prefer this host: the current leader hands over when this candidate joins
  conch elect billing --priority 10 -- ./scheduler

Candidates queue in FIFO order for a 1-permit semaphore (billing.elect in the namespace
conch, or --namespace NS). The leader runs the command with CONCH_REV (the fencing token of
its term, strictly increasing cluster-wide), CONCH_LEASE and CONCH_LEADER_VALUE (its --value)
in its environment; when the command exits or the leader loses its lease, the next candidate
takes over. SIGTERM or SIGINT to a leader's conch stops the command (SIGKILL after
--kill-after), then gives leadership back at once, so the next candidate starts without
waiting for the TTL. A candidate of higher --priority is preferred: the leader stops its
command and hands over, then stands again. A leader that cannot keep its lease alive (or whose conch is stopped), or whose
election semaphore is deleted or given other than 1 permit, stops its command: SIGTERM,
SIGKILL after --kill-after. conch gives up before the server can expire the lease, but a
command slower to stop than that margin may overlap the next leader: check CONCH_REV where
it matters.

Exit status:
  the command's     the command ran as leader (128+N if it was killed by signal N)
  0 / 1             --who: there is a leader / there is none
  64                usage error
  69                no conch node answered
  75                not leader within --wait
  77                access control refused the call
  79                leadership lost while running (lease lost, semaphore deleted or resized)
  81                leadership revoked by an administrator (`conch revoke elect`); the
                    reason was printed
  126 / 127         the command could not be executed / was not found";

#[derive(Debug, Args)]
pub struct ElectArgs {
    /// Election name: letters, digits, '-', '_' and '.'.
    #[arg(value_name = "NAME")]
    pub name: String,

    /// The namespace the election's semaphore, leases and candidates live in.
    #[arg(long, value_name = "NS", env = "CONCH_NAMESPACE", default_value = conch_client::sema::NAMESPACE, value_parser = namespace_arg)]
    pub namespace: String,

    /// What this candidate announces as leader (e.g. its address); shown by --who and
    /// --observe, and given to the command as CONCH_LEADER_VALUE [default: the host name].
    #[arg(long, value_name = "V")]
    pub value: Option<String>,

    /// Lease time to live (whole seconds, 1s-300s): a crashed leader is succeeded after about
    /// this long.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = ttl_arg)]
    pub ttl: Duration,

    /// When leadership is lost or handed over while the command runs, or conch gets SIGTERM or
    /// SIGINT: time between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration_arg)]
    pub kill_after: Duration,

    /// Longest wait to become leader [default: forever]; exit 75 if it does not come in time.
    #[arg(long, value_name = "DURATION", value_parser = wait_arg)]
    pub wait: Option<Wait>,

    /// Preference among candidates (0-1000000): a leader hands leadership to a waiting
    /// candidate of higher priority (within a third of --ttl of its joining), then stands
    /// again behind it. Equal priorities keep queue order.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = priority_arg)]
    pub priority: u32,

    /// Show the leader, then the candidates in the order they would take over, or "no
    /// leader"; exit 0 either way.
    #[arg(long, conflicts_with_all = ["observe", "value", "wait", "priority", "command"])]
    pub who: bool,

    /// Print one line per change of leader (time, value, host, pid, fencing token), starting
    /// with the current one, until interrupted. Waits on the server, not by polling, and
    /// follows the cluster across node failures.
    #[arg(long, conflicts_with_all = ["value", "wait", "priority", "command"])]
    pub observe: bool,

    /// With --who or --observe: print JSON (--observe: one object per line).
    #[arg(long)]
    pub json: bool,

    /// The command to run while leader, after `--`.
    #[arg(value_name = "CMD", last = true, required_unless_present_any = ["who", "observe"])]
    pub command: Vec<String>,
}

impl ElectArgs {
    /// Checks what clap cannot express.
    pub fn validate(&self) -> Result<(), String> {
        if self.json && !self.who && !self.observe {
            return Err("--json goes with --who or --observe".to_string());
        }
        Ok(())
    }
}

/// One member of a `conch sema` run: a semaphore NAME, its capacity and the permits taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub max: u64,
    pub weight: u64,
}

/// Most members of one `conch sema` run (the server's limit on a set).
pub const MEMBERS_MAX: usize = 16;

/// `--wait`: a bound, or forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait(pub Option<Duration>);

impl SemaArgs {
    /// Checks what clap cannot express.
    pub fn validate(&self) -> Result<(), String> {
        if self.json && !self.who {
            return Err("--json goes with --who".to_string());
        }
        if self.members.is_empty() {
            return Err("no semaphore to take".to_string());
        }
        Ok(())
    }

    /// The first member's capacity (`--max` before any `--and`).
    pub fn first_max(&self) -> u64 {
        self.members
            .first()
            .map_or_else(|| self.max.first().copied().unwrap_or(1), |m| m.max)
    }

    /// Groups --max, --and and --weight by their positions in `matches` (the `sema`
    /// subcommand's): each --and NAME starts a member, and a --max or --weight belongs to the
    /// member named last before it (NAME itself before the first --and).
    pub fn resolve_members(&mut self, matches: &clap::ArgMatches) -> Result<(), String> {
        enum Part {
            Max(u64),
            And(String),
            Weight(u64),
        }
        let mut parts: Vec<(usize, Part)> = Vec::new();
        let indices = |id: &str| -> Vec<usize> {
            matches
                .indices_of(id)
                .map(|i| i.collect())
                .unwrap_or_default()
        };
        parts.extend(
            indices("max")
                .into_iter()
                .zip(self.max.iter())
                .map(|(i, v)| (i, Part::Max(*v))),
        );
        parts.extend(
            indices("and")
                .into_iter()
                .zip(self.and.iter())
                .map(|(i, v)| (i, Part::And(v.clone()))),
        );
        parts.extend(
            indices("weight")
                .into_iter()
                .zip(self.weight.iter())
                .map(|(i, v)| (i, Part::Weight(*v))),
        );
        parts.sort_by_key(|(i, _)| *i);
        let mut members: Vec<(String, Option<u64>, Option<u64>)> =
            vec![(self.name.clone(), None, None)];
        for (_, part) in parts {
            let Some(current) = members.last_mut() else {
                continue;
            };
            match part {
                Part::And(name) => members.push((name, None, None)),
                Part::Max(max) if current.1.is_none() => current.1 = Some(max),
                Part::Weight(weight) if current.2.is_none() => current.2 = Some(weight),
                Part::Max(_) => {
                    return Err(format!(
                        "--max is given twice for {}: each member takes one --max (start another \
                         member with --and NAME)",
                        current.0
                    ));
                }
                Part::Weight(_) => {
                    return Err(format!("--weight is given twice for {}", current.0));
                }
            }
        }
        if members.len() > MEMBERS_MAX {
            return Err(format!(
                "at most {MEMBERS_MAX} semaphores in one run, got {}",
                members.len()
            ));
        }
        let mut resolved = Vec::with_capacity(members.len());
        for (name, max, weight) in members {
            conch_client::sema::validate_name("semaphore", &name)?;
            let Some(max) = max else {
                return Err(format!("--max N is missing for {name}"));
            };
            let weight = weight.unwrap_or(1);
            if weight > max {
                return Err(format!(
                    "--weight {weight} of {name} exceeds its --max {max}"
                ));
            }
            if resolved.iter().any(|m: &Member| m.name == name) {
                return Err(format!(
                    "{name} is named twice: each member of a run must be a different semaphore"
                ));
            }
            resolved.push(Member { name, max, weight });
        }
        self.members = resolved;
        Ok(())
    }

    /// The wait bound: `None` is forever.
    pub fn wait_bound(&self) -> Option<Duration> {
        if self.nonblock {
            Some(Duration::ZERO)
        } else {
            self.wait.and_then(|w| w.0)
        }
    }
}

fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s)
}

fn wait_arg(s: &str) -> Result<Wait, String> {
    match s.trim() {
        "forever" | "inf" | "infinite" => Ok(Wait(None)),
        other => parse_duration(other).map(|d| Wait(Some(d))),
    }
}

/// A size in bytes: a number with an optional unit (`B`, `KiB`, `MiB`, `GiB`, or `KB`, `MB`,
/// `GB` for powers of 1000).
pub fn size_arg(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number: u64 = number.parse().map_err(|_| {
        format!("{s:?} is not a size: expected a number with an optional unit, e.g. 64MiB")
    })?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit {other:?}: use B, KiB, MiB, GiB, KB, MB or GB"
            ));
        }
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn namespace_arg(s: &str) -> Result<String, String> {
    conch_client::sema::validate_name("namespace", s)?;
    Ok(s.to_string())
}

fn lock_path_arg(s: &str) -> Result<String, String> {
    conch_client::lock::validate_path(s)?;
    Ok(s.to_string())
}

/// A hold limit: 1 s to 30 days (the server's range), in whole milliseconds.
fn max_hold_arg(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    let range = Duration::from_secs(1)..=Duration::from_secs(30 * 24 * 3600);
    if !range.contains(&d) {
        return Err(format!("{s}: a hold limit must be between 1s and 30d"));
    }
    Ok(d)
}

fn priority_arg(s: &str) -> Result<u32, String> {
    let max = conch_client::elect::MAX_PRIORITY;
    match s.trim().parse::<u32>() {
        Ok(p) if p <= max => Ok(p),
        _ => Err(format!(
            "{s:?} is not a priority: expected a whole number from 0 to {max}"
        )),
    }
}

fn ttl_arg(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    conch_client::lease::validate_ttl(d)?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        use clap::FromArgMatches;
        let matches = Cli::command()
            .try_get_matches_from(std::iter::once("conch").chain(args.iter().copied()))?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        if let (Command::Sema(s), Some(("sema", sub))) = (&mut cli.command, matches.subcommand()) {
            s.resolve_members(sub)
                .map_err(|e| clap::Error::raw(clap::error::ErrorKind::ValueValidation, e))?;
        }
        Ok(cli)
    }

    fn sema(args: &[&str]) -> SemaArgs {
        match parse(args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
            .command
        {
            Command::Sema(s) => s,
            other => panic!("not sema: {other:?}"),
        }
    }

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_take_binary_and_decimal_units_and_refuse_the_rest() {
        assert_eq!(size_arg("500000"), Ok(500_000));
        assert_eq!(size_arg("64MiB"), Ok(64 << 20));
        assert_eq!(size_arg("2GiB"), Ok(2 << 30));
        assert_eq!(size_arg("3KB"), Ok(3_000));
        assert_eq!(size_arg("7B"), Ok(7));
        for bad in [
            "",
            "MiB",
            "12 parsecs",
            "1.5GiB",
            "-3",
            "99999999999999999999GiB",
        ] {
            assert!(size_arg(bad).is_err(), "{bad:?}");
        }
        assert!(size_arg("3mb").unwrap_err().contains("unknown size unit"));
    }

    #[test]
    fn the_seed_examples_parse() {
        let s = sema(&[
            "sema",
            "certs-renew",
            "--max",
            "1",
            "--nonblock",
            "--",
            "./renew.sh",
        ]);
        assert_eq!(
            (s.name.as_str(), s.first_max(), s.nonblock),
            ("certs-renew", 1, true)
        );
        assert_eq!(s.command, ["./renew.sh"]);
        assert_eq!(s.wait_bound(), Some(Duration::ZERO));
        assert_eq!(s.ttl, Duration::from_secs(10));
        assert_eq!(s.kill_after, Duration::from_secs(5));

        let s = sema(&[
            "sema",
            "heavy-jobs",
            "--max",
            "2",
            "--",
            "/usr/local/bin/run-job.sh",
        ]);
        assert_eq!(s.wait_bound(), None);
        assert_eq!(s.command, ["/usr/local/bin/run-job.sh"]);

        let s = sema(&["sema", "heavy-jobs", "--max", "2", "--who"]);
        assert!(s.who && !s.json && s.command.is_empty());
    }

    #[test]
    fn and_starts_a_member_whose_max_and_weight_follow_it() {
        let s = sema(&[
            "sema", "a", "--max", "1", "--and", "b", "--max", "3", "--and", "c", "--weight", "2",
            "--max", "2", "--wait", "1m", "--", "cmd", "--and", "x",
        ]);
        let member = |name: &str, max, weight| Member {
            name: name.into(),
            max,
            weight,
        };
        assert_eq!(
            s.members,
            vec![member("a", 1, 1), member("b", 3, 1), member("c", 2, 2)]
        );
        assert_eq!(s.command, ["cmd", "--and", "x"]);
        assert_eq!(s.first_max(), 1);
        // The first member's own --weight comes before the first --and.
        let s = sema(&[
            "sema", "a", "--max", "4", "--weight", "3", "--and", "b", "--max", "1", "--", "true",
        ]);
        assert_eq!(s.members, vec![member("a", 4, 3), member("b", 1, 1)]);
        // One semaphore, as always.
        let s = sema(&["sema", "a", "--max", "2", "--", "true"]);
        assert_eq!(s.members, vec![member("a", 2, 1)]);
    }

    #[test]
    fn bad_member_lists_are_refused_with_the_member_named() {
        let refused = |args: &[&str]| match parse(args) {
            Err(e) => e.to_string(),
            Ok(cli) => panic!("{args:?} should be refused, got {:?}", cli.command),
        };
        let e = refused(&["sema", "a", "--max", "1", "--and", "b", "--", "true"]);
        assert!(e.contains("--max N is missing for b"), "{e}");
        let e = refused(&["sema", "a", "--max", "1", "--max", "2", "--", "true"]);
        assert!(e.contains("--max is given twice for a"), "{e}");
        let e = refused(&[
            "sema", "a", "--max", "1", "--and", "b", "--max", "2", "--weight", "3", "--", "true",
        ]);
        assert!(e.contains("--weight 3 of b exceeds its --max 2"), "{e}");
        let e = refused(&[
            "sema", "a", "--max", "1", "--and", "a", "--max", "2", "--", "true",
        ]);
        assert!(e.contains("a is named twice"), "{e}");
        let e = refused(&[
            "sema", "a", "--max", "1", "--and", "b c", "--max", "2", "--", "true",
        ]);
        assert!(e.contains("\"b c\""), "{e}");
        // --weight on one semaphore: its permits taken, at most its --max.
        let one = parse(&["sema", "a", "--max", "5", "--weight", "3", "--", "true"]).expect("ok");
        let Command::Sema(one) = one.command else {
            panic!("sema")
        };
        assert_eq!(
            one.members,
            [Member {
                name: "a".into(),
                max: 5,
                weight: 3
            }]
        );
        let e = refused(&["sema", "a", "--max", "2", "--weight", "3", "--", "true"]);
        assert!(e.contains("--weight 3 of a exceeds its --max 2"), "{e}");
        // --and goes neither with --who nor --spread.
        refused(&[
            "sema", "a", "--max", "1", "--and", "b", "--max", "1", "--who",
        ]);
        refused(&[
            "sema", "a", "--max", "1", "--and", "b", "--max", "1", "--spread", "--", "true",
        ]);
        let mut many = vec!["sema", "s", "--max", "1"];
        let names: Vec<String> = (0..16).map(|i| format!("m{i}")).collect();
        for name in &names {
            many.extend(["--and", name.as_str(), "--max", "1"]);
        }
        many.extend(["--", "true"]);
        let e = refused(&many);
        assert!(e.contains("at most 16 semaphores"), "{e}");
    }

    #[test]
    fn command_arguments_are_passed_through_untouched() {
        let s = sema(&[
            "sema", "x", "--max", "1", "--", "ls", "-l", "--max", "--", "y",
        ]);
        assert_eq!(s.command, ["ls", "-l", "--max", "--", "y"]);
    }

    #[test]
    fn waits_ttls_and_flags() {
        let s = sema(&[
            "sema", "x", "--max", "3", "--wait", "1m30s", "--ttl", "30s", "--spread", "--", "true",
        ]);
        assert_eq!(s.wait_bound(), Some(Duration::from_secs(90)));
        assert_eq!(s.ttl, Duration::from_secs(30));
        assert!(s.spread);
        let s = sema(&["sema", "x", "--max", "1", "--wait", "forever", "--", "true"]);
        assert_eq!(s.wait_bound(), None);
        let s = sema(&["sema", "x", "--max", "1", "--wait", "0", "--", "true"]);
        assert_eq!(s.wait_bound(), Some(Duration::ZERO));
        let s = sema(&["sema", "x", "--max", "1", "--who", "--json"]);
        assert!(s.json);
    }

    #[test]
    fn usage_errors_are_caught_by_the_parser() {
        let bad: &[&[&str]] = &[
            &["sema", "x", "--", "true"],               // --max missing
            &["sema", "x", "--max", "0", "--", "true"], // --max 0
            &["sema", "x", "--max", "1"],               // no command
            &[
                "sema",
                "x",
                "--max",
                "1",
                "--wait",
                "5s",
                "--nonblock",
                "--",
                "true",
            ],
            &["sema", "x", "--max", "1", "--who", "--", "true"],
            &["sema", "x", "--max", "1", "--who", "--spread"],
            &["sema", "x", "--max", "1", "--json", "--", "true"], // --json without --who
            &["sema", "x", "--max", "1", "--ttl", "0s", "--", "true"],
            &["sema", "x", "--max", "1", "--ttl", "1.5s", "--", "true"],
            &["sema", "x", "--max", "1", "--ttl", "301s", "--", "true"],
            &["sema", "x", "--max", "1", "--wait", "soon", "--", "true"],
            &["completions", "tcsh"],
            &["cluster"],
            &["sema", "x", "--max", "1", "--bogus", "--", "true"], // typo'd flag
            &["sema", "x", "--max", "1", "sh", "-c", "true"],      // command needs `--`
        ];
        for args in bad {
            let refused = match parse(args) {
                Err(_) => true,
                Ok(Cli {
                    command: Command::Sema(s),
                    ..
                }) => s.validate().is_err(),
                Ok(_) => false,
            };
            assert!(refused, "{args:?} should be refused");
        }
    }

    #[test]
    fn the_namespace_defaults_to_conch_and_must_be_a_name() {
        assert_eq!(
            sema(&["sema", "x", "--max", "1", "--who"]).namespace,
            "conch"
        );
        let s = sema(&["sema", "x", "--namespace", "team-a", "--max", "1", "--who"]);
        assert_eq!(s.namespace, "team-a");
        let e = elect(&["elect", "billing", "--namespace", "team-a", "--who"]).unwrap();
        assert_eq!(e.namespace, "team-a");
        for bad in ["", "team a", "team/a", &"n".repeat(129)] {
            let err = parse(&["sema", "x", "--namespace", bad, "--max", "1", "--who"])
                .expect_err("refused");
            assert!(err.to_string().contains("namespace"), "{bad:?}: {err}");
            assert!(elect(&["elect", "b", "--namespace", bad, "--who"]).is_err());
        }
    }

    #[test]
    fn token_options_parse_and_the_token_flag_is_hidden() {
        let cli = parse(&["--token", "t", "cluster", "status"]).unwrap();
        assert_eq!(cli.token.as_deref(), Some("t"));
        let help = Cli::command().render_long_help().to_string();
        assert!(!help.contains("--token <"), "{help}");
        assert!(help.contains("--token-file"), "{help}");
        let cli = parse(&[
            "auth", "token", "create", "ci", "--role", "ci", "--out", "ci.token",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Auth {
                command: AuthCommand::Token {
                    command: TokenCommand::Create {
                        out: Some(_),
                        force: false,
                        ..
                    }
                }
            }
        ));
        assert!(parse(&["auth", "token", "create", "ci", "--role", "ci", "--force"]).is_err());
        assert!(parse(&["namespace", "create", "team a"]).is_err());
        assert!(parse(&["namespace", "create", "team-a"]).is_ok());
    }

    #[test]
    fn endpoints_timeout_and_verbosity_are_global() {
        let cli = parse(&[
            "sema",
            "x",
            "--max",
            "1",
            "--who",
            "--endpoints",
            "a:1,b:2",
            "-vv",
        ])
        .unwrap();
        assert_eq!(cli.endpoints, "a:1,b:2");
        assert_eq!(cli.verbose, 2);
        let cli = parse(&["--timeout", "2s", "cluster", "status"]).unwrap();
        assert_eq!(cli.timeout, Duration::from_secs(2));
        assert!(matches!(
            cli.command,
            Command::Cluster {
                command: ClusterCommand::Status { json: false }
            }
        ));
    }

    fn elect(args: &[&str]) -> Result<ElectArgs, String> {
        match parse(args).map_err(|e| e.to_string())?.command {
            Command::Elect(e) => e.validate().map(|()| e),
            other => panic!("not elect: {other:?}"),
        }
    }

    #[test]
    fn elect_parses_and_refuses_what_does_not_fit() {
        let e = elect(&["elect", "billing", "--value", "n1:80", "--", "./s", "-x"]).unwrap();
        assert_eq!(
            (e.name.as_str(), e.value.as_deref(), e.command.as_slice()),
            (
                "billing",
                Some("n1:80"),
                ["./s".to_string(), "-x".to_string()].as_slice()
            )
        );
        assert_eq!(e.ttl, Duration::from_secs(10));
        assert_eq!(e.wait, None);
        assert_eq!(e.priority, 0);
        let e = elect(&["elect", "billing", "--priority", "7", "--", "true"]).unwrap();
        assert_eq!(e.priority, 7);
        let e = elect(&["elect", "billing", "--who", "--json"]).unwrap();
        assert!(e.who && e.json && e.command.is_empty());
        let e = elect(&["elect", "billing", "--observe"]).unwrap();
        assert!(e.observe);
        let bad: &[&[&str]] = &[
            &["elect", "billing"],
            &["elect", "billing", "--who", "--observe"],
            &["elect", "billing", "--who", "--", "true"],
            &["elect", "billing", "--observe", "--value", "v"],
            &["elect", "billing", "--json", "--", "true"],
            &["elect", "billing", "--ttl", "0s", "--", "true"],
            &["elect", "billing", "--priority", "-1", "--", "true"],
            &["elect", "billing", "--priority", "1000001", "--", "true"],
            &["elect", "billing", "--priority", "high", "--", "true"],
            &["elect", "billing", "--who", "--priority", "2"],
        ];
        for bad in bad {
            assert!(elect(bad).is_err(), "{bad:?} should be refused");
        }
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("elect")
            .expect("elect subcommand")
            .render_long_help()
            .to_string();
        for needle in [
            "CONCH_LEADER_VALUE",
            "--observe",
            "79",
            "billing.elect",
            "--priority",
            "SIGTERM",
        ] {
            assert!(help.contains(needle), "elect --help lacks {needle:?}");
        }
    }

    fn lock(args: &[&str]) -> Result<LockArgs, String> {
        match parse(args).map_err(|e| e.to_string())?.command {
            Command::Lock(l) => l.validate().map(|()| l),
            other => panic!("not lock: {other:?}"),
        }
    }

    #[test]
    fn lock_parses_modes_waits_and_who() {
        let l = lock(&["lock", "db/orders", "--", "./m.sh", "-x"]).unwrap();
        assert_eq!(l.path, "db/orders");
        assert!(!l.shared);
        assert_eq!(l.wait_bound(), None);
        assert_eq!(l.command, ["./m.sh", "-x"]);
        assert_eq!(l.namespace, "conch");
        assert_eq!(l.ttl, Duration::from_secs(10));
        let l = lock(&["lock", "a/b", "--shared", "--wait", "30s", "--", "true"]).unwrap();
        assert!(l.shared);
        assert_eq!(l.wait_bound(), Some(Duration::from_secs(30)));
        let l = lock(&["lock", "a", "-n", "--ttl", "3s", "--", "true"]).unwrap();
        assert_eq!(l.wait_bound(), Some(Duration::ZERO));
        assert_eq!(l.ttl, Duration::from_secs(3));
        let l = lock(&["lock", "a", "--who", "--json", "--shared"]).unwrap();
        assert!(l.who && l.json && l.shared);
        let bad: &[&[&str]] = &[
            &["lock", "a"],
            &["lock", "a//b", "--", "true"],
            &["lock", "/a", "--", "true"],
            &["lock", "a b", "--", "true"],
            &["lock", "a", "--json", "--", "true"],
            &["lock", "a", "--who", "--", "true"],
            &["lock", "a", "--nonblock", "--wait", "1s", "--", "true"],
            &["lock", "a", "--ttl", "0s", "--", "true"],
            &["lock", "a", "--namespace", "x/y", "--who"],
            &["lock", "a", "sh", "-c", "true"],
        ];
        for args in bad {
            assert!(lock(args).is_err(), "{args:?} should be refused");
        }
    }

    #[test]
    fn lock_help_documents_the_variables_examples_and_exit_codes() {
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("lock")
            .expect("lock subcommand")
            .render_long_help()
            .to_string();
        for needle in [
            "conch lock db/orders -- ./migrate-orders.sh",
            "--shared",
            "--nonblock",
            "conch lock db --who --json",
            "CONCH_REV",
            "CONCH_LEASE",
            "CONCH_LOCK",
            "CONCH_LOCK_MODE",
            "DeleteLock",
            "75",
            "79",
        ] {
            assert!(
                help.contains(needle),
                "lock --help lacks {needle:?}:\n{help}"
            );
        }
        let top = Cli::command().render_long_help().to_string();
        assert!(top.contains("conch lock"), "{top}");
        assert!(top.contains("lock"), "{top}");
    }

    #[test]
    fn help_shows_the_seed_examples_and_exit_codes() {
        let mut cmd = Cli::command();
        let sema = cmd.find_subcommand_mut("sema").expect("sema subcommand");
        let help = sema.render_long_help().to_string();
        for needle in [
            "conch sema certs-renew --max 1 --nonblock -- ./renew.sh || echo \"already running elsewhere\"",
            "conch sema heavy-jobs --max 2 -- /usr/local/bin/run-job.sh",
            "conch sema heavy-jobs --max 2 --who",
            "CONCH_REV",
            "79",
            "75",
        ] {
            assert!(
                help.contains(needle),
                "sema --help lacks {needle:?}:\n{help}"
            );
        }
    }
}
